"""Per-call cost outside the kernels: tiny tensors (GPU work negligible),
many calls per mx.eval. Prints, per shape and contender, the time to build
the lazy graph and the time of mx.eval, in us per call (median of repeats,
contenders interleaved).

    python3 scripts/host_overhead.py [--shapes 8x1024,1x1x16x128] [--calls 50] [--repeats 10]
On the GPU machine, by scripts/gpu_run.sh (steps host and minsize) or by hand.
"""

import argparse
import statistics
import time

import mlx.core as mx

import mlx_rmsnorm

p = argparse.ArgumentParser()
p.add_argument("--shapes", default="8x1024", help="comma list of shapes, dims joined by x")
p.add_argument("--calls", type=int, default=50)
p.add_argument("--repeats", type=int, default=10)
args = p.parse_args()
EPS = 1e-5


def vjp(norm, with_w, x, w, g):
    if with_w:
        return lambda: mx.vjp(lambda x, w: norm(x, w, EPS), [x, w], [g])[1]
    return lambda: mx.vjp(lambda x: norm(x, w, EPS), [x], [g])[1]


for text in args.shapes.split(","):
    shape = tuple(int(v) for v in text.split("x"))
    n = shape[-1]
    x = mx.random.normal(shape).astype(mx.bfloat16)
    g = mx.random.normal(shape).astype(mx.bfloat16)
    w = mx.ones((n,), mx.bfloat16)
    mx.eval(x, g, w)
    cases = {
        "fwd builtin": lambda: mx.fast.rms_norm(x, w, EPS),
        "fwd ours": lambda: mlx_rmsnorm.rms_norm(x, w, EPS),
        "bwd builtin": vjp(mx.fast.rms_norm, True, x, w, g),
        "bwd ours": vjp(mlx_rmsnorm.rms_norm, True, x, w, g),
        "gx-only builtin": vjp(mx.fast.rms_norm, False, x, w, g),
        "gx-only ours": vjp(mlx_rmsnorm.rms_norm, False, x, w, g),
        "rms_norm_vjp direct": lambda: mlx_rmsnorm.rms_norm_vjp(x, w, g, EPS),
        "x + g": lambda: x + g,
        # a decoder block's residual add + norm, unfused (patch()) and fused
        "add+norm ours": lambda: (lambda h: [mlx_rmsnorm.rms_norm(h, w, EPS), h])(x + g),
        "fused add ours": lambda: list(mlx_rmsnorm.add_rms_norm(x, g, w, EPS)),
    }
    res = {k: ([], []) for k in cases}
    for rep in range(args.repeats + 2):
        for name, fn in cases.items():  # interleaved
            t0 = time.perf_counter()
            outs = [fn() for _ in range(args.calls)]
            t1 = time.perf_counter()
            mx.eval(outs)
            t2 = time.perf_counter()
            if rep >= 2:
                res[name][0].append((t1 - t0) / args.calls * 1e6)
                res[name][1].append((t2 - t1) / args.calls * 1e6)
    print(f"{text} bf16, {args.calls} calls per eval, us per call: median [min-max] of {args.repeats}")
    print(f"{'case':22} {'build':>22} {'eval':>22}")
    for name, (b, e) in res.items():
        f = lambda v: f"{statistics.median(v):6.2f} [{min(v):5.2f}-{max(v):5.2f}]"
        print(f"{name:22} {f(b):>22} {f(e):>22}")
