#!/usr/bin/env bash
# The GPU check: every run on the GPU machine goes through here, as named steps.
# Run by hand (a developer) in a device run that carries .device (made by
# ../shared/tools/device-wheels), from the repository root:
#
#   bash scripts/gpu_run.sh STEP...        (no STEP: build tests)
#
# Each step writes its log under $OUT (default results/gpu) as it ends, runs
# under its own time limit and inside BUDGET seconds for the whole run
# (default 570, one device call), so a run cut short still returns what it
# finished; a failed step does not stop the next; the exit status says
# whether any failed. Steps that need the extension build it first when the
# tree's build is not there yet (editable, incremental: build/<flavor>-<mlx>/).
#
# The steps are this file's run_* functions, one a step (the step's name is
# the function's, "-" for "_"), each under its one-line description (the
# "#:" line above it), in the groups of the "#::" lines; --help prints them
# (usage, below, reads them from here), and a name that is no step is
# refused before anything runs.
#
# PACK=FILE: when the steps end, OUT's logs (not the benchmark's plots and
# data files) go into one .tar.gz at FILE; a device run that brings back only
# a few files from its output folder sets OUT to a scratch folder and PACK
# into its output folder.
#
# Separately: scripts/gpu_install_check.sh (pip install of the CUDA flavor),
# scripts/gpu_distributed_check.sh (NCCL, 2 GPUs).
set -uo pipefail
ROOT="$PWD"
SELF="${BASH_SOURCE[0]}"
OUT="${OUT:-$ROOT/results/gpu}"
BUDGET="${BUDGET:-570}"
export PYTHONUNBUFFERED=1
STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=(build tests)
# The step names: one a run_* function of this file.
steps() { sed -n 's/^run_\([a-z_]*\)() .*/\1/p' "$SELF" | tr _ -; }
# The header above, then every step with its description, under its group.
usage() {
  sed -n '2,/^# scripts\/gpu_distributed_check.sh/s/^# \{0,1\}//p' "$SELF"
  echo
  echo "Steps:"
  awk '/^#:: / { print " " substr($0, 5); next }
       /^#: / { d = substr($0, 4); next }
       /^run_[a-z_]*\(\) / { n = substr($1, 5); sub(/\(\).*/, "", n); gsub(/_/, "-", n)
                             printf "   %-15s %s\n", n, d; d = "" }' "$SELF"
}
case " ${STEPS[*]} " in *" --help "* | *" -h "*) usage; exit 0 ;; esac
KNOWN=" $(steps | tr '\n' ' ')"
for s in "${STEPS[@]}"; do
  [[ "$KNOWN" == *" $s "* ]] || { echo "unknown step '$s'; steps:$KNOWN" | tr -s ' \n' ' '; echo; exit 2; }
done
mkdir -p "$OUT"
t0=$SECONDS
failed=()
step() { echo; echo "=== $1 ($((SECONDS - t0)) s)"; }
# cap MAX: at most MAX seconds, and never past the budget
cap() { local l=$((BUDGET - (SECONDS - t0) - 5)); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo "$l"; }
# pytest-xdist (on the GPU machine's image) spreads the float64 references over
# the CPU cores; --dist loadgroup runs the large GPU cases (tests/conftest.py,
# xdist_group "gpu-large") one after another in one worker, not eight at once.
XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8 --dist loadgroup")

step setup
# Steps that run torch alone (the peers) need no MLX: a call that carries
# QuACK's wheels has no room for .device beside them (lab/peers_wheels.py).
TORCH_ONLY=" peers "
mlx_steps=$(for s in "${STEPS[@]}"; do [[ "$TORCH_ONLY" == *" $s "* ]] || echo "$s"; done)
if [ -n "$mlx_steps" ]; then source .device/setup.sh || exit 1; fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader

# The extension of this tree, built once per run at most (skipped when the
# tree's build is there: build_backend/dev_build.py).
built=""
case "${MLX_RMSNORM_CUDA_ARCHS:-90}" in
  default) unset MLX_RMSNORM_CUDA_ARCHS ;;
  *) export MLX_RMSNORM_CUDA_ARCHS="${MLX_RMSNORM_CUDA_ARCHS:-90}" ;;
