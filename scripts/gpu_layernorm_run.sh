#!/usr/bin/env bash
# Issue 24's one GPU run (H200): build for sm_90, the LayerNorm tests, the
# LayerNorm benchmark sections, the gpt2-medium training step, then the
# RMSNorm GPU tests (the walker refactor and the moved helpers). Each step has its own
# time limit and log under OUT, and a failed step does not stop the next.
#   bash scripts/gpu_layernorm_run.sh OUT
# (from the repository root, with MLX CUDA installed: .device/setup.sh)
set -u
OUT="${1:?output folder}"
export PYTHONUNBUFFERED=1
root="$PWD"
t0=$SECONDS
step() { echo "== $1 ($((SECONDS - t0)) s)" | tee -a "$OUT/steps.log"; }
# The whole run must end inside one device call (420 s): each step gets at
# most its own limit and what is left of BUDGET, minus what the steps after it
# are guaranteed (their minimum).
BUDGET="${BUDGET:-400}"
limit() {  # limit MAX RESERVE -> seconds for this step
  local left=$((BUDGET - (SECONDS - t0) - $2))
  [ "$left" -gt "$1" ] && left=$1
  [ "$left" -lt 5 ] && left=5
  echo "$left"
}

step build
MLX_RMSNORM_CUDA_ARCHS=90 CMAKE_BUILD_PARALLEL_LEVEL=16 timeout "$(limit 240 150)" python3 -m pip install -q \
  --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1 || { echo "build failed"; tail -40 "$OUT/build.log"; exit 1; }
python3 -c "import mlx_rmsnorm as m; print('kernels', m.has_cuda_kernels, 'family', m.gpu_family())" | tee -a "$OUT/steps.log"

step tests
cd /tmp
timeout "$(limit 90 130)" python3 -m pytest -q --maxfail=10 -p no:cacheprovider "$root/tests/test_layer_norm.py" \
  >"$OUT/tests.log" 2>&1; echo "layer_norm tests rc=$?" | tee -a "$OUT/steps.log"
tail -3 "$OUT/tests.log"

step bench
timeout "$(limit 120 70)" python3 -m mlx_rmsnorm.bench --sections ln_training,ln_table --repeats 5 \
  --out "$OUT/b" >"$OUT/bench.log" 2>&1; echo "bench rc=$?" | tee -a "$OUT/steps.log"
cp "$OUT"/b/*.csv "$OUT"/ 2>/dev/null; rm -rf "$OUT/b"

step train
timeout "$(limit 110 15)" python3 "$root/examples/bench_train_step.py" --model gpt2-medium --norms trained \
  --rounds 4 --steps-per-round 4 >"$OUT/train.log" 2>&1; echo "train rc=$?" | tee -a "$OUT/steps.log"
tail -6 "$OUT/train.log"
step "rmsnorm gpu tests"
timeout "$(limit 60 0)" python3 -m pytest -q -p no:cacheprovider "$root/tests/test_gpu.py" \
  "$root/tests/test_numerics.py" "$root/tests/test_determinism.py" -m gpu >"$OUT/tests_rms.log" 2>&1
echo "rmsnorm gpu tests rc=$?" | tee -a "$OUT/steps.log"
tail -2 "$OUT/tests_rms.log"
step done
