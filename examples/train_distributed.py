"""Data-parallel training with mx.distributed and the plugin: one process per
GPU (NCCL) or per CPU process (ring), every rank on its shard of every global
batch, gradients averaged with nn.average_gradients inside the compiled step.

    # 2 GPUs of one machine (NCCL; each rank sees its GPU as device 0)
    mlx.launch -n 2 --backend nccl -- python examples/train_distributed.py --model qwen3-0.6b
    # 2 local CPU processes (ring)
    mlx.launch -n 2 --backend ring -- python examples/train_distributed.py --device cpu
    # 1 process (world size 1: the same loop without communication)
    python examples/train_distributed.py

Models: `transformer` is examples/train_transformer.py's decoder (pre-norm and
QK-norm, nn.RMSNorm everywhere); `qwen3` is mlx-lm's Qwen3 with random weights
(flags set the shape; `qwen3-0.6b` presets Qwen3-0.6B's: hidden 1024, 28
layers, 16 heads / 8 KV heads of 128, FFN 3072, vocabulary 151936, QK-norm).

Data: global batch i is `--batch` x world-size sequences drawn from a seed
(examples/train_transformer.py's synthetic copy task), the same on every rank
and in every run; rank r trains on rows [r*batch, (r+1)*batch). Every rank
builds the model from the same seed, so all ranks start from the same bits.

The step averages the rank losses (all_sum / world) and the gradients
(nn.average_gradients: one all_sum of all gradients concatenated when they
share a dtype), then every rank applies the same update. Since the all-reduce
hands every rank the same bits and the update is deterministic, every rank
holds bit-identical parameters after every step. Every rerun does too where
every kernel of the step is deterministic: our RMSNorm backward is (no
atomics); MLX's embedding backward is a scatter-add that adds with atomics on
CUDA (--gemm-embedding-grad replaces it, for small vocabularies), and
--check-grad-determinism lists the gradients that vary between evaluations.

Flags: --builtin runs MLX's mx.fast.rms_norm instead of patch(); --compare
makes rank 0 train again, alone, on the full global batch from the same seeds
and print the largest loss difference; --digest prints (and --json writes) a
sha256 of every parameter's bytes, and checks across ranks that they agree;
--save-npz writes the final parameters; --json writes losses, timing and
digest per rank ("{rank}" in a path is replaced by the rank). For float32
comparisons on a GPU set MLX_ENABLE_TF32=0 (matmuls otherwise round their
inputs to TF32, and a different kernel for half the rows changes more than
the summation order).

The launcher (mlx.launch 0.32.4) exits 0 even when a rank fails: read the
output (or --json files) rather than its exit status.
"""

import argparse
import hashlib
import json
import os
import sys
import time
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_transformer  # noqa: E402  (the model, data and loss of the single-GPU example)

import mlx_rmsnorm  # noqa: E402

PRESETS = {
    # name: defaults of (dims, layers, heads, kv_heads, head_dim, ffn, vocab)
    "transformer": dict(dims=128, layers=2, heads=4, kv_heads=None, head_dim=None, ffn=None, vocab=512),
    "qwen3": dict(dims=128, layers=2, heads=4, kv_heads=2, head_dim=32, ffn=384, vocab=512),
    "qwen3-0.6b": dict(dims=1024, layers=28, heads=16, kv_heads=8, head_dim=128, ffn=3072, vocab=151936),
}


def make_model(args):
    """The model every rank (and the single-process reference) starts from."""
    if not args.model.startswith("qwen3"):
        return train_transformer.make_model(args)
    from mlx_lm.models import qwen3

    mx.random.seed(args.seed)
    model = qwen3.Model(qwen3.ModelArgs(
        model_type="qwen3", hidden_size=args.dims, num_hidden_layers=args.layers,
        intermediate_size=args.ffn, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.head_dim, rms_norm_eps=1e-6,
        vocab_size=args.vocab, max_position_embeddings=max(args.seq, 4096),
        rope_theta=1e6, tie_word_embeddings=True))
    train_transformer.set_precision(model, args.precision)
    return model