esac
# A build of this tree made beforehand on the development machine
# (scripts/device_prebuild.sh, carried as results/prebuilt) is used as it is:
# the build here costs 2-3 minutes of each device call.
PREBUILT="$ROOT/results/prebuilt"
ensure_built() {
  [ -n "$built" ] && return 0
  local why
  if [ -f "$PREBUILT/tree" ] && [ "$(cat "$PREBUILT/tree")" = "$(python3 build_backend/dev_build.py tree-hash)" ] \
      && [ "${MLX_RMSNORM_CUDA_ARCHS:-}" = "$(cat "$PREBUILT/archs")" ]; then
    cp "$PREBUILT"/_ext.*.so "$PREBUILT"/_build_info.py mlx_rmsnorm/ || return 1
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    # the .pth an install puts in site-packages (MLX_RMSNORM_PATCH), as ./run.sh writes it
    python3 build_backend/mlx_rmsnorm_build.py --pth \
      >"$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/mlx_rmsnorm_autopatch.pth" || return 1
    echo "the prebuilt extension of this tree (architectures $(cat "$PREBUILT/archs"))"
  elif why=$(python3 build_backend/dev_build.py up-to-date); then
    echo "the build of this tree is there"
  else
    echo "building ($why), architectures ${MLX_RMSNORM_CUDA_ARCHS:-default}"
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-16}" timeout "$(cap 400)" \
      python3 -m pip install -v --no-build-isolation --no-deps -e . >/tmp/build.log 2>&1 \
      || { cp /tmp/build.log "$OUT/"; tail -40 /tmp/build.log; return 1; }
    grep -E "CUDA kernels|CUDA architectures|fmt" /tmp/build.log | sed 's/^ *//' | head -3
  fi
  # from /tmp: the installed package is imported, not the folder (or, prebuilt,
  # the folder through PYTHONPATH)
  (cd /tmp && python3 -c "import mlx_rmsnorm as m; assert m.has_cuda_kernels(), 'built without kernels'; \
print('extension OK: CUDA kernels, GPU family', m.gpu_family())") || return 1
  built=1
}
# The standalone kernels and tuners (cuda/, no MLX), in build/cuda.
cli_built=""
ensure_cli() {
  [ -n "$cli_built" ] && return 0
  cmake -S cuda -B build/cuda -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build/cuda >/dev/null \
    || { echo "standalone build failed"; return 1; }
  cli_built=1
}
# bench LOG LIMIT ARGS...: one run of the benchmark, its table in OUT/LOG
bench() {
  local log=$1 limit=$2; shift 2
  ensure_built || return 1
  (cd /tmp && timeout "$(cap "$limit")" python3 -m mlx_rmsnorm.bench "$@" --out "$OUT/bench" 2>&1) \
    | grep -v "cases:\|case " | tee "$OUT/$log" | tail -40
  return "${PIPESTATUS[0]}"
}
# pytest_run LOG LIMIT ARGS...: from /tmp (the installed package, not the folder);
# SIGINT at the limit, so that pytest still prints its summary line
pytest_run() {
  local log=$1 limit=$2; shift 2
  ensure_built || return 1
  (cd /tmp && MLX_RMSNORM_HYPOTHESIS_PROFILE=gpu timeout -s INT "$(cap "$limit")" \
     python3 -m pytest -q -p no:cacheprovider -rfE "$@" 2>&1) | tee "$OUT/$log" | tail -15
  return "${PIPESTATUS[0]}"
}
test_paths() { local p; for p in ${TESTS:-tests}; do echo "$ROOT/$p"; done; }

#:: Build and tools
#: the extension for MLX_RMSNORM_CUDA_ARCHS (default 90; "default": every architecture of cuda/CMakeLists.txt, ~2.5 min instead of ~40 s)
run_build() { ensure_built; }

#: standalone kernels (cuda/, no MLX): rmsnorm_backward at three shapes
run_cli() {
  ensure_cli || return 1
  local shape rc=0
  for shape in "8192 16384" "128 262144" "2880 16384"; do
    ./build/cuda/rmsnorm_backward $shape 30 || rc=1
  done 2>&1 | tee "$OUT/cli.log"
  return $rc
}

#: the backward and forward tuners (cuda/cli)
run_tune() {
  ensure_cli || return 1
  { ./build/cuda/tune_backward 30 && echo && ./build/cuda/tune_forward 30; } 2>&1 | tee "$OUT/tune.log"
  return "${PIPESTATUS[0]}"
}

#: a kernel change against a base revision, each tuner alone, interleaved (lab.tuner_ab; first, here: python -m lab.tuner_ab pack BASE, then carry results/tuner-ab; TUNER_AB_ARGS e.g. "--n 65536 --rounds 3")
run_tune_ab() {
  timeout "$(cap 300)" python3 -m lab.tuner_ab run --dir "$ROOT/results/tuner-ab" --log "$OUT/tune-ab-runs.log" \
    ${TUNER_AB_ARGS:-} 2>&1 | tee "$OUT/tune-ab.txt"
  return "${PIPESTATUS[0]}"
}

# Modules that run on the default device (the GPU there) instead of through
# the `device` fixture carry no gpu marker: the tests step runs them too.
DEFAULT_DEVICE_TESTS="test_fuse.py test_fuse_safety.py test_fuse_contract.py test_patch.py test_wrappers.py
  test_report.py test_routing.py test_main_job.py test_mlx_lm.py test_export.py test_architectures.py
  test_suite_safety.py"
