#!/usr/bin/env bash
# Issue 21's look at the fixed cost of a call, one device call:
#   bash scripts/gpu_fixed_cost_run.sh OUT
# From the repo root, in a run that carries .device. Builds the extension
# twice for sm_90, as shipped before (nanobind's -Os over the whole module)
# and with NOMINSIZE (the CMakeLists.txt of the tree), then in separate
# processes, alternating the two builds: the host cost per call at decode
# shapes (scripts/host_overhead.py) and the generation benchmark; then, on
# the tree's build, the decode forwards' kernel times under ncu
# (scripts/decode_kernels.py) and the CUDA calls and kernel GPU time per
# eval (scripts/cuda_calls.py). Logs land in OUT as each step ends.
set -u
OUT="${1:?output folder}"
R="$PWD"
export PYTHONUNBUFFERED=1
t0=$SECONDS
step() { echo; echo "=== $1 ($((SECONDS - t0)) s)"; }
build() {
  MLX_RMSNORM_CUDA_ARCHS=90 CMAKE_BUILD_PARALLEL_LEVEL=16 \
    python3 -m pip install -q --no-build-isolation --no-deps -e . >/tmp/build.log 2>&1 \
    || { tail -40 /tmp/build.log; exit 1; }
}
use() { cp "/tmp/ext-$1.so" "$R"/mlx_rmsnorm/_ext.*.so; }

step setup
source .device/setup.sh || exit 1
step "build -Os (as before)"
cp CMakeLists.txt /tmp/CMakeLists.txt
sed -i 's/ NOMINSIZE//' CMakeLists.txt
build
cp "$R"/mlx_rmsnorm/_ext.*.so /tmp/ext-Os.so
cp /tmp/CMakeLists.txt CMakeLists.txt
step "build NOMINSIZE"
build
cp "$R"/mlx_rmsnorm/_ext.*.so /tmp/ext-O3.so
cd /tmp

step "host cost per call, decode shapes, -Os vs NOMINSIZE (alternating processes)"
for rep in 1 2; do
  for v in Os O3; do
    use $v
    echo "--- build $v, pass $rep"
    timeout 60 python3 "$R/scripts/host_overhead.py" --shapes 1x1x1024,1x1x16x128,1x1x4096 \
      --calls 200 --repeats 10
  done
done 2>&1 | tee "$OUT/host-overhead.log" | grep -E "^---|^fwd|^bwd|^x \+|calls per eval"

step "generation, -Os vs NOMINSIZE"
for v in Os O3; do
  use $v
  echo "--- build $v"
  timeout 120 python3 -m mlx_rmsnorm.bench --generate --out /tmp/bench-$v 2>&1 | grep -v "generate:"
done 2>&1 | tee "$OUT/generate-Os-vs-O3.log" | grep -E "^---|decode|prefill"
use O3

step "decode forwards under ncu"
timeout 150 python3 "$R/scripts/decode_kernels.py" 2>&1 | tee "$OUT/decode-kernels.txt"

step "CUDA calls and kernel GPU time per eval"
timeout 200 python3 "$R/scripts/cuda_calls.py" --out "$OUT/cuda-calls.txt" \
  --scenarios fwd1-1x1024,decode-qwen3-0.6b,decode-llama-3-8b,bwd20-8192x1024 2>&1 | grep "^##"
echo "done in $((SECONDS - t0)) s"