@mx.custom_function
def embedding_lookup(w, tokens):
    return w[tokens]


@embedding_lookup.vjp
def embedding_lookup_vjp(primals, cotangent, output):
    """The table's gradient as one-hot(tokens)^T @ cotangent, a GEMM: MLX's
    own vjp of the lookup is a scatter-add, which on CUDA adds the rows of
    repeated tokens with atomics, in an order that changes from run to run.
    Costs tokens x vocab memory: for small vocabularies only."""
    w, tokens = primals
    t = tokens.reshape(-1)
    onehot = (t[:, None] == mx.arange(w.shape[0], dtype=t.dtype)[None, :]).astype(cotangent.dtype)
    gw = onehot.T @ cotangent.reshape(t.size, w.shape[1])
    return gw.astype(w.dtype), mx.zeros_like(tokens)


class GemmGradEmbedding(nn.Embedding):
    def __call__(self, x):
        return embedding_lookup(self.weight, x)


def use_gemm_embedding_grad(model):
    """Swaps the token embedding for one whose backward has no atomics
    (same weight; as_linear, the tied output head, is unchanged)."""
    parent, name = (model.model, "embed_tokens") if hasattr(model, "model") else (model, "embed")
    old = getattr(parent, name)
    new = GemmGradEmbedding(*old.weight.shape)
    new.weight = old.weight
    setattr(parent, name, new)


def global_batch(args, step, world):
    """Global batch `step`: world x batch sequences of seq + 1 tokens, a
    function of the seed and the step only."""
    return train_transformer.make_tokens(world * args.batch, args.seq, args.vocab,
                                         (args.seed + 1) * 1_000_003 + step)


def make_optimizer(args):
    if args.optimizer == "sgd":
        return optim.SGD(learning_rate=args.lr)
    return optim.AdamW(learning_rate=args.lr)


def train(args, group, rows, world):
    """Trains `args.steps` steps on `rows` (a slice) of every global batch of
    `world * batch` rows; with a group of more than one rank the gradients
    and the loss are averaged over it. Returns (global losses, seconds per
    step, model)."""
    model = make_model(args)
    if args.gemm_embedding_grad:
        use_gemm_embedding_grad(model)
    opt = make_optimizer(args)
    mx.eval(model.parameters())
    state = [model.state, opt.state]
    distributed = group is not None and group.size() > 1

    def step(x, y):
        loss, grads = nn.value_and_grad(model, train_transformer.loss_fn)(model, x, y)
        if distributed:
            grads = nn.average_gradients(grads, group)
            loss = mx.distributed.all_sum(loss, group=group) / group.size()
        opt.update(model, grads)
        return loss

    if not args.no_compile:
        step = partial(mx.compile, inputs=state, outputs=state)(step)

    losses, times = [], []
    for i in range(args.steps):
        tokens = global_batch(args, i, world)[rows]
        x, y = tokens[:, :-1], tokens[:, 1:]
        mx.eval(x, y)
        t0 = time.perf_counter()
        loss = step(x, y)
        mx.eval(loss, state)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if args.verbose_rank and (i % args.print_every == 0 or i == args.steps - 1):
            print(f"step {i:4d}  loss {losses[-1]:.6f}  {1e3 * times[-1]:8.1f} ms", flush=True)
    return losses, times, model


def host_bytes(a):
    raw = a.view(mx.uint16) if a.dtype == mx.bfloat16 else a  # NumPy has no bfloat16
    return np.ascontiguousarray(np.array(raw)).tobytes()


