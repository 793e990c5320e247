"""The forward's reads of w and b side by side, at the long rows where they
run different kernels: read as x (W_AS_X: w and b both in x's dtype, or w
alone for a LayerNorm without bias, the WithoutBias policy) and the general
read (w and b in fp32, y then in fp32), whose capped cluster rows spill on
sm_90 (ptxas: 36-52 bytes at LayerNorm's 512 x 8 slices, 4-20 at the fused
add's 512 x 4) where the read as x does not. Each variant's time against the
copy rate on its own bytes says what the spills cost:

    python3 -m lab.weight_reads [--shapes 2048x65536,...] [--repeats 7] [--calls 20]

Per shape, op (layer_norm, add_layer_norm) and variant: us per call (median
[min-max] of interleaved rounds, `calls` calls an eval), the bytes it moves
(x, the residual; y, h), and % of the copy ceiling (the faster of MLX's -x
and x + g in the same rounds, at those bytes). bf16 x.
"""

from __future__ import annotations

import argparse

import mlx.core as mx

from mlx_rmsnorm import add_layer_norm, layer_norm
from mlx_rmsnorm.bench.core import (EPS, bias_like, copy_rates, inputs, rotating_sets, stats, time_interleaved,
                                    trim)

SHAPES = [(4096, 24576), (4096, 32768), (2048, 65536), (1024, 131072), (512, 262144)]


def variants(w):
    """(name, w, b) as a checkpoint may hold them."""
    b = bias_like(w)
    w32, b32 = w.astype(mx.float32), b.astype(mx.float32)
    mx.eval(w32, b32)
    return [("w, b as x", w, b), ("w as x, no b", w, None), ("w, b fp32", w32, b32)]


def figures(w):
    """[(op, variant, fn(x, g))]: the ceilings first."""
    figs = [("ceiling", "-x", lambda x, g: -x), ("ceiling", "x+g", lambda x, g: x + g)]
    for name, wv, bv in variants(w):
        figs.append(("layer_norm", name, lambda x, g, wv=wv, bv=bv: layer_norm(x, wv, bv, EPS)))
        figs.append(("add_layer_norm", name,
                     lambda x, g, wv=wv, bv=bv: add_layer_norm(x, g, wv, bv, EPS)))
    return figs


def moved(out, x, add):
    """Bytes a call must move: x (and the residual) in, its outputs out."""
    outs = out if isinstance(out, (list, tuple)) else [out]
    return x.nbytes * (2 if add else 1) + sum(o.nbytes for o in outs)


def run_shape(shape, calls, repeats, device=mx.gpu):
    m, n = shape
    tensor = m * n * 2
    n_sets = rotating_sets(2 * tensor)
    with mx.stream(device):
        sets, w = inputs(shape, mx.bfloat16, n_sets)
        figs = figures(w)
        x, g = sets[0]
        bytes_of = [0, 0] + [moved(f(x, g), x, op.startswith("add_")) for op, _, f in figs[2:]]
        samples = time_interleaved([f for _, _, f in figs], sets, calls, repeats, singles=0)
    del sets, w
    mx.clear_cache()
    trim()
    us = [[1e6 * e for e in samples[i]["many"]] for i in range(len(figs))]
    rate = copy_rates(tensor, us[0], us[1])
    rows = []
    for i, (op, name, _) in enumerate(figs[2:], start=2):
        st = stats(us[i])
        pct = sorted(100 * bytes_of[i] / r / u for r, u in zip(rate, us[i]))
        rows.append((f"{m}x{n}", op, name, st, bytes_of[i], pct[len(pct) // 2], pct[0], pct[-1]))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="", help="comma list of MxN (default: the long rows)")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    if not mx.is_available(mx.gpu):
        print("weight_reads: needs a GPU (the kernels compared are CUDA kernels)")
        return 1
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    print(f"w and b read as x (w alone without b) against the general read (fp32 w, b); bf16 x, "
          f"{args.calls} calls an eval, "
          f"median [min-max] of {args.repeats} interleaved rounds; % = copy time of the bytes / time")
    print(f"{'shape':>12} {'op':15} {'w, b':14} {'us':>24} {'MB':>7} {'% copy [min-max]':>18}")
    for shape in shapes:
        for label, op, name, st, nbytes, pct, lo, hi in run_shape(shape, args.calls, args.repeats):
            us = f"{st['med']:.1f} [{st['min']:.1f}-{st['max']:.1f}]"
            print(f"{label:>12} {op:15} {name:14} {us:>24} {nbytes / 1e6:7.1f} "
                  f"{pct:5.1f} [{lo:.0f}-{hi:.0f}]", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
