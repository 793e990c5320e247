#!/usr/bin/env bash
# One entry point for a fresh machine (Linux, Python >= 3.10):
#
#   ./run.sh          set up, then run the main job (examples/train.py)
#   ./run.sh test     set up, then run the test suite
#   ./run.sh bench    set up, then run the benchmark (python -m mlx_rmsnorm.bench)
#
# Set-up (idempotent): a virtual environment in .venv (or $VENV), MLX with
# CUDA when an NVIDIA GPU is visible (mlx[cuda13]) and the CPU build otherwise,
# the build and test tools, and this package built against that MLX.
set -euo pipefail
cd "$(dirname "$0")"
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
pip_install setuptools wheel "$NANOBIND" "cmake>=3.24" numpy pytest hypothesis tqdm matplotlib \
  "mlx-lm==0.32.2"  # the tests train tiny mlx-lm models with patch()
echo "[run.sh] building mlx-rmsnorm against the installed MLX"
# Editable: the extension is built into mlx_rmsnorm/, so the package imports
# the same from this folder and from anywhere else. Rebuilt at every run, so
# after an MLX upgrade ./run.sh is the rebuild. (No build isolation: the
# tools above are already here; plain `pip install .` works too, see README.)
pip_install --no-build-isolation --no-deps -e .
# The .pth a regular install puts beside the package (MLX_RMSNORM_PATCH /
# MLX_RMSNORM_REPORT at interpreter start); an editable install gets none.
"$PY" build_backend/mlx_rmsnorm_build.py --pth \
  >"$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/mlx_rmsnorm_autopatch.pth"

case "${1:-main}" in
  test)
    shift || true
    exec "$PY" -m pytest -q tests "$@" ;;
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
