#!/usr/bin/env bash
# The final H200 run of a session with little device time left: one call,
# every step under its own time limit, the user-facing benchmarks first, the
# GPU-marked tests last (the rest of the suite runs in CI on the CPU).
#   bash scripts/gpu_session_run.sh OUT [BUDGET_S]
# From the repo root, in a run that carries .device. Logs land in OUT as each
# step ends, so a run cut at its limit still returns what it finished.
set -u
OUT="${1:?output folder}"
BUDGET="${2:-540}"
R="$PWD"
export PYTHONUNBUFFERED=1
t0=$SECONDS
left() { echo $((BUDGET - (SECONDS - t0))); }
step() { echo; echo "=== $1 ($((SECONDS - t0)) s)"; }
# cap MAX: at most MAX seconds, never past the budget (keeping RESERVE for the tests)
cap() { local l=$(($(left) - ${2:-0})); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo "$l"; }

step setup
source .device/setup.sh || exit 1
step build
MLX_RMSNORM_CUDA_ARCHS=90 CMAKE_BUILD_PARALLEL_LEVEL=16 timeout "$(cap 300)" \
  python3 -m pip install -q --no-build-isolation --no-deps -e . >/tmp/build.log 2>&1 \
  || { tail -40 /tmp/build.log; exit 1; }
cd /tmp
python3 -c "import mlx_rmsnorm as m; assert m.has_cuda_kernels; print('kernels, family', m.gpu_family())" || exit 1

step "generation (built-in vs patch())"
timeout "$(cap 70 250)" python3 -m mlx_rmsnorm.bench --generate --out /tmp/bench 2>&1 | grep -v "generate:" | tee "$OUT/generate.log"
step "training shapes"
timeout "$(cap 30 250)" python3 -m mlx_rmsnorm.bench --sections training --repeats 5 --out /tmp/bench 2>&1 \
  | grep -v "cases\|case " | tee "$OUT/bench-training.log"
step "fused add + norm"
timeout "$(cap 40 250)" python3 -m mlx_rmsnorm.bench --fused --out /tmp/bench 2>&1 | grep -v "cases\|case " | tee "$OUT/bench-fused.log" | tail -30
step "LayerNorm training shapes"
timeout "$(cap 40 250)" python3 -m mlx_rmsnorm.bench --sections ln_training --repeats 5 --out /tmp/bench 2>&1 \
  | grep -v "cases\|case " | tee "$OUT/bench-ln.log" | tail -30
step "GPU tests"
# SIGINT at the limit: pytest still prints its summary line (what passed, what failed)
MLX_RMSNORM_HYPOTHESIS_PROFILE=gpu timeout -s INT "$(cap 180 100)" python3 -m pytest -q -p no:cacheprovider -rfE \
  -n 8 --dist loadgroup -m "gpu and not bigmem" "$R/tests" 2>&1 | tee "$OUT/tests.log" | tail -25
step "training steps (built-in, patch(), patch(fuse=True))"
{ timeout "$(cap 90)" python3 "$R/examples/bench_train_step.py" --rounds 3 --model qwen3-0.6b,llama-8b-slice 2>&1
  timeout "$(cap 40)" python3 "$R/examples/bench_train_step.py" --rounds 3 --model gpt2-medium --norms trained 2>&1; } \
  | grep -v "round/s" | tee "$OUT/train-step.log" | grep -A8 "^model"
echo "done in $((SECONDS - t0)) s"
