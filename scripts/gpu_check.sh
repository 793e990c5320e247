#!/usr/bin/env bash
# The whole GPU check in one device run. From the repo root, on the GPU machine,
# in a run that carries .device (made here by ../shared/tools/device-wheels):
#
#   bash scripts/gpu_check.sh [steps...]   steps: build cli tune profile tests train
#                                         transformer bench trainstep ptx mismatch sanitize
#                                         memory
#                                         (default: build cli tests train transformer bench)
#   Separately: scripts/gpu_install_check.sh (pip install of the CUDA flavor),
#   scripts/gpu_distributed_check.sh (NCCL, 2 GPUs).
# Env: TESTS (test paths, default tests), TRANSFORMER_PRECISIONS, SANITIZE_TOOLS,
#      SANITIZE_TIMEOUT, RACECHECK_ARGS, PROFILE_MLX_ONLY.
#
# Installs the carried MLX CUDA wheels, builds the extension against them, then
# runs the standalone CLI, the whole test suite (GPU-marked tests included) and
# the benchmark. Logs and results go to $OUT (the device tool brings it back).
set -uo pipefail
ROOT="$PWD"
OUT="${OUT:-$ROOT/results/gpu}"
mkdir -p "$OUT"
steps="${*:-build cli tests train transformer bench}"
status=0
has() { [[ " $steps " == *" $1 "* ]]; }
step() { echo; echo "=== $1 ($(date +%T))"; }

step setup
source .device/setup.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader

if has build || has tests || has bench || has sanitize || has memory || has train || has transformer || has profile; then
  step build
  # (the build log comes back only when the build fails: $OUT holds 8 files)
  python3 -m pip install --no-build-isolation --no-deps -v -e . >/tmp/build.log 2>&1 \
    || { cp /tmp/build.log "$OUT/"; tail -40 /tmp/build.log; exit 1; }
  grep -E "CUDA kernels|fmt" /tmp/build.log | head -3
  python3 -c "import mlx_rmsnorm as m; assert m.has_cuda_kernels, 'built without kernels'; print('extension OK, CUDA kernels built')" || exit 1
fi

if has cli || has tune || has profile; then
  step "standalone build (cuda/, no MLX)"
  cmake -S cuda -B build/cuda -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build/cuda >/dev/null \
    || { echo "CLI build failed"; status=1; }
fi

if has cli; then
  step cli
  for shape in "8192 16384" "128 262144" "2880 16384"; do
    ./build/cuda/rmsnorm_backward $shape 30 || status=1
  done 2>&1 | tee "$OUT/cli.log"
fi

if has tune; then
  step tune
  { ./build/cuda/tune_backward 30 && echo && ./build/cuda/tune_forward 30; } 2>&1 | tee "$OUT/tune.log" || status=1
fi

if has profile; then
  step profile
  # Nsight Compute on the persistent backward (the table's plan) at the
  # benchmark shapes, and on the built-in's kernels for comparison.
  sections="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis"
  : >"$OUT/profile.log"
  [ -n "${PROFILE_MLX_ONLY:-}" ] ||
  for shape in "8192 16384" "8192 4096" "4096 16384" "2048 32768" "128 262144" "2880 16384" "16384 8192"; do
    echo "##### rmsnorm_backward $shape"
    ncu --clock-control none $sections -k regex:bwd_persistent --launch-skip 1 --launch-count 1 \
      ./build/cuda/rmsnorm_backward $shape 2 2>&1 | grep -v "^==PROF==" | grep -vi "^  *-\+ *$"
  done >>"$OUT/profile.log" 2>&1
  # Through MLX (needs the build step): the built-in's backward, and both
  # forwards where ours trails the built-in.
  if python3 -c "import mlx_rmsnorm" 2>/dev/null; then
    for case in "bwd builtin 16384 8192 rms_norm" "fwd ours 32768 2048 fwd_rows" \
                "fwd builtin 32768 2048 rms_norm" "fwd ours 16384 8192 fwd_rows" \
                "fwd builtin 16384 8192 rms_norm"; do
      set -- $case
      echo "##### $1 $2 $3x$4"
      ncu --clock-control none $sections -k regex:$5 --launch-skip 1 --launch-count 1 \
        python3 scripts/profile_case.py $1 $2 $3 $4 2>&1 | grep -v "^==PROF==" | grep -vi "^  *-\+ *$"
    done >>"$OUT/profile.log" 2>&1
  fi
  grep -E "^#####|bwd_persistent|fwd_rows|rms_norm|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Memory Throughput|Stall|Warp Cycles Per Issued" "$OUT/profile.log" | head -150
fi