#:: Tests
#: GPU-marked tests, not bigmem (xdist by group), then the modules that run on the default device (fuse, patch); TESTS=paths: those paths' GPU tests only; TESTS_K=expr: those pytest -k selects
run_tests() {
  local f rc=0
  pytest_run tests.log 300 $XDIST -m "gpu and not bigmem" ${TESTS_K:+-k "$TESTS_K"} $(test_paths) || rc=1
  if [ -z "${TESTS:-}" ]; then
    run_tests_default || rc=1
  fi
  return $rc
}
#: the modules that run on the default device alone (the second half of tests)
run_tests_default() {
  local f
  pytest_run tests-default-device.log 300 $XDIST -m "not bigmem" \
    $(for f in $DEFAULT_DEVICE_TESTS; do echo "$ROOT/tests/$f"; done)
}
#: the whole suite, not bigmem (what CI runs, plus the GPU tests)
run_suite() { pytest_run suite.log 500 $XDIST -m "not bigmem" $(test_paths); }
#: the bigmem tests, alone on the GPU
run_bigmem() { pytest_run bigmem.log 300 -m bigmem $(test_paths); }

#: compute-sanitizer over lab/sanitize_cases.py, all four ops (SANITIZE_TOOLS, SANITIZE_TIMEOUT, RACECHECK_ARGS, SYNCCHECK_ARGS; racecheck of the four ops took 60 s to N = 1025 on an H100: give it a call of its own, or --ops there)
run_sanitize() {
  ensure_built || return 1
  local tool start args rc
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}; do
    start=$SECONDS
    # racecheck tracks every shared-memory access: it gets the smaller set
    args=""; [ "$tool" = racecheck ] && args="${RACECHECK_ARGS:---max-n 16392 --long-rows 64}"
    # synccheck stops the process ("an illegal memory access") past one SM's
    # rows (N = 16392, where cluster rows begin), which memcheck and the GPU
    # tests run clean (docs/NOTES.md, Accuracy and correctness): it gets the
    # rows up to N = 16384, all of which it ran without a report
    [ "$tool" = synccheck ] && args="${SYNCCHECK_ARGS:---max-n 16384}"
    # (on a time-out, the last lines say which N it had reached)
    timeout "$(cap "${SANITIZE_TIMEOUT:-170}")" compute-sanitizer --tool "$tool" --print-limit 20 \
      --error-exitcode 1 python3 -m lab.sanitize_cases $args 2>&1 | tail -4 | sed "s/^/[$tool] /"
    rc=${PIPESTATUS[0]}
    [ "$rc" = 124 ] && echo "[$tool] TIMED OUT: not every case ran"
    echo "[$tool] $((SECONDS - start)) s (limit ${SANITIZE_TIMEOUT:-170} s), exit $rc"
  done | tee "$OUT/sanitize.log"
  ! grep -q "exit [1-9]" "$OUT/sanitize.log"
}

#: lab/memory_check.py: active memory flat over 10000 steps
run_memory() {
  ensure_built || return 1
  timeout "$(cap 300)" python3 -m lab.memory_check --steps 10000 2>&1 | tee "$OUT/memory.log" | tail -6
  return "${PIPESTATUS[0]}"
}

#: every mlx-lm architecture under the built-in, patch(), patch(fuse=True) (python -m lab.sweep; SWEEP_ARGS e.g. "--models llama,gpt2", SWEEP_JOBS processes, default 8, SWEEP_LIMIT s, default 400)
run_sweep() {
  ensure_built || return 1
  timeout -s INT -k 20 "$(cap "${SWEEP_LIMIT:-400}")" python3 -m lab.sweep --out "$OUT/sweep" --no-progress --jobs "${SWEEP_JOBS:-8}" ${SWEEP_ARGS:-} 2>&1 \
    | tee "$OUT/sweep.log" | tail -30
  return "${PIPESTATUS[0]}"
}

#:: Training and generation
#: examples/train.py (the main job)
run_train() {
  ensure_built || return 1
  timeout "$(cap 200)" python3 examples/train.py 2>&1 | tee "$OUT/train.log" | tail -25
  return "${PIPESTATUS[0]}"
}

