"""The host time of one rewritten block against mlx-lm's original, with the
block's attention and MLP replaced by identities: what is left is the norms,
the adds and the rewrite's own Python (its checks, its counting, the fused
op's call). A decode token is host-bound and runs every block, so this is
what patch(fuse=True) adds to a token's build, block by block.

The block is the first of the generation benchmark's toy model (--quick
sizes: hidden 64). Both run under patch(fuse=True) (the original is the
function the rewrite replaced); the CPU stream is routed to the plugin, as
the tests route it.
Timings interleave in a random order; the best of them is the figure to
read (the 2-core development machine's medians move by 20-40%).

With --decode the rewrite keeps its row limit (_fuse.MIN_ROWS), so at the
block's one row it runs the original behind its row test: what
patch(fuse=True) adds to a decode step.

    python3 scripts/fuse_block_cost.py [--model qwen3-0.6b|llama-3-8b|gpt2-medium] [--rounds 80] [--decode]
"""

from __future__ import annotations

import argparse
import random
import statistics
import timeit

import mlx.core as mx
import mlx.nn as nn

import mlx_rmsnorm
from mlx_rmsnorm import _fuse, _patching
from mlx_rmsnorm.bench.generation import MODELS, build_model


class Identity(nn.Module):
    def __call__(self, x, *args, **kwargs):
        return x


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="qwen3-0.6b")
    p.add_argument("--rounds", type=int, default=80)
    p.add_argument("--number", type=int, default=1000, help="calls a timing")
    p.add_argument("--decode", action="store_true", help="keep the row limit: the decode path")
    a = p.parse_args()
    _patching.route_cpu(True)
    mlx_rmsnorm.patch(fuse=True)
    if not a.decode:
        _fuse.MIN_ROWS = 0  # the fused path at the block's one row (else it runs the original)
    block = build_model(a.model, 256, quick=True).layers[0]
    for name in ("self_attn", "attn", "mlp"):
        if name in block:
            setattr(block, name, Identity())
    x = mx.ones((1, 1, 64), mx.bfloat16)
    mx.eval(x)
    rewrite = type(block).__call__
    variants = {"original": rewrite.__wrapped__, "rewrite": rewrite}
    _fuse.reset_counts()
    rewrite(block, x)
    path = "fallback:few rows (decode)" if a.decode else "fused"
    assert _fuse.counts() == {path: 1}, _fuse.counts()  # the path that is timed
    us: dict[str, list[float]] = {v: [] for v in variants}
    order = list(variants)
    for _ in range(a.rounds):
        random.shuffle(order)
        for v in order:
            fn = variants[v]
            t = min(timeit.repeat(lambda: fn(block, x), number=a.number, repeat=2))
            us[v].append(t / a.number * 1e6)
    mlx_rmsnorm.unpatch()
    print(f"{a.model} block{' (decode path)' if a.decode else ''}, attention and MLP identity, "
          f"{a.rounds} interleaved timings of {a.number} calls; us a call")
    for v, xs in us.items():
        print(f"{v:9} best {min(xs):6.2f}  median {statistics.median(xs):6.2f}")


if __name__ == "__main__":
    main()
