"""Per-call cost outside the kernels: tiny tensors (GPU work negligible),
many calls per mx.eval. Prints, per contender, the time to build the lazy
graph and the time of mx.eval, in us per call (median of repeats).

    python3 scripts/host_overhead.py [rows] [n] [calls]
"""

import statistics
import sys
import time

import mlx.core as mx

import mlx_rmsnorm

m, n = (int(v) for v in sys.argv[1:3]) if len(sys.argv) > 2 else (8, 1024)
calls = int(sys.argv[3]) if len(sys.argv) > 3 else 50
EPS = 1e-5
x = mx.random.normal((m, n)).astype(mx.bfloat16)
g = mx.random.normal((m, n)).astype(mx.bfloat16)
w = mx.ones((n,), mx.bfloat16)
mx.eval(x, g, w)


def vjp(norm, with_w):
    if with_w:
        return lambda: mx.vjp(lambda x, w: norm(x, w, EPS), [x, w], [g])[1]
    return lambda: mx.vjp(lambda x: norm(x, w, EPS), [x], [g])[1]


cases = {
    "fwd builtin": lambda: mx.fast.rms_norm(x, w, EPS),
    "fwd ours": lambda: mlx_rmsnorm.rms_norm(x, w, EPS),
    "bwd builtin": vjp(mx.fast.rms_norm, True),
    "bwd ours": vjp(mlx_rmsnorm.rms_norm, True),
    "gx-only builtin": vjp(mx.fast.rms_norm, False),
    "gx-only ours": vjp(mlx_rmsnorm.rms_norm, False),
    "rms_norm_vjp direct": lambda: mlx_rmsnorm.rms_norm_vjp(x, w, g, EPS),
    "x + g": lambda: x + g,
}
res = {k: ([], []) for k in cases}
for rep in range(12):
    for name, fn in cases.items():  # interleaved
        t0 = time.perf_counter()
        outs = [fn() for _ in range(calls)]
        t1 = time.perf_counter()
        mx.eval(outs)
        t2 = time.perf_counter()
        if rep >= 2:
            res[name][0].append((t1 - t0) / calls * 1e6)
            res[name][1].append((t2 - t1) / calls * 1e6)
print(f"{m}x{n} bf16, {calls} calls per eval, us per call: median [min-max] of 10")
print(f"{'case':22} {'build':>22} {'eval':>22}")
for name, (b, e) in res.items():
    f = lambda v: f"{statistics.median(v):6.1f} [{min(v):5.1f}-{max(v):5.1f}]"
    print(f"{name:22} {f(b):>22} {f(e):>22}")
