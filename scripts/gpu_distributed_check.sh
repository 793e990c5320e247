#!/usr/bin/env bash
# Data-parallel check, run by hand on a GPU machine with 2+ GPUs (one GPU: the
# 2-GPU parts are skipped), from the repo root, in a run that carries .device
# (see scripts/gpu_run.sh):
#
#   bash scripts/gpu_distributed_check.sh
#
# 1. Sets up MLX CUDA (source .device/setup.sh) and builds the extension,
#    unless both are already there (FORCE_BUILD=1 rebuilds).
# 2. Gradient determinism probe on one GPU: which first-step gradients differ
#    bitwise between evaluations (built-in and plugin; MLX's embedding
#    scatter-add and the GEMM variant).
# 3. With 2+ GPUs: tests/test_distributed.py with NCCL on 2 GPUs (ranks and
#    reruns bitwise identical, loss curve vs one process on the full batch,
#    patched vs built-in).
# 4. Tokens/s of the Qwen3-0.6B-shaped model (bf16, BATCH x SEQ tokens per GPU,
#    AdamW) on 1 GPU and, with 2+ GPUs, on 2 (mlx.launch --backend nccl),
#    built-in vs plugin; a table with the scaling efficiency.
# Env: OUT (logs; default results/distributed), STEPS (12), WARMUP (4),
#      BATCH (4), SEQ (2048), FORCE_BUILD.
# On a 1-GPU machine steps 3 and the 2-GPU column of 4 are skipped and said so.
set -uo pipefail
ROOT="$PWD"
OUT="${OUT:-$ROOT/results/distributed}"
mkdir -p "$OUT"
STEPS="${STEPS:-12}"
WARMUP="${WARMUP:-4}"
BATCH="${BATCH:-4}"
SEQ="${SEQ:-2048}"
export NCCL_NVLS_ENABLE=0  # mandatory on these machines (NVLink multicast off)
export PYTHONUNBUFFERED=1
status=0
step() { echo; echo "=== $1 ($(date +%T))"; }
log() { tee -a "$OUT/summary.txt"; }
: >"$OUT/summary.txt"

step setup
ready() { python3 -c "import mlx.core as mx, mlx_rmsnorm as m; assert mx.cuda.is_available() and m.has_cuda_kernels()" 2>/dev/null; }
if [ -n "${FORCE_BUILD:-}" ] || ! ready; then
  if ! python3 -c "import mlx.core as mx; assert mx.cuda.is_available()" 2>/dev/null; then
    source .device/setup.sh || exit 1
  fi
  python3 -m pip install --no-build-isolation --no-deps -v -e . >/tmp/build.log 2>&1 \
    || { cp /tmp/build.log "$OUT/"; tail -40 /tmp/build.log; exit 1; }
fi
ready || { echo "MLX CUDA or the plugin's CUDA kernels missing"; exit 1; }
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | log
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, '| NCCL backend available:', mx.distributed.is_available('nccl'))" | log
echo "GPUs: $NGPU" | log

# mlx.launch, or its entry point where the script is not on PATH (an array:
# timeout runs commands, not shell functions)
if command -v mlx.launch >/dev/null; then
  LAUNCH=(mlx.launch)
else
  LAUNCH=(python3 -c "import sys; from mlx._distributed_utils.launch import main; sys.argv[0] = 'mlx.launch'; sys.exit(main())")
fi
EX=examples/train_distributed.py
TINY="--device gpu --dims 64 --layers 2 --heads 4 --vocab 128 --seq 32 --batch 4 --steps 2 --precision float32"

step "gradient determinism, one GPU (float32, TF32 off; 3 evaluations of the same step)"
: >"$OUT/determinism.log"
for variant in "" "--gemm-embedding-grad"; do  # (no pipe around the loop: status must survive)
  for norm in "--builtin" ""; do
    echo "# ${norm:-plugin} ${variant:-(MLX embedding scatter-add)}" >>"$OUT/determinism.log"
    MLX_ENABLE_TF32=0 CUDA_VISIBLE_DEVICES=0 timeout 120 python3 $EX $TINY $norm $variant \
      --check-grad-determinism >/tmp/determinism-run.log 2>&1
    grep -E "reproducible|Error" /tmp/determinism-run.log >>"$OUT/determinism.log" \
      || { tail -5 /tmp/determinism-run.log >>"$OUT/determinism.log"; status=1; }
  done
done
log <"$OUT/determinism.log"

