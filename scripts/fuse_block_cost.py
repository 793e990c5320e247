"""The host time of one rewritten block against mlx-lm's original, with the
block's attention and MLP replaced by identities: what is left is the norms,
the adds and the rewrite's own Python (its checks, its counting, the fused
op's call). A decode token is host-bound and runs every block, so this is
what patch(fuse=True) adds to a token's build, block by block.

Both run under patch(fuse=True) (the original is the function the rewrite
replaced); the CPU stream is routed to the plugin, as the tests route it.
Timings interleave in a random order; the best of them is the figure to
read (the 2-core development machine's medians move by 20-40%).

    python3 scripts/fuse_block_cost.py [--model qwen3|gpt2] [--rounds 80]
"""

from __future__ import annotations

import argparse
import importlib
import random
import statistics
import timeit

import mlx.core as mx
import mlx.nn as nn

import mlx_rmsnorm
from mlx_rmsnorm import _fuse, _patching

TINY = {
    "qwen3": dict(model_type="qwen3", hidden_size=64, num_hidden_layers=1, intermediate_size=128,
                  num_attention_heads=4, rms_norm_eps=1e-6, vocab_size=256, num_key_value_heads=2,
                  max_position_embeddings=4096, rope_theta=1e6, head_dim=16, tie_word_embeddings=True),
    "gpt2": dict(model_type="gpt2", n_ctx=1024, n_embd=64, n_head=4, n_layer=1, n_positions=1024,
                 layer_norm_epsilon=1e-5, vocab_size=256),
}


class Identity(nn.Module):
    def __call__(self, x, *args, **kwargs):
        return x


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(TINY), default="qwen3")
    p.add_argument("--rounds", type=int, default=80)
    p.add_argument("--number", type=int, default=1000, help="calls a timing")
    a = p.parse_args()
    _patching.route_cpu(True)
    mlx_rmsnorm.patch(fuse=True)
    mod = importlib.import_module(f"mlx_lm.models.{a.model}")
    block = mod.TransformerBlock(mod.ModelArgs(**TINY[a.model]))
    block.set_dtype(mx.bfloat16)
    for name in ("self_attn", "attn", "mlp"):
        if name in block:
            setattr(block, name, Identity())
    mx.eval(block.parameters())
    x = mx.ones((1, 1, 64), mx.bfloat16)
    mx.eval(x)
    rewrite = mod.TransformerBlock.__call__
    variants = {"original": rewrite.__wrapped__, "rewrite": rewrite}
    _fuse.reset_counts()
    rewrite(block, x)
    assert _fuse.counts()["fused"] == 1, _fuse.counts()  # the rewrite's fused path is what is timed
    us: dict[str, list[float]] = {v: [] for v in variants}
    order = list(variants)
    for _ in range(a.rounds):
        random.shuffle(order)
        for v in order:
            fn = variants[v]
            t = min(timeit.repeat(lambda: fn(block, x), number=a.number, repeat=2))
            us[v].append(t / a.number * 1e6)
    mlx_rmsnorm.unpatch()
    print(f"{a.model} block, attention and MLP identity, {a.rounds} interleaved timings of {a.number} calls; us a call")
    for v, xs in us.items():
        print(f"{v:9} best {min(xs):6.2f}  median {statistics.median(xs):6.2f}")


if __name__ == "__main__":
    main()
