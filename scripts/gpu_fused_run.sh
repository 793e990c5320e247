#!/usr/bin/env bash
# Issue 22's one GPU run (H200): build for sm_90, the fused-add tests, the
# fused benchmark section (with the Gemma accuracy figures), the Qwen3-0.6B
# training step and decode with patch(fuse=True) as the third contender, then
# the RMSNorm GPU tests (the kernels the fused add now shares). Every step has
# its own time limit and log under OUT; a failed step does not stop the next.
#   bash scripts/gpu_fused_run.sh OUT
# (from the repository root, with MLX CUDA installed: .device/setup.sh)
set -u
OUT="${1:?output folder}"
export PYTHONUNBUFFERED=1
root="$PWD"
t0=$SECONDS
step() { echo "== $1 ($((SECONDS - t0)) s)" | tee -a "$OUT/steps.log"; }
# One device call is 420 s at most: each step gets its own limit or what is
# left of BUDGET after the minimum the later steps are promised.
BUDGET="${BUDGET:-405}"
limit() {  # limit MAX RESERVE -> seconds for this step
  local left=$((BUDGET - (SECONDS - t0) - $2))
  [ "$left" -gt "$1" ] && left=$1
  [ "$left" -lt 5 ] && left=5
  echo "$left"
}

step build
MLX_RMSNORM_CUDA_ARCHS=90 CMAKE_BUILD_PARALLEL_LEVEL=16 timeout "$(limit 220 150)" python3 -m pip install -q \
  --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1 || { echo "build failed"; tail -40 "$OUT/build.log"; exit 1; }
python3 -c "import mlx_rmsnorm as m; print('kernels', m.has_cuda_kernels, 'family', m.gpu_family())" | tee -a "$OUT/steps.log"

step "fused tests"
cd /tmp
timeout "$(limit 100 120)" python3 -m pytest -q --maxfail=10 -p no:cacheprovider \
  "$root/tests/test_fused_add.py" "$root/tests/test_fuse.py" >"$OUT/tests.log" 2>&1
echo "fused tests rc=$?" | tee -a "$OUT/steps.log"
tail -4 "$OUT/tests.log"

step "bench --fused"
timeout "$(limit 60 80)" python3 -m mlx_rmsnorm.bench --fused --repeats 5 --calls 20 --singles 1 \
  --out "$OUT/b" >"$OUT/bench-fused.log" 2>&1; echo "bench rc=$?" | tee -a "$OUT/steps.log"
cp "$OUT"/b/*.csv "$OUT"/ 2>/dev/null; rm -rf "$OUT/b"
tail -32 "$OUT/bench-fused.log"

step "train step + decode"
timeout "$(limit 100 30)" python3 "$root/examples/bench_train_step.py" --model qwen3-0.6b,llama-8b-slice --norms trained \
  --rounds 5 --steps-per-round 4 --decode 32 --norm-reps 3 >"$OUT/train.log" 2>&1
echo "train rc=$?" | tee -a "$OUT/steps.log"
tail -14 "$OUT/train.log"

step "rmsnorm gpu tests"
timeout "$(limit 90 0)" python3 -m pytest -q -p no:cacheprovider "$root/tests/test_gpu.py" \
  "$root/tests/test_numerics.py" "$root/tests/test_determinism.py" -m gpu >"$OUT/tests_rms.log" 2>&1
echo "rmsnorm gpu tests rc=$?" | tee -a "$OUT/steps.log"
tail -3 "$OUT/tests_rms.log"
step done
