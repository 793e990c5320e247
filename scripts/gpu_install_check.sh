#!/usr/bin/env bash
# Run by hand on the GPU machine (offline): mlx-rmsnorm installs like a Python
# package on the CUDA flavor of MLX (the CPU flavor's check, install_check.sh,
# runs in CI).
#   A. `pip install <src>` with pip's default build isolation, into python3 with
#      the MLX CUDA wheels of .device/wheels (system nvcc on PATH); then from
#      outside the checkout: import, the recorded MLX, the mlx[cuda13] pin, GPU
#      forward and backward against float64 and mx.fast.rms_norm, the plugin's
#      primitives through `python -m mlx_rmsnorm --report` and MLX_RMSNORM_PATCH=1.
#   B. The same build with every nvcc hidden from PATH: the backend adds the
#      pip nvcc packages to the build requirements (wheels restored from
#      .device/install-wheels), the build log must name that nvcc; checks again.
# Prepare here (with PyPI):  ../shared/tools/device-wheels
#                            python3 scripts/gpu_install_wheels.py prepare
# Run there (carry .device): bash scripts/gpu_install_check.sh
# Writes $OUT/install/ (summary.log, the pip logs); PASS/FAIL lines; exit 1 on any FAIL.
# Leaves the machine's python3 without mlx-rmsnorm (uninstalled at the end).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
OUTDIR="${OUT:-$(mktemp -d)}/install"
mkdir -p "$OUTDIR"
exec > >(tee "$OUTDIR/summary.log") 2>&1
PY="$(command -v "${PYTHON:-python3}")"  # absolute: step B runs with another PATH
# An install check, not a kernel build: one architecture keeps each build short.
export MLX_RMSNORM_CUDA_ARCHS="${MLX_RMSNORM_CUDA_ARCHS:-90}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
FIND=(--no-index --find-links "$ROOT/.device/wheels" --find-links "$ROOT/.device/install-wheels")
fails=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
T="$(mktemp -d)"
t0=$SECONDS

echo "== MLX CUDA wheels into $PY (.device/setup.sh)"
# shellcheck disable=SC1091
source .device/setup.sh || { fail "MLX wheels (.device/setup.sh)"; exit 1; }
"$PY" -m pip uninstall -y -q mlx-rmsnorm >/dev/null 2>&1 || true
echo "nvcc on PATH: $(command -v nvcc || echo none); cmake: $(command -v cmake) $(cmake --version | head -1)"
ls .device/install-wheels

mkdir "$T/src"
tar --exclude=./.device --exclude=./.venv --exclude=./build --exclude=./.git --exclude=./results \
    --exclude='*.so' --exclude=./mlx_rmsnorm/_build_info.py --exclude='__pycache__' --exclude='*.egg-info' \
    -cf - . | tar -C "$T/src" -xf -

cat > "$T/check.py" <<'PY'
import importlib.metadata as md, sys
import mlx.core as mx, numpy as np
import mlx_rmsnorm
from mlx_rmsnorm import _build_info
assert "site-packages" in mlx_rmsnorm.__file__, mlx_rmsnorm.__file__
pin = [r for r in md.requires("mlx-rmsnorm") if r.startswith(("mlx[", "mlx=="))]
print("built against", _build_info.MLX_VERSION, _build_info.MLX_FLAVOR, "| requires", pin,
      "| has_cuda_kernels", mlx_rmsnorm.has_cuda_kernels(), "| mlx", mx.__version__, mx.default_device())