#: examples/train_transformer.py (TRANSFORMER_PRECISIONS)
run_transformer() {
  ensure_built || return 1
  local precision rc=0
  : >"$OUT/transformer.log"
  for precision in ${TRANSFORMER_PRECISIONS:-float32 mixed bfloat16}; do
    timeout "$(cap 200)" python3 examples/train_transformer.py --precision "$precision" >>"$OUT/transformer.log" 2>&1 || rc=1
    if [ "$precision" = float32 ]; then
      # again with exact fp32 matmuls (no TF32): the fp32-level check
      MLX_ENABLE_TF32=0 timeout "$(cap 200)" python3 examples/train_transformer.py --precision float32 \
        >>"$OUT/transformer.log" 2>&1 || rc=1
    fi
  done
  grep -E "^device:|ms/step|agree|gradients" "$OUT/transformer.log"
  return $rc
}

#: training steps of the mlx-lm shapes (examples/bench_train_step.py; TRAINSTEP_ARGS)
run_trainstep() {
  ensure_built || return 1
  # built-in, patch(), patch(fuse=True); TRAINSTEP_ARGS adds e.g. --decode 32
  { timeout "$(cap 200)" python3 examples/bench_train_step.py --rounds 5 --model qwen3-0.6b,llama-8b-slice \
      --json "$OUT/train_step.json" ${TRAINSTEP_ARGS:-} 2>&1
    timeout "$(cap 100)" python3 examples/bench_train_step.py --rounds 3 --model gpt2-medium --norms trained \
      ${TRAINSTEP_ARGS:-} 2>&1; } | grep -v "round/s" | tee "$OUT/train-step.log" | grep -A8 "^model"
  return "${PIPESTATUS[0]}"
}

