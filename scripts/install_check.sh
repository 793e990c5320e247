#!/usr/bin/env bash
# Installs mlx-rmsnorm the way a user would, in a fresh venv (CPU; CI runs it):
#   1. mlx[cpu]==$MLX_VERSION, then `pip install .` with pip's default build
#      isolation (from a clean clone of HEAD); import, forward and backward
#      against a float64 NumPy reference; the wheel's mlx pin.
#   2. MLX_RMSNORM_PATCH=1 (the installed .pth) patches a program that never
#      imports mlx_rmsnorm; MLX_RMSNORM_REPORT=1 shows our primitives ran, and
#      alone reports an unpatched run.
#   3. Another MLX ($OLD_MLX) installed over it: `import mlx_rmsnorm` raises
#      ImportError naming both versions; the rebuild command it prints fixes it.
#      0.32.2 has another nanobind ABI (v21) than 0.32.4 (v22): the rebuild
#      must take nanobind 2.15, or the extension would reject MLX's arrays.
# Prints PASS/FAIL lines; exits non-zero on the first FAIL.
set -euo pipefail
cd "$(dirname "$0")/.."
MLX_VERSION="${MLX_VERSION:-0.32.4}"
OLD_MLX="${OLD_MLX:-0.32.2}"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
PY="$T/venv/bin/python"
pip() { "$PY" -m pip --disable-pip-version-check -q "$@"; }
fail() { echo "FAIL $*"; exit 1; }
t0=$SECONDS

python3 -m venv "$T/venv"
pip install "mlx[cpu]==$MLX_VERSION"
git clone -q . "$T/src"
echo "-- isolated pip install . (mlx[cpu]==$MLX_VERSION in the venv)"
(cd "$T/src" && pip install .) || fail "isolated pip install ."

cat > "$T/check.py" <<'PY'
import importlib.metadata as md, sys
import mlx.core as mx, numpy as np
import mlx_rmsnorm
x = mx.random.normal((37, 200), key=mx.random.key(0))
w = mx.random.normal((200,), key=mx.random.key(1))
g = mx.random.normal((37, 200), key=mx.random.key(2))
x64, w64, g64 = (np.array(a, dtype=np.float64) for a in (x, w, g))
r = 1 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5)
y_ref = x64 * r * w64
gx_ref = r * (g64 * w64 - x64 * r * r * (g64 * w64 * x64).mean(-1, keepdims=True))
gw_ref = (g64 * x64 * r).sum(0)
with mlx_rmsnorm.patched():
    y, (gx, gw) = mx.value_and_grad(lambda x, w: (mx.fast.rms_norm(x, w, 1e-5) * g).sum(), (0, 1))(x, w)
    y = mx.fast.rms_norm(x, w, 1e-5)
err = lambda a, b: np.abs(np.array(a, dtype=np.float64) - b).max() / np.abs(b).max()
errs = err(y, y_ref), err(gx, gx_ref), err(gw, gw_ref)
assert max(errs) < 2e-5, errs
pin = [r for r in md.requires("mlx-rmsnorm") if r.startswith(("mlx[", "mlx=="))]
print("errors", ["%.1e" % e for e in errs], "requires", pin, "file", mlx_rmsnorm.__file__)
assert pin == [sys.argv[1]], pin
PY
"$PY" "$T/check.py" "mlx[cpu]==$MLX_VERSION" || fail "import + forward/backward + pin"
echo "PASS isolated install: import, forward/backward vs float64, requires mlx[cpu]==$MLX_VERSION"

cat > "$T/train.py" <<'PY'
import sys
import mlx.core as mx, mlx.nn as nn
model = nn.Sequential(nn.Linear(8, 16), nn.RMSNorm(16), nn.Linear(16, 1))
step = nn.value_and_grad(model, lambda m, x: m(x).square().mean())
mx.eval(step(model, mx.random.normal((4, 8))))
PY
# On a CPU stream patch() runs MLX's own norm unless MLX_RMSNORM_ROUTE_CPU=1
# (docs/api.md): with it the plugin's nodes are in the graph, without it the
# report says so.
out="$(MLX_RMSNORM_PATCH=1 MLX_RMSNORM_REPORT=1 MLX_RMSNORM_ROUTE_CPU=1 "$PY" "$T/train.py" 2>&1)" \
  || fail "MLX_RMSNORM_PATCH run: $out"
echo "$out" | grep "patched="
echo "$out" | grep -q "patched=True .*RMSNormPluginVJP=[1-9]" || fail "MLX_RMSNORM_PATCH did not patch: $out"
out="$(MLX_RMSNORM_PATCH=1 MLX_RMSNORM_REPORT=1 "$PY" "$T/train.py" 2>&1)" || fail "MLX_RMSNORM_PATCH run: $out"
echo "$out" | grep -q "patched=True" && echo "$out" | grep -q "the default stream is the CPU" \
  || fail "MLX_RMSNORM_PATCH on the CPU stream: no patch, or no word of MLX's own norm: $out"
out="$("$PY" "$T/train.py" 2>&1)"
echo "$out" | grep -q "mlx_rmsnorm report" && fail "report without the variables"
echo "PASS MLX_RMSNORM_PATCH=1 patches a program that never imports mlx_rmsnorm (.pth)"
out="$(MLX_RMSNORM_REPORT=1 "$PY" "$T/train.py" 2>&1)" || fail "MLX_RMSNORM_REPORT run: $out"
echo "$out" | tail -1
echo "$out" | grep -q "patched=False gradient_graphs=1 RMSNormPlugin=0 RMSNormPluginVJP=0" \
  || fail "MLX_RMSNORM_REPORT=1 alone printed no report: $out"
echo "PASS MLX_RMSNORM_REPORT=1 alone reports (the built-in ran, nothing patched)"

echo "-- mlx[cpu]==$OLD_MLX over it"
pip install "mlx[cpu]==$OLD_MLX"
if out="$("$PY" -c "import mlx_rmsnorm" 2>&1)"; then fail "import with mlx $OLD_MLX succeeded"; fi
msg="$(echo "$out" | tail -1)"
echo "$msg"
case "$msg" in
  ImportError:*"built against mlx $MLX_VERSION (cpu)"*"mlx $OLD_MLX (cpu) is installed"*"pip install --force-reinstall --no-deps"*) ;;
  *) fail "unexpected error for another MLX" ;;
esac
echo "PASS another MLX: ImportError names both versions and the rebuild command"
(cd "$T/src" && pip install --force-reinstall --no-deps .) || fail "rebuild"
"$PY" "$T/check.py" "mlx[cpu]==$OLD_MLX" || fail "after the rebuild"
echo "PASS rebuild with the printed command: imports and runs against mlx $OLD_MLX"
echo "install check: $((SECONDS - t0)) s"