assert (_build_info.MLX_VERSION, _build_info.MLX_FLAVOR) == (mx.__version__, "cuda13")
assert pin == [f"mlx[cuda13]=={mx.__version__}"], pin
assert mlx_rmsnorm.has_cuda_kernels() and mx.default_device() == mx.gpu
M, N = 1000, 4096
x = mx.random.normal((M, N), key=mx.random.key(0))
w = mx.random.normal((N,), key=mx.random.key(1))
g = mx.random.normal((M, N), key=mx.random.key(2))
x64, w64, g64 = (np.array(a, dtype=np.float64) for a in (x, w, g))
r = 1 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5)
ref = {"y": x64 * r * w64,
       "gx": r * (g64 * w64 - x64 * r * r * (g64 * w64 * x64).mean(-1, keepdims=True)),
       "gw": (g64 * x64 * r).sum(0)}
f = lambda x, w: mx.fast.rms_norm(x, w, 1e-5)
with mlx_rmsnorm.patched():
    y, (gx, gw) = f(x, w), mx.vjp(f, [x, w], [g])[1]
ours = {"y": y, "gx": gx, "gw": gw}
builtin = {"y": f(x, w), **dict(zip(("gx", "gw"), mx.vjp(f, [x, w], [g])[1]))}
for k in ref:
    e = np.abs(np.array(ours[k], dtype=np.float64) - ref[k]).max() / np.abs(ref[k]).max()
    eb = np.abs(np.array(builtin[k], dtype=np.float64) - ref[k]).max() / np.abs(ref[k]).max()
    print(f"{k}: ours {e:.1e} built-in {eb:.1e} (normwise vs float64)")
    assert e < 2e-5, (k, e)
PY
cat > "$T/train.py" <<'PY'
import mlx.core as mx, mlx.nn as nn
model = nn.Sequential(nn.Linear(64, 256), nn.RMSNorm(256), nn.Linear(256, 1))
step = nn.value_and_grad(model, lambda m, x: m(x).square().mean())
for _ in range(3):
    mx.eval(step(model, mx.random.normal((32, 64))))
PY

checks() {  # $1: label
  if (cd "$T" && "$PY" check.py) >"$OUTDIR/$1_check.log" 2>&1; then
    cat "$OUTDIR/$1_check.log"; pass "$1: import, pin mlx[cuda13], GPU forward/backward vs float64"
  else
    tail -20 "$OUTDIR/$1_check.log"; fail "$1: import / GPU check"
  fi
  local rep
  rep="$(cd "$T" && "$PY" -m mlx_rmsnorm --report train.py 2>&1 | grep 'mlx_rmsnorm report')"
  echo "$rep"
  [[ "$rep" =~ patched=True.*RMSNormPluginVJP=[1-9].*builtin_RMSNorm=0\ builtin_RMSNormVJP=0 ]] \
    && pass "$1: python -m mlx_rmsnorm runs our primitives on the GPU" || fail "$1: python -m mlx_rmsnorm"
  rep="$(cd "$T" && MLX_RMSNORM_PATCH=1 MLX_RMSNORM_REPORT=1 "$PY" train.py 2>&1 | grep 'mlx_rmsnorm report')"
  echo "$rep"
  [[ "$rep" =~ patched=True.*RMSNormPluginVJP=[1-9].*builtin_RMSNorm=0 ]] \
    && pass "$1: MLX_RMSNORM_PATCH=1 (.pth)" || fail "$1: MLX_RMSNORM_PATCH=1 (.pth)"
  rep="$(cd "$T" && MLX_RMSNORM_REPORT=1 "$PY" -c 'import mlx_rmsnorm; exec(open("train.py").read())' 2>&1 | grep 'mlx_rmsnorm report')"
  echo "$rep (control: not patched, the built-in's primitives)"
  [[ "$rep" =~ patched=False.*RMSNormPlugin=0\ RMSNormPluginVJP=0\ builtin_RMSNorm=[1-9].*builtin_RMSNormVJP=[1-9] ]] \
    && pass "$1: the report tells the built-in apart" || fail "$1: report control"
}

echo "== A. isolated pip install, system nvcc"
s=$SECONDS
ok=0
if "$PY" -m pip install -v "${FIND[@]}" --no-cache-dir "$T/src" >"$OUTDIR/A_pip_install.log" 2>&1; then
  ok=1