step "checks with NCCL on 2 GPUs (tests/test_distributed.py)"
if [ "$NGPU" -ge 2 ]; then
  MLX_RMSNORM_DIST_BACKEND=nccl MLX_RMSNORM_DIST_DEVICE=gpu timeout 300 \
    python3 -m pytest -v -p no:cacheprovider -rs tests/test_distributed.py 2>&1 | tee "$OUT/nccl-checks.log" | tail -25
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "# again with the step uncompiled, to tell whether mx.compile is the cause"
    MLX_RMSNORM_DIST_ARGS=--no-compile MLX_RMSNORM_DIST_BACKEND=nccl MLX_RMSNORM_DIST_DEVICE=gpu timeout 300 \
      python3 -m pytest -q -p no:cacheprovider -rs tests/test_distributed.py 2>&1 | tee "$OUT/nccl-checks-no-compile.log" | tail -8
    echo "NCCL checks uncompiled: $(tail -1 "$OUT/nccl-checks-no-compile.log")" | log
  fi
  echo "NCCL checks (2 GPUs), pytest rc $rc: $(tail -1 "$OUT/nccl-checks.log")" | log
  # one run's loss table and digests for the note
  MLX_ENABLE_TF32=0 timeout 120 "${LAUNCH[@]}" -n 2 --backend nccl -- python3 $EX ${TINY/--steps 2/--steps 8} --backend nccl \
    --optimizer sgd --lr 0.05 --gemm-embedding-grad --compare --digest 2>&1 </dev/null | tee "$OUT/nccl-compare.log" | tail -16
else
  echo "SKIPPED: $NGPU GPU(s) here; the NCCL checks need 2 (nvidia-h200-x2)" | log
fi

step "tokens/s, Qwen3-0.6B shape (bf16, $BATCH x $SEQ tokens per GPU, $STEPS steps, first $WARMUP left out)"
BIG="--model qwen3-0.6b --precision bfloat16 --device gpu --batch $BATCH --seq $SEQ --steps $STEPS --warmup $WARMUP --lr 1e-4 --print-every 4"
for norm in builtin plugin; do
  flag=$([ $norm = builtin ] && echo --builtin)
  echo "# 1 GPU, $norm"
  CUDA_VISIBLE_DEVICES=0 timeout 240 python3 $EX $BIG $flag --json "$OUT/qwen3-1gpu-$norm.json" 2>&1 | tee "$OUT/qwen3-1gpu-$norm.log" | tail -3
  [ -f "$OUT/qwen3-1gpu-$norm.json" ] || { echo "1-GPU $norm run wrote no results"; status=1; }
  if [ "$NGPU" -ge 2 ]; then
    echo "# 2 GPUs (NCCL), $norm"
    timeout 240 "${LAUNCH[@]}" -n 2 --backend nccl -- python3 $EX $BIG $flag --backend nccl --digest \
      --json "$OUT/qwen3-2gpu-$norm-rank{rank}.json" 2>&1 </dev/null | tee "$OUT/qwen3-2gpu-$norm.log" | tail -4
    [ -f "$OUT/qwen3-2gpu-$norm-rank0.json" ] || { echo "2-GPU $norm run wrote no results"; status=1; }
  fi
done
[ "$NGPU" -ge 2 ] || echo "SKIPPED: the 2-GPU runs ($NGPU GPU(s) here)" | log

python3 - "$OUT" <<'EOF' | log
import json, os, sys
out = sys.argv[1]
def load(name):
    p = os.path.join(out, name)
    return json.load(open(p)) if os.path.exists(p) else None
rows = {(g, n): load(f"qwen3-{g}gpu-{n}.json" if g == 1 else f"qwen3-{g}gpu-{n}-rank0.json")
        for g in (1, 2) for n in ("builtin", "plugin")}
r = next((v for v in rows.values() if v), None)
if r is None:
    print("no Qwen3 run finished"); sys.exit(0)
print(f"\n{r['model']}, {r['precision']}, {r['batch']} x {r['seq']} tokens per GPU, AdamW, compiled step")
print(f"| RMSNorm | GPUs | ms/step | tokens/s | tokens/s per GPU | scaling efficiency | final loss |")
print("|---|---|---|---|---|---|---|")
for (g, n), v in rows.items():
    if v is None:
        print(f"| {n} | {g} | (not run) | | | | |"); continue
    one = rows[(1, n)]
    eff = f"{100 * v['tokens_per_s'] / (g * one['tokens_per_s']):.1f}%" if one and g > 1 else "-"
    print(f"| {n} | {g} | {v['step_ms']:.1f} | {v['tokens_per_s']:.0f} | "
          f"{v['tokens_per_s_per_rank']:.0f} | {eff} | {v['losses'][-1]:.4f} |")
for g in (1, 2):
    b, p = rows[(g, "builtin")], rows[(g, "plugin")]
    if b and p:
        print(f"plugin / built-in tokens/s on {g} GPU(s): {p['tokens_per_s'] / b['tokens_per_s']:.3f}")
for n in ("builtin", "plugin"):
    v = rows[(2, n)]
    if v and "ranks_identical" in v:
        print(f"2 GPUs, {n}: parameters bitwise identical on both ranks after {len(v['losses'])} steps: "
              f"{'yes' if v['ranks_identical'] else 'NO'}")
EOF

step done
echo "status $status (logs in $OUT)" | log
exit $status