def parameter_digest(model):
    """sha256 over every parameter's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name, p in sorted(tree_flatten(model.parameters()), key=lambda kv: kv[0]):
        h.update(f"{name}:{p.dtype}:{p.shape};".encode())
        h.update(host_bytes(p))
    return h.hexdigest()


def gradient_determinism(args, world, repeats=3):
    """(names of the parameters whose first-step gradient differs bitwise
    between evaluations of the same weights and shard, number of parameters).
    Where a rerun is not bit-identical this says which part of the model is
    to blame: kernels that add with atomics differ, ours must not."""
    model = make_model(args)
    if args.gemm_embedding_grad:
        use_gemm_embedding_grad(model)
    tokens = global_batch(args, 0, world)[: args.batch]
    x, y = tokens[:, :-1], tokens[:, 1:]
    grad = nn.value_and_grad(model, train_transformer.loss_fn)
    first, differ = None, set()
    for _ in range(repeats):
        g = dict(tree_flatten(grad(model, x, y)[1]))
        mx.eval(g)
        bits = {k: hashlib.sha256(host_bytes(v)).digest() for k, v in g.items()}
        first = first or bits
        differ |= {k for k in bits if bits[k] != first[k]}
    return sorted(differ), len(first)


def digests_agree(digest, group):
    """Whether every rank of `group` holds the same digest, with all_sum only
    (the collective every backend has): over the digest's bytes d_r,
    sum d_r = W d and sum d_r^2 = W d^2 on every rank hold only if all d_r = d
    (equality in Cauchy-Schwarz); integers < 2^24 are exact in float32."""
    if group is None or group.size() == 1:
        return True
    d = mx.array(np.frombuffer(bytes.fromhex(digest), dtype=np.uint8).astype(np.float32))
    s1 = mx.distributed.all_sum(d, group=group)
    s2 = mx.distributed.all_sum(d * d, group=group)
    w = group.size()
    same = mx.all(s1 == w * d) & mx.all(s2 == w * d * d)
    # each rank's own verdict, summed: all ranks agree only if every one says so
    votes = mx.distributed.all_sum(same.astype(mx.float32).reshape(1), group=group)
    return int(votes.item()) == w


def steady_state(times, warmup):
    """Mean seconds per step after the warm-up steps (compilation, caches)."""
    rest = times[warmup:] or times[-1:]
    return sum(rest) / len(rest)


def resolve_defaults(args):
    for key, value in PRESETS[args.model].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.head_dim is None:
        args.head_dim = args.dims // args.heads


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="transformer", choices=list(PRESETS))
    p.add_argument("--dims", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--kv-heads", type=int, help="qwen3 only")
    p.add_argument("--head-dim", type=int, help="qwen3 only (transformer: dims / heads)")
    p.add_argument("--ffn", type=int, help="qwen3 only (transformer: 4 x dims)")
    p.add_argument("--vocab", type=int)
    p.add_argument("--seq", type=int, default=64, help="tokens per sequence")
    p.add_argument("--batch", type=int, default=4, help="sequences per rank and step")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of tokens/s")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    p.add_argument("--precision", default="float32", choices=["float32", "mixed", "bfloat16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "gpu"])
    p.add_argument("--backend", default="any", help="mx.distributed.init backend (any, ring, nccl, ...)")
    p.add_argument("--builtin", action="store_true", help="MLX's mx.fast.rms_norm instead of patch()")
    p.add_argument("--no-compile", action="store_true", help="run the step uncompiled")
    p.add_argument("--compare", action="store_true",
                   help="rank 0 also trains alone on the full global batch and prints the loss difference")
    p.add_argument("--digest", action="store_true", help="print a sha256 of the final parameters per rank")
    p.add_argument("--save-npz", metavar="PATH", help="final parameters ({rank} is replaced)")
    p.add_argument("--json", metavar="PATH", help="results per rank ({rank} is replaced)")
    p.add_argument("--gemm-embedding-grad", action="store_true",
                   help="embedding backward as a GEMM (no atomics; small vocabularies)")
    p.add_argument("--check-grad-determinism", action="store_true",
                   help="rank 0 computes the first step's gradients 3 times and lists those that differ")
    p.add_argument("--print-every", type=int, default=1)
    args = p.parse_args()
    resolve_defaults(args)

    on_gpu = mx.is_available(mx.gpu) and mlx_rmsnorm.has_cuda_kernels()
    if args.device == "gpu" and not on_gpu:
        p.error("--device gpu: MLX has no GPU here, or the plugin was built without CUDA kernels")
    on_gpu = on_gpu and args.device != "cpu"
    mx.set_default_device(mx.gpu if on_gpu else mx.cpu)

    group = mx.distributed.init(backend=args.backend)
    rank, world = group.rank(), group.size()
    args.verbose_rank = rank == 0
    if not args.builtin:
        mlx_rmsnorm.patch()
        if not on_gpu:  # on a CPU stream patch() alone keeps MLX's own op
            mlx_rmsnorm.route_cpu(True)

    norm = "mx.fast.rms_norm (built-in)" if args.builtin else "mlx_rmsnorm (patch())"
    if rank == 0:
        print(f"{args.model}: {args.layers} layers x {args.dims} dims, {args.heads} heads"
              f"{f' / {args.kv_heads} KV' if args.kv_heads else ''} of {args.head_dim}, "
              f"vocab {args.vocab} | {args.precision} | {norm} | device {mx.default_device()} | "
              f"world {world} | {args.batch} x {args.seq} tokens per rank, global batch "
              f"{world * args.batch} | {args.optimizer} lr {args.lr} | {args.steps} steps"
              f"{'' if args.no_compile else ', compiled'}", flush=True)

    if args.check_grad_determinism and rank == 0:
        differ, count = gradient_determinism(args, world)
        result_extra = dict(grad_nondeterministic=differ)
        print(f"first-step gradients bitwise reproducible over 3 evaluations: "
              f"{count - len(differ)} of {count} parameters"
              + (f"; differ: {', '.join(differ)}" if differ else ""), flush=True)
    else:
        result_extra = {}

    shard = slice(rank * args.batch, (rank + 1) * args.batch)
    losses, times, model = train(args, group, shard, world)
    step_s = steady_state(times, args.warmup)
    tokens = args.batch * args.seq
    result = dict(rank=rank, world=world, model=args.model, precision=args.precision,
                  plugin=not args.builtin, patched=mlx_rmsnorm.is_patched(),
                  device=str(mx.default_device()), losses=losses,
                  step_ms=1e3 * step_s, tokens_per_s=world * tokens / step_s,
                  tokens_per_s_per_rank=tokens / step_s, batch=args.batch, seq=args.seq,
                  **result_extra)
    if rank == 0:
        print(f"tokens/s: {world * tokens / step_s:.0f} ({tokens / step_s:.0f} per rank), "
              f"{1e3 * step_s:.2f} ms/step (mean of steps {min(args.warmup, args.steps - 1)}.."
              f"{args.steps - 1})", flush=True)

    if args.digest or args.json:
        digest = parameter_digest(model)
        same = digests_agree(digest, group)
        result.update(digest=digest, ranks_identical=same)
        if args.digest:
            print(f"rank {rank} parameters sha256 {digest}", flush=True)
        if rank == 0:
            print(f"parameters bitwise identical on all {world} ranks: {'yes' if same else 'NO'}",
                  flush=True)
    if args.save_npz:
        mx.savez(args.save_npz.format(rank=rank), **dict(tree_flatten(model.parameters())))

    if args.compare and rank == 0:
        # Alone, on every full global batch: the math the ranks together do,
        # with every reduction over the batch in one piece.
        args.verbose_rank = False
        ref, _, _ = train(args, None, slice(0, world * args.batch), world)
        diffs = [abs(a - b) for a, b in zip(losses, ref)]
        rel = max(d / abs(r) for d, r in zip(diffs, ref))
        result.update(reference_losses=ref, max_loss_diff=max(diffs), max_loss_rel_diff=rel)
        print(f"\n{'step':>5} {'data-parallel':>14} {'single process':>15} {'|diff|':>10}")
        for i, (a, b) in enumerate(zip(losses, ref)):
            print(f"{i:5d} {a:14.7f} {b:15.7f} {abs(a - b):10.2e}")
        print(f"single process on the full batch: max |loss diff| {max(diffs):.3e} "
              f"(relative {rel:.3e})", flush=True)

    if args.json:
        with open(args.json.format(rank=rank), "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