elif grep -qE "ResolutionImpossible|No matching distribution" "$OUTDIR/A_pip_install.log"; then
  # The image's CUDA libraries may not satisfy mlx-cuda-13's pins offline:
  # say so, and check the build itself without the dependency resolution.
  grep -E "ResolutionImpossible|No matching distribution|requires" "$OUTDIR/A_pip_install.log" | tail -5
  fail "A: offline dependency resolution (runtime requirements of the installed MLX); retrying with --no-deps"
  "$PY" -m pip install -v --no-deps "${FIND[@]}" --no-cache-dir "$T/src" >"$OUTDIR/A_pip_install_nodeps.log" 2>&1 \
    && { ok=1; cp "$OUTDIR/A_pip_install_nodeps.log" "$OUTDIR/A_pip_install.log"; }
fi
if [ "$ok" = 1 ]; then
  grep -E "mlx-rmsnorm: (building|nvcc|cmake|MLX at)" "$OUTDIR/A_pip_install.log"
  pass "A: pip install (isolated, offline) in $((SECONDS - s)) s"
  checks A
else
  tail -30 "$OUTDIR/A_pip_install.log"; fail "A: pip install (isolated, offline)"
fi

echo "== B. nvcc from pip: every nvcc hidden from PATH"
NOPATH=""
IFS=: read -ra parts <<<"$PATH"
for p in "${parts[@]}"; do [ -n "$p" ] && [ ! -x "$p/nvcc" ] && NOPATH="${NOPATH:+$NOPATH:}$p"; done
# Tools that shared a folder with nvcc stay reachable (nvcc itself does not).
mkdir -p "$T/tools"
for tool in cmake ninja cc c++ gcc g++; do
  p="$(command -v "$tool")" && ! PATH="$NOPATH" command -v "$tool" >/dev/null && ln -s "$p" "$T/tools/$tool"
done
NOPATH="$T/tools:$NOPATH"
echo "PATH for B: $NOPATH"
if ! "$PY" "$ROOT/scripts/gpu_install_wheels.py" restore .device/install-wheels "$T/nvcc-wheels" \
    "${CUDA_ROOT:-/usr/local/cuda}" >"$OUTDIR/B_restore.log" 2>&1; then
  cat "$OUTDIR/B_restore.log"; fail "B: restore the nvcc wheels from this machine's toolkit"
else
  s=$SECONDS
  if env -u CUDACXX PATH="$NOPATH" MLX_RMSNORM_PIP_NVCC_VERSION="==13.0.*" \
      bash -c 'command -v nvcc && exit 3; exec "$@"' _ \
      "$PY" -m pip install -v --force-reinstall --no-deps "${FIND[@]}" --find-links "$T/nvcc-wheels" \
      --no-cache-dir "$T/src" >"$OUTDIR/B_pip_install.log" 2>&1; then
    grep -E "Successfully installed .*nvidia-cuda-nvcc|mlx-rmsnorm: (building|nvcc|cmake)" "$OUTDIR/B_pip_install.log"
    if grep -qE "mlx-rmsnorm: building .*nvcc [^ ]*pip-build-env[^ ]*/nvidia/cu13/bin/nvcc" "$OUTDIR/B_pip_install.log"; then
      pass "B: built with nvcc from the pip packages (no nvcc on PATH) in $((SECONDS - s)) s"
    else
      fail "B: the build did not use the pip nvcc"
    fi
    checks B
  else
    tail -30 "$OUTDIR/B_pip_install.log"; fail "B: pip install with nvcc from pip"
  fi
fi

"$PY" -m pip uninstall -y -q mlx-rmsnorm >/dev/null 2>&1 || true
rm -rf "$T"
echo "== install check: $fails FAIL, $((SECONDS - t0)) s; logs in $OUTDIR"
[ "$fails" -eq 0 ]