if has tests; then
  step tests
  # Not from the repo root: the installed package (with _ext) must be imported.
  # pytest-xdist (on the GPU machine's image) spreads the float64 references
  # over the CPU cores; the GPU work itself is small.
  # --dist loadgroup: the large GPU cases (tests/conftest.py, xdist_group
  # "gpu-large") run one after another in one worker, not eight at once.
  xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8 --dist loadgroup")
  # The bigmem tests (tens of GB each) run afterwards, alone on the GPU.
  MLX_RMSNORM_HYPOTHESIS_PROFILE=gpu \
    python3 -m pytest -q -p no:cacheprovider -rfE $xdist -m "not bigmem" ${TESTS:-tests} 2>&1 | tee "$OUT/tests.log" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  python3 -m pytest -q -p no:cacheprovider -rfE -m bigmem ${TESTS:-tests} 2>&1 | tee -a "$OUT/tests.log" | tail -8
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if has train; then
  step train
  python3 examples/train.py 2>&1 | tee "$OUT/train.log" | tail -25
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if has transformer; then
  step transformer
  : >"$OUT/transformer.log"
  for precision in ${TRANSFORMER_PRECISIONS:-float32 mixed bfloat16}; do
    python3 examples/train_transformer.py --precision $precision >>"$OUT/transformer.log" 2>&1 || status=1
    if [ $precision = float32 ]; then
      # again with exact fp32 matmuls (no TF32): the fp32-level check
      MLX_ENABLE_TF32=0 python3 examples/train_transformer.py --precision float32 >>"$OUT/transformer.log" 2>&1 || status=1
    fi
  done
  grep -E "^device:|ms/step|agree|gradients" "$OUT/transformer.log"
fi

if has bench; then
  step bench
  python3 -m mlx_rmsnorm.bench --out "$OUT" 2>&1 | tee "$OUT/bench.log" | grep -v "cases:" | tail -75
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if has trainstep; then
  step "training step (mlx-lm models, built-in vs patch())"
  python3 examples/bench_train_step.py --json "$OUT/train_step.json" 2>&1 | tee "$OUT/train_step.log" | tail -12
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if has ptx; then
  # Other GPU families on this GPU: PTX-only builds for compute_80 and
  # compute_75, JIT-compiled by the driver, run those families' paths and
  # plans (gpu_family() must say so). Rebuilds the extension: run last.
  for fam in 80 75; do
    step "PTX build compute_$fam"
    MLX_RMSNORM_CUDA_ARCHS=${fam}-virtual python3 -m pip install --no-build-isolation --no-deps -e . \
      >/tmp/build$fam.log 2>&1 || { tail -20 /tmp/build$fam.log; status=1; continue; }
    MLX_RMSNORM_EXPECT_FAMILY=$fam MLX_RMSNORM_HYPOTHESIS_PROFILE=gpu python3 -m pytest -q \
      -p no:cacheprovider -rfE $(python3 -c "import xdist" 2>/dev/null && echo "-n 8 --dist loadgroup") \
      -m "gpu and not bigmem" tests 2>&1 | tee "$OUT/tests$fam.log" | tail -3
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    python3 -m mlx_rmsnorm.bench --sections table --repeats 3 --out "$OUT/b$fam" 2>/dev/null >"$OUT/bench$fam.log" || status=1
  done
fi

if has mismatch; then
  step "mismatched build (80-real only, on this GPU): the error users get"
  rm -rf /tmp/arch80 /tmp/t80 && cp -r . /tmp/arch80
  (cd /tmp/arch80 && MLX_RMSNORM_CUDA_ARCHS=80-real python3 -m pip install --no-build-isolation \
     --no-deps --target /tmp/t80 . >/tmp/build80.log 2>&1) || { tail -20 /tmp/build80.log; status=1; }
  # (from /tmp: the repo root on sys.path would import the editable build)
  (cd /tmp && PYTHONPATH=/tmp/t80 python3 "$ROOT/scripts/mismatch_check.py") 2>&1 | tee "$OUT/mismatch.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if has sanitize; then
  step sanitize
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}; do
    start=$SECONDS
    # racecheck tracks every shared-memory access: it gets the smaller set
    args=""; [ $tool = racecheck ] && args="${RACECHECK_ARGS:---max-n 16392 --long-rows 64}"
    # (on a time-out, the last lines say which N it had reached)
    timeout ${SANITIZE_TIMEOUT:-170} compute-sanitizer --tool $tool --print-limit 20 --error-exitcode 1 \
      python3 scripts/sanitize_cases.py $args 2>&1 | tail -4 | sed "s/^/[$tool] /"
    rc=${PIPESTATUS[0]}
    [ $rc = 124 ] && echo "[$tool] TIMED OUT: not every case ran"
    echo "[$tool] $((SECONDS - start)) s (limit ${SANITIZE_TIMEOUT:-170} s), exit $rc"
  done | tee "$OUT/sanitize.log"
  grep -q "exit [1-9]" "$OUT/sanitize.log" && status=1
fi

if has memory; then
  step memory
  python3 scripts/memory_check.py --steps 10000 2>&1 | tee "$OUT/memory.log" | tail -6
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

echo; echo "=== done: status $status"
exit $status