#: the generation benchmark (bench --generate)
run_generate() { bench generate.log 200 --generate; }
#: prefill at 128 and 512 tokens (the generation benchmark, 16 tokens; PREFILL_PROMPTS, e.g. "128 512 2048" or 128,512,2048)
run_prefill() {
  ensure_built || return 1
  local prompt rc=0 prompts="${PREFILL_PROMPTS:-128 512}"
  # "128 512 2048" or "128,512,2048"
  for prompt in ${prompts//,/ }; do
    (cd /tmp && timeout "$(cap 120)" python3 -m mlx_rmsnorm.bench.generation --prompt "$prompt" \
       --tokens 16 --rounds 9 --out "$OUT/bench-prefill$prompt" 2>&1) \
      | tee "$OUT/prefill-$prompt.log" | grep -E "^model|prefill|decode"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  done
  return $rc
}
#:: Benchmark
#: the whole benchmark
run_bench() { bench bench.log 500; }
#: its training and decode sections
run_bench_training() { bench bench-training.log 150 --sections training,decode --repeats 15 --singles 5; }
#: the nine big shapes
run_bench_table() { bench bench-table.log 120 --sections table --repeats 5; }
#: the fused add + norm section (with the Gemma accuracy figures)
run_bench_fused() { bench bench-fused.log 120 --fused --repeats 5; }
#: the LayerNorm sections
run_bench_ln() { bench bench-ln.log 150 --sections ln_training,ln_table --repeats 5; }
#: the LayerNorm sections with chained calls (bench --chain)
run_bench_ln_chain() { bench bench-ln-chain.log 150 --sections ln_training,ln_table --repeats 5 --chain; }
#: variants of plan rows through MLX: the tree and each of AB_PATCHES (patch files, -p1) built side by side in /tmp, then AB_SECTIONS (default ln_training) at AB_SHAPES, chained twice and side by side once, the builds interleaved (one log a build, mode and round under OUT/ab)
run_bench_ab() {
  local v dir mode r extra names=(tree) t=$SECONDS
  local -A patch_of=()
  for v in ${AB_PATCHES:-}; do
    names+=("$(basename "$v" .patch)") && patch_of[${names[-1]}]=$(realpath "$v")
  done
  [ ${#names[@]} -gt 1 ] || { echo "AB_PATCHES: no patch files"; return 1; }
  for v in "${names[@]}"; do
    dir=/tmp/ab-$v && rm -rf "$dir" && mkdir -p "$dir"
    git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C "$dir"
    [ "$v" = tree ] || (cd "$dir" && patch -s -p1 <"${patch_of[$v]}") || return 1
    # the builds run at once and share the cores (three: ~5 min on 16 cores)
    (cd "$dir" && CMAKE_BUILD_PARALLEL_LEVEL=$(( $(nproc) / ${#names[@]} + 1 )) timeout "$(cap 420)" \
       python3 -m pip install -q --no-build-isolation --no-deps -e . >"/tmp/ab-build-$v.log" 2>&1 \
       || { echo "build of $v failed"; tail -20 "/tmp/ab-build-$v.log"; }) &
  done
  wait
  echo "built in $((SECONDS - t)) s"
  mkdir -p "$OUT/ab"
  for mode in chain plain; do
    for r in $([ $mode = chain ] && echo 1 2 || echo 1); do
      for v in "${names[@]}"; do
        dir=/tmp/ab-$v
        ls "$dir"/mlx_rmsnorm/_ext.*.so >/dev/null 2>&1 || continue
        extra=$([ $mode = chain ] && echo --chain)
        (cd "$dir" && PYTHONPATH="$dir" timeout "$(cap 120)" python3 -m mlx_rmsnorm.bench \
           --sections "${AB_SECTIONS:-ln_training}" --shapes "${AB_SHAPES:-8192x2048,8192x4096}" \
           --repeats 5 --singles 1 $extra --out "/tmp/ab-out-$v" 2>&1) \
          | grep -v "cases:\|case " >"$OUT/ab/$v-$mode-$r.log"
        echo "$v $mode $r ($((SECONDS - t)) s)"
      done
    done
  done
  python3 -m lab.bench_ab "$OUT/ab" | tee "$OUT/ab.txt"
}
#: QuACK and torch's copy at the long-row shapes on this GPU (lab.peers; PEERS_PARTS: the folders of lab.peers_wheels pack, or PEERS_WHEELS: a folder of wheels, to install first), for bench-large-n's ratios
run_peers() {
  local wheels=${PEERS_WHEELS:-}
  if [ -n "${PEERS_PARTS:-}" ]; then
    wheels=/tmp/peers-wheels
    # shellcheck disable=SC2086
    python3 -m lab.peers_wheels unpack $PEERS_PARTS --into "$wheels" || return 1
  fi
  if [ -n "$wheels" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile "$wheels"/*.whl || return 1
  fi
  timeout "$(cap 300)" python3 -m lab.peers --out "$OUT/peers.json" ${PEERS_ARGS:-} 2>&1 | tee "$OUT/peers.log"
  return "${PIPESTATUS[0]}"
}
# --peers where the peers step ran before in this run (QuACK of this GPU)
peers_arg() { [ -f "$OUT/peers.json" ] && echo "--peers $OUT/peers.json"; }
#: long rows (N 16384-262144): every op and direction against the copy ceiling and the built-in, QuACK's figures beside
run_bench_large_n() { bench large-n.log 150 --large-n --repeats 7 $(peers_arg); }
#: the same with each call of an eval taking the previous call's output (no overlap of calls, as in a model)
run_bench_large_n_chain() { bench large-n-chain.log 150 --large-n --repeats 7 --chain $(peers_arg); }

# the RMSNorm kernels' GPU tests, which the fused add and LayerNorm share code with
rms_gpu_tests() {
  pytest_run "$1" 150 $XDIST -m "gpu and not bigmem" "$ROOT/tests/test_gpu.py" "$ROOT/tests/test_rms_norm.py"
}

#:: One op's whole check (after a change to it)
#: the fused add: its tests, bench-fused, training steps and decode of the Qwen3/Llama shapes under patch(fuse=True), the RMSNorm GPU tests
run_fused() {
  local rc=0
  pytest_run tests-fused.log 150 $XDIST --maxfail=10 -k "add or fuse" \
    "$ROOT/tests/test_rms_norm.py" "$ROOT/tests/test_fuse.py" || rc=1
  bench bench-fused.log 120 --fused --repeats 5 --calls 20 --singles 1 || rc=1
  timeout "$(cap 150)" python3 examples/bench_train_step.py --model qwen3-0.6b,llama-8b-slice --norms trained \
    --rounds 5 --steps-per-round 4 --decode 32 --norm-reps 3 2>&1 | tee "$OUT/train-fused.log" | tail -14
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  rms_gpu_tests tests-rms.log || rc=1
  return $rc
}

#: LayerNorm: its tests, add_layer_norm's tests, bench-ln, bench --fused and the gpt2-medium training step, the RMSNorm GPU tests
run_layernorm() {
  local rc=0
  pytest_run tests-ln.log 150 $XDIST --maxfail=10 "$ROOT/tests/test_layer_norm.py" || rc=1
  pytest_run tests-add-ln.log 150 $XDIST --maxfail=10 -m gpu "$ROOT/tests/test_fuse.py" || rc=1
  bench bench-ln.log 150 --sections ln_training,ln_table --repeats 5 || rc=1
  bench bench-fused-ln.log 120 --fused --repeats 5 --calls 20 --singles 1 || rc=1
  timeout "$(cap 150)" python3 examples/bench_train_step.py --model gpt2-medium \
    --norms trained --rounds 4 --steps-per-round 4 2>&1 | tee "$OUT/train-ln.log" | tail -6
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  rms_gpu_tests tests-rms.log || rc=1
  return $rc
}

#:: Kernels and the fixed cost of a call
#: kernels alone under Nsight Compute: the seed shape and training shapes (lab/profile_training.py)
run_ncu() {
  ensure_built || return 1
  PROFILE_SHAPES=16384x8192,4096x896,8192x1024,32768x5120 timeout "$(cap 150)" ncu --clock-control none --csv \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    python3 -m lab.profile_training >/tmp/ncu.csv 2>/dev/null
  python3 -m lab.profile_training --report /tmp/ncu.csv 2>&1 | tee "$OUT/ncu-training.txt"
  return "${PIPESTATUS[0]}"
}

# ncu_sections LIMIT SECTIONS KERNEL-REGEX SKIP COUNT COMMAND...: Nsight
# Compute's sections of COUNT matching kernels after SKIP of them, at most
# LIMIT seconds (and never past the budget), ncu's own chatter dropped
ncu_sections() {
  local limit=$1 sections=$2 kernels=$3 skip=$4 count=$5
  shift 5
  timeout "$(cap "$limit")" ncu --clock-control none $sections -k regex:"$kernels" --launch-skip "$skip" \
    --launch-count "$count" "$@" 2>&1 | grep -v "^==PROF==" | grep -vi "^  *-\+ *$"
}

# ncu_long_rows DIRECTION KERNEL-REGEX CASES...: each case m:n:op through MLX
# (lab.profile_case, three calls), every matching kernel's Nsight Compute
# time and DRAM bytes, into $OUT/ncu-DIRECTION.txt
ncu_long_rows() {
  ensure_built || return 1
  local dir=$1 kernels=$2 case m n op
  shift 2
  for case in "$@"; do
    IFS=: read -r m n op <<<"$case"
    echo "##### $dir ours ${m}x$n $op"
    ncu_sections 60 "--metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum" \
      "$kernels" 0 6 python3 -m lab.profile_case "$dir" ours "$m" "$n" "$op"
  done 2>&1 | tee "$OUT/ncu-$dir.txt"
}

#: the forwards of the fused adds and LayerNorm at long rows, kernel by kernel (Nsight Compute time and DRAM bytes; NCU_FWD_CASES m:n:op)
run_ncu_fwd() {
  # shellcheck disable=SC2086
  ncu_long_rows fwd "fwd_rows|fwd_looped" \
    ${NCU_FWD_CASES:-4096:24576:add_layer 4096:24576:layer 512:262144:add_layer 512:262144:layer 512:262144:add_rms}
}

#: the backwards at long rows through MLX, kernel by kernel (Nsight Compute time and DRAM bytes; NCU_BWD_CASES m:n:op)
run_ncu_bwd() {
  # shellcheck disable=SC2086
  ncu_long_rows bwd "bwd_|colsum" \
    ${NCU_BWD_CASES:-4096:32768:layer 2048:65536:layer 512:262144:layer 4096:32768:rms 2048:65536:rms 512:262144:rms}
}

#: Nsight Compute sections of the persistent backward (standalone) and of both forwards through MLX (PROFILE_MLX_ONLY)
run_profile() {
  ensure_cli || return 1
  # Nsight Compute on the persistent backward (the table's plan) at the
  # benchmark shapes, and on the built-in's kernels for comparison.
  local sections="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis"
  local shape case
  : >"$OUT/profile.log"
  [ -n "${PROFILE_MLX_ONLY:-}" ] ||
  for shape in "8192 16384" "8192 4096" "4096 16384" "2048 32768" "128 262144" "2880 16384" "16384 8192"; do
    echo "##### rmsnorm_backward $shape"
    ncu_sections 120 "$sections" bwd_persistent 1 1 ./build/cuda/rmsnorm_backward $shape 2
  done >>"$OUT/profile.log" 2>&1
  # Through MLX: the built-in's backward, and both forwards where ours trails the built-in.
  if ensure_built; then
    for case in "bwd builtin 16384 8192 rms_norm" "fwd ours 32768 2048 fwd_rows" \
                "fwd builtin 32768 2048 rms_norm" "fwd ours 16384 8192 fwd_rows" \
                "fwd builtin 16384 8192 rms_norm"; do
      set -- $case
      echo "##### $1 $2 $3x$4"
      ncu_sections 120 "$sections" "$5" 1 1 python3 -m lab.profile_case $1 $2 $3 $4
    done >>"$OUT/profile.log" 2>&1
  fi
  grep -E "^#####|bwd_persistent|fwd_rows|rms_norm|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Memory Throughput|Stall|Warp Cycles Per Issued" "$OUT/profile.log" | head -150
}

#: Nsight Compute sections of LayerNorm's kernels beside our RMSNorm's at the same shapes, through MLX (PROFILE_LN_CASES)
run_profile_ln() {
  ensure_built || return 1
  local sections="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats"
  local case
  : >"$OUT/profile-ln.log"
  for case in ${PROFILE_LN_CASES:-fwd:32768:1280 fwd:16384:2048 fwd:16384:8192 bwd:8192:2048 bwd:4096:8192}; do
    IFS=: read -r dir m n <<<"$case"
    # the second and third call's kernels (the first warms up): forward, or
    # the backward's walk and column sum
    local kernels="fwd_rows" skip=1 count=2
    [ "$dir" = bwd ] && kernels="bwd_|colsum" skip=2 count=2
    for op in layer rms; do
      echo "##### $op $dir ${m}x$n"
      ncu_sections 60 "$sections" "$kernels" $skip $count python3 -m lab.profile_case "$dir" ours "$m" "$n" "$op"
    done
  done >>"$OUT/profile-ln.log" 2>&1
  grep -E "^#####|fwd_rows|bwd_|colsum|Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit Registers|Warp Cycles Per Issued|Stall" \
    "$OUT/profile-ln.log" | head -200
}

#: the forward's read of w and b as x (w alone without b) against its general read (fp32 w and b) at long rows (lab/weight_reads.py)
run_weight_reads() {
  ensure_built || return 1
  timeout "$(cap 150)" python3 -m lab.weight_reads 2>&1 | tee "$OUT/weight-reads.txt"
  return "${PIPESTATUS[0]}"
}
#: decode-step forwards under ncu (lab/decode_kernels.py)
run_decode() {
  ensure_built || return 1
  timeout "$(cap 150)" python3 -m lab.decode_kernels 2>&1 | tee "$OUT/decode-kernels.txt"
  return "${PIPESTATUS[0]}"
}

# cuda_calls LIMIT FILE ARGS...: lab/cuda_calls.py into $OUT/FILE, its
# scenario lines shown; a failed run's last lines too
cuda_calls() {
  local limit=$1 file=$2
  shift 2
  timeout "$(cap "$limit")" python3 -m lab.cuda_calls --out "$OUT/$file" "$@" 2>&1 \
    | tee /tmp/calls.log | grep "^##"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || tail -15 /tmp/calls.log
  return "$rc"
}

#: CUDA calls and kernel GPU time per eval (lab/cuda_calls.py), and at decode patch() against patch(fuse=True) (CALLS_FUSE_ONLY=1: that only; CALLS_SCENARIOS=a,b: those only, into cuda-calls-scenarios.txt)
run_calls() {
  ensure_built || return 1
  # e.g. CALLS_SCENARIOS=trainstep-llama8b-frozen,prefill128-llama3-8b,prefill128-qwen3-0.6b, the
  # timelines of the end-to-end rows slower under the plugin (python3 -m lab.cuda_calls --help)
  # (CALLS_ARGS: more options, e.g. "--kernel-width 200" for whole kernel names)
  [ -z "${CALLS_SCENARIOS:-}" ] || { cuda_calls 200 cuda-calls-scenarios.txt --scenarios "$CALLS_SCENARIOS" ${CALLS_ARGS:-}; return; }
  local rc=0
  [ -n "${CALLS_FUSE_ONLY:-}" ] || cuda_calls 200 cuda-calls.txt --scenarios \
    fwd1-1x1024,bwd1-8192x2048,bwd20-8192x1024,bwd20-8192x768,lnbwd20-8192x768,decode-qwen3-0.6b,decode-llama-3-8b,train-qwen3-0.6b,train-llama-8b-slice-frozen \
    || rc=1
  # decode with the blocks' residual add fused, against patch() alone
  cuda_calls 120 cuda-calls-fuse.txt --contenders plugin,fuse --scenarios decode-qwen3-0.6b,decode-llama-3-8b || rc=1
  return $rc
}

HOST_ARGS=(--shapes 1x1x1024,1x1x16x128,1x1x4096 --calls 200 --repeats 10)
#: host cost per call at decode shapes and of a decode step's graph with and without fuse (python -m lab.host_cost calls, step)
run_host() {
  ensure_built || return 1
  timeout "$(cap 60)" python3 -m lab.host_cost calls "${HOST_ARGS[@]}" 2>&1 \
    | tee "$OUT/host-overhead.txt" | grep -E "calls per eval|^fwd|^bwd|^add|^fused"
  local rc=${PIPESTATUS[0]}
  timeout "$(cap 90)" python3 -m lab.host_cost step 2>&1 | tee "$OUT/fuse-host-cost.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  return $rc
}

#: host cost and generation, this build against one with nanobind's -Os (no NOMINSIZE), alternating processes
run_minsize() {
  ensure_built || return 1
  # The same tree with nanobind's default -Os over the whole module, built
  # into /tmp/ext-Os (a copy of the tree, not an editable install).
  rm -rf /tmp/src-Os /tmp/ext-Os && cp -r "$ROOT" /tmp/src-Os && rm -rf /tmp/src-Os/build
  sed -i 's/ NOMINSIZE//' /tmp/src-Os/CMakeLists.txt
  (cd /tmp/src-Os && CMAKE_BUILD_PARALLEL_LEVEL=16 timeout "$(cap 300)" python3 -m pip install -q \
     --no-build-isolation --no-deps --target /tmp/ext-Os . >/tmp/build-Os.log 2>&1) \
    || { tail -40 /tmp/build-Os.log; return 1; }
  local rep v path
  for rep in 1 2; do
    for v in Os O3; do
      path=""; [ "$v" = Os ] && path=/tmp/ext-Os
      echo "--- build $v, pass $rep"
      (cd /tmp && PYTHONPATH="$path" timeout 60 python3 "$ROOT/lab/host_cost.py" calls "${HOST_ARGS[@]}")
    done
  done 2>&1 | tee "$OUT/host-overhead-Os-vs-O3.log" | grep -E "^---|^fwd|^bwd|^x \+|calls per eval"
  for v in Os O3; do
    path=""; [ "$v" = Os ] && path=/tmp/ext-Os
    echo "--- build $v"
    (cd /tmp && PYTHONPATH="$path" timeout "$(cap 120)" python3 -m mlx_rmsnorm.bench --generate \
       --out "/tmp/bench-$v" 2>&1 | grep -v "generate:")
  done 2>&1 | tee "$OUT/generate-Os-vs-O3.log" | grep -E "^---|decode|prefill"
}

#:: Other GPU families on this GPU (rebuild the extension: run them last)
#: PTX-only builds for compute_80 and compute_75: GPU tests, bench table
run_ptx() {
  # Other GPU families on this GPU: PTX-only builds for compute_80 and
  # compute_75, JIT-compiled by the driver, run those families' paths and
  # plans (gpu_family() must say so). The editable build is left at 75: a
  # later step in the same run rebuilds it.
  local fam rc=0
  for fam in 80 75; do
    step "PTX build compute_$fam"
    MLX_RMSNORM_CUDA_ARCHS=${fam}-virtual CMAKE_BUILD_PARALLEL_LEVEL=16 timeout "$(cap 300)" python3 -m pip install \
      --no-build-isolation --no-deps -e . >/tmp/build$fam.log 2>&1 || { tail -20 /tmp/build$fam.log; rc=1; continue; }
    (cd /tmp && MLX_RMSNORM_EXPECT_FAMILY=$fam MLX_RMSNORM_HYPOTHESIS_PROFILE=gpu timeout -s INT "$(cap 200)" \
       python3 -m pytest -q -p no:cacheprovider -rfE $XDIST -m "gpu and not bigmem" "$ROOT/tests" 2>&1) \
      | tee "$OUT/tests$fam.log" | tail -3
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
    (cd /tmp && timeout "$(cap 120)" python3 -m mlx_rmsnorm.bench --sections table --repeats 3 --out "$OUT/b$fam" \
       2>/dev/null >"$OUT/bench$fam.log") || rc=1
  done
  built=""
  return $rc
}

#: an 80-real build on this GPU: the error users get (lab/mismatch_check.py)
run_mismatch() {
  # An 80-real build (no code for this GPU): every entry point must raise the
  # error that names the GPU and the rebuild command.
  rm -rf /tmp/arch80 /tmp/t80 && cp -r . /tmp/arch80 && rm -rf /tmp/arch80/build
  (cd /tmp/arch80 && MLX_RMSNORM_CUDA_ARCHS=80-real timeout "$(cap 300)" python3 -m pip install \
     --no-build-isolation --no-deps --target /tmp/t80 . >/tmp/build80.log 2>&1) || { tail -20 /tmp/build80.log; return 1; }
  # (from /tmp: the repo root on sys.path would import the editable build)
  (cd /tmp && PYTHONPATH=/tmp/t80 python3 "$ROOT/lab/mismatch_check.py") 2>&1 | tee "$OUT/mismatch.log"
  return "${PIPESTATUS[0]}"
}

for s in "${STEPS[@]}"; do
  step "$s"
  if (( SECONDS - t0 >= BUDGET - 5 )); then
    echo "skipped: the budget of $BUDGET s is spent"; failed+=("$s(skipped)"); continue
  fi
  "run_${s//-/_}" || failed+=("$s")
done
echo
if [ -n "${PACK:-}" ]; then
  tar czf "$PACK" -C "$OUT" --exclude='*.png' --exclude='*.json' --exclude='*.csv' . \
    && echo "logs of $OUT in $PACK" || failed+=("pack")
fi
if [ ${#failed[@]} -eq 0 ]; then
  echo "=== done in $((SECONDS - t0)) s: ${STEPS[*]}: all passed"
else
  echo "=== done in $((SECONDS - t0)) s: failed: ${failed[*]}"
  exit 1
fi
