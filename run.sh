#!/usr/bin/env bash
# One entry point for a fresh machine (Linux, Python >= 3.10):
#
#   ./run.sh          set up, then run the main job (examples/train.py)
#   ./run.sh test     set up, then run the test suite
#   ./run.sh bench    set up, then run the benchmark (python -m mlx_rmsnorm.bench)
#
# Set-up (idempotent): a virtual environment in .venv (or $VENV), MLX with
# CUDA when an NVIDIA GPU is visible (mlx[cuda13]) and the CPU build otherwise,
# the build and test tools, and this package built against that MLX. Each
# part is done only when it is missing or out of date: a second run on an
# unchanged tree installs and builds nothing (a few seconds), and after an
# edit the build recompiles only what the edit touches (build/<flavor>-<mlx
# version>/ keeps CMake's folder; build_backend/dev_build.py says when the
# build is current).
set -euo pipefail
cd "$(dirname "$0")"
t0=$SECONDS
MLX_VERSION="${MLX_VERSION:-0.32.4}"
VENV="${VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$PWD/$VENV/bin/python"
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

if ! "$PY" -c "import mlx.core" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    flavor=cuda13
  else
    flavor=cpu
  fi
  echo "[run.sh] installing mlx[$flavor]==$MLX_VERSION"
  pip_install "mlx[$flavor]==$MLX_VERSION"
fi
# Driver-only machines (no CUDA toolkit): the CUDA build takes nvcc from pip.
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null 2>&1 \
   && "$PY" -c "import importlib.metadata as m; m.version('mlx-cuda-13')" 2>/dev/null; then
  echo "[run.sh] no nvcc on PATH: installing nvcc from pip (nvidia-cuda-nvcc 13)"
  pip_install "nvidia-cuda-nvcc>=13,<14" "nvidia-cuda-crt>=13,<14" "nvidia-cuda-cccl>=13,<14" \
    "nvidia-nvvm>=13,<14" "nvidia-cuda-runtime>=13,<14"
fi
# The nanobind of the installed MLX's ABI (mlx/core*.so carries it; another
# one builds an extension that rejects MLX's arrays); stops on an MLX outside
# the supported range, saying which to install.
NANOBIND="$("$PY" mlx_rmsnorm/_mlx_env.py --nanobind-requirement)" || exit 1
# setuptools >= 77: the licence as an SPDX expression; mlx-lm: the tests train
# tiny mlx-lm models with patch()
tools=("setuptools>=77" wheel "$NANOBIND" "cmake>=3.24" ninja numpy pytest hypothesis tqdm matplotlib
       "mlx-lm==0.32.2")
missing="$("$PY" build_backend/dev_build.py missing "${tools[@]}")"
if [ -n "$missing" ]; then
  echo "[run.sh] installing the build and test tools: $missing"
  pip_install "${tools[@]}"
fi
# Editable: the extension is built into mlx_rmsnorm/, so the package imports
# the same from this folder and from anywhere else. Built again when the
# sources, the build settings or the MLX changed, so after an MLX upgrade
# ./run.sh is the rebuild. (No build isolation: the tools above are already
# here; plain `pip install .` works too, see README.)
if why="$("$PY" build_backend/dev_build.py up-to-date)"; then
  echo "[run.sh] mlx-rmsnorm is built for this tree and this MLX: nothing to build"
else
  mkdir -p build
  log="$PWD/build/run-sh-build.log"
  echo "[run.sh] building mlx-rmsnorm against the installed MLX ($why); full log: build/run-sh-build.log"
  echo "[run.sh] a first CPU build took 19 s on 2 quiet CPU cores (about 2 min when busy), one with the CUDA kernels for every architecture ~2.5 min; later ones only what changed"
  start=$SECONDS
  # pip -v streams the build's output: a line per CMake/compile step shows
  set +e
  "$PY" -m pip install --disable-pip-version-check -v --no-build-isolation --no-deps -e . \
    2>&1 | tee "$log" | { grep --line-buffered -E '^ *(\[ *[0-9]+(%|/[0-9]+)\]|-- mlx-rmsnorm:|mlx-rmsnorm:)' \
    | sed -u -e 's/^ *//' -e 's/^/  /' || true; }
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -ne 0 ]; then
    echo "[run.sh] the build failed; the end of build/run-sh-build.log:" >&2
    tail -40 "$log" >&2
    exit "$rc"
  fi
  echo "[run.sh] built in $((SECONDS - start)) s"
fi
# The .pth a regular install puts beside the package (MLX_RMSNORM_PATCH /
# MLX_RMSNORM_REPORT at interpreter start); an editable install gets none.
"$PY" build_backend/mlx_rmsnorm_build.py --pth \
  >"$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/mlx_rmsnorm_autopatch.pth"
echo "[run.sh] set-up done in $((SECONDS - t0)) s"

case "${1:-main}" in
  test)
    shift || true
    # the whole suite, or only the test paths given (pytest's options pass through)
    paths=(tests)
    for a in "$@"; do [[ $a != -* && -e $a ]] && { paths=(); break; }; done
    exec "$PY" -m pytest -q "${paths[@]}" "$@" ;;
  bench)
    shift
    exec "$PY" -m mlx_rmsnorm.bench "$@" ;;
  main)
    shift || true
    exec "$PY" examples/train.py "$@" ;;
  *)
    echo "usage: ./run.sh [main|test|bench] [args...]" >&2
    exit 2 ;;
esac
