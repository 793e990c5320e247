#!/usr/bin/env bash
# The final H200 runs of a session with little device time left: every step
# under its own time limit, logs in OUT as each step ends (a run cut at its
# limit still returns what it finished).
#   bash scripts/gpu_session_run.sh OUT [BUDGET_S] [STEPS]
# From the repo root, in a run that carries .device. STEPS (default: all, in
# this order): build tests generate decode calls host train-shapes table
# fused layernorm steps ncu.
#   build         sm_90 editable build (skipped when this tree's build is there)
#   tests         GPU-marked tests (-n 8; the rest of the suite runs in CI)
#   generate      python -m mlx_rmsnorm.bench --generate
#   decode        decode-step forwards under ncu (scripts/decode_kernels.py)
#   calls         CUDA calls and kernel GPU time per eval (scripts/cuda_calls.py)
#   host          host cost per call at decode shapes (scripts/host_overhead.py)
#   train-shapes  the benchmark's training and decode sections
#   table         the nine big shapes
#   fused, layernorm   bench --fused, the LayerNorm training shapes
#   steps         training steps (examples/bench_train_step.py)
#   ncu           kernels alone at the seed shape and training shapes
set -u
OUT="${1:?output folder}"
BUDGET="${2:-540}"
STEPS=" ${3:-build tests generate decode calls host train-shapes table fused layernorm steps ncu} "
R="$PWD"
export PYTHONUNBUFFERED=1
t0=$SECONDS
has() { [[ "$STEPS" == *" $1 "* ]]; }
left() { echo $((BUDGET - (SECONDS - t0))); }
step() { echo; echo "=== $1 ($((SECONDS - t0)) s)"; }
# cap MAX [RESERVE]: at most MAX seconds, never past the budget less RESERVE
cap() { local l=$(($(left) - ${2:-0})); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo "$l"; }

step setup
source .device/setup.sh || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
# The build of this tree: the sources' hash, kept beside the extension.
tree=$(cat CMakeLists.txt cuda/*.cu cuda/*.cuh cuda/*.h mlx_rmsnorm/csrc/*.cpp mlx_rmsnorm/csrc/*.h | md5sum | cut -c1-12)
if has build; then
  step "build ($tree)"
  if [ "$(cat mlx_rmsnorm/.built-tree 2>/dev/null)" = "$tree" ] && python3 -c "import mlx_rmsnorm" 2>/dev/null; then
    echo "this tree's build is there"
  else
    MLX_RMSNORM_CUDA_ARCHS=90 CMAKE_BUILD_PARALLEL_LEVEL=16 timeout "$(cap 300)" \
      python3 -m pip install -q --no-build-isolation --no-deps -e . >/tmp/build.log 2>&1 \
      || { tail -40 /tmp/build.log; exit 1; }
    echo "$tree" >mlx_rmsnorm/.built-tree
  fi
fi
cd /tmp
python3 -c "import mlx_rmsnorm as m; assert m.has_cuda_kernels; print('kernels, family', m.gpu_family())" || exit 1

if has tests; then
  step "GPU tests"
  # SIGINT at the limit: pytest still prints its summary line
  MLX_RMSNORM_HYPOTHESIS_PROFILE=gpu timeout -s INT "$(cap 200 60)" python3 -m pytest -q -p no:cacheprovider -rfE \
    -n 8 --dist loadgroup -m "gpu and not bigmem" "$R/tests" 2>&1 | tee "$OUT/tests.log" | tail -15
fi
if has generate; then
  step "generation (built-in, patch(), patch(fuse=True))"
  timeout "$(cap 150 30)" python3 -m mlx_rmsnorm.bench --generate --out /tmp/bench 2>&1 | grep -v "generate:" | tee "$OUT/generate.log"
fi
if has decode; then
  step "decode-step forwards under ncu"
  timeout "$(cap 60 30)" python3 "$R/scripts/decode_kernels.py" 2>&1 | tee "$OUT/decode-kernels.txt"
fi
if has calls; then
  step "CUDA calls and kernel GPU time per eval"
  timeout "$(cap 200 30)" python3 "$R/scripts/cuda_calls.py" --out "$OUT/cuda-calls.txt" --scenarios \
    fwd1-1x1024,bwd1-8192x2048,bwd20-8192x1024,decode-qwen3-0.6b,decode-llama-3-8b,train-qwen3-0.6b,train-llama-8b-slice-frozen \
    2>&1 | grep "^##"
fi
if has host; then
  step "host cost per call, decode shapes"
  timeout "$(cap 60 30)" python3 "$R/scripts/host_overhead.py" --shapes 1x1x1024,1x1x16x128,1x1x4096 \
    --calls 200 --repeats 10 2>&1 | tee "$OUT/host-overhead.txt" | grep -E "calls per eval|^fwd|^bwd"
fi
# bench TITLE LOG LIMIT ARGS...: one section run of the benchmark, its table in OUT/LOG
bench() {
  local title=$1 log=$2 limit=$3; shift 3
  step "$title"
  timeout "$(cap "$limit" 30)" python3 -m mlx_rmsnorm.bench "$@" --out /tmp/bench 2>&1 \
    | grep -v "cases\|case " | tee "$OUT/$log" | tail -4
}
has train-shapes && bench "training and decode shapes" bench-training.log 120 \
  --sections training,decode --repeats 5 --singles 5
has table && bench "nine big shapes" bench-table.log 90 --sections table --repeats 5
has fused && bench "fused add + norm" bench-fused.log 60 --fused
has layernorm && bench "LayerNorm training shapes" bench-ln.log 60 --sections ln_training --repeats 5
if has steps; then
  step "training steps (built-in, patch(), patch(fuse=True))"
  { timeout "$(cap 150 30)" python3 "$R/examples/bench_train_step.py" --rounds 5 --model qwen3-0.6b,llama-8b-slice 2>&1
    timeout "$(cap 60 20)" python3 "$R/examples/bench_train_step.py" --rounds 3 --model gpt2-medium --norms trained 2>&1; } \
    | grep -v "round/s" | tee "$OUT/train-step.log" | grep -A8 "^model"
fi
if has ncu; then
  step "kernels alone (ncu): the seed shape and training shapes"
  PROFILE_SHAPES=16384x8192,4096x896,8192x1024,32768x5120 timeout "$(cap 120 5)" ncu --clock-control none --csv \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    python3 "$R/scripts/profile_training.py" >/tmp/ncu.csv 2>/dev/null
  python3 "$R/scripts/profile_training.py" --report /tmp/ncu.csv 2>&1 | tee "$OUT/ncu-training.txt"
fi
echo "done in $((SECONDS - t0)) s"
