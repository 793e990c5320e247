"""Runs mx.fast.rms_norm's VJP a few times (bf16) so that a profiler can catch
its kernels:  ncu ... python3 scripts/builtin_vjp.py 16384 8192"""

import sys

import mlx.core as mx

m, n = (int(v) for v in sys.argv[1:3])
x = mx.random.normal((m, n)).astype(mx.bfloat16)
w = mx.random.normal((n,)).astype(mx.bfloat16)
g = mx.random.normal((m, n)).astype(mx.bfloat16)
mx.eval(x, w, g)
for _ in range(3):
    _, (gx, gw) = mx.vjp(lambda x, w: mx.fast.rms_norm(x, w, 1e-5), [x, w], [g])
    mx.eval(gx, gw)
