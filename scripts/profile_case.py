"""Runs one RMSNorm direction a few times (bf16, with a weight) so that a
profiler can catch its kernels:

    ncu ... python3 scripts/profile_case.py {fwd,bwd} {ours,builtin} M N
Run under ncu by scripts/gpu_run.sh (step profile).
"""

import sys

import mlx.core as mx

import mlx_rmsnorm

direction, impl = sys.argv[1:3]
m, n = (int(v) for v in sys.argv[3:5])
x = mx.random.normal((m, n)).astype(mx.bfloat16)
w = mx.random.normal((n,)).astype(mx.bfloat16)
g = mx.random.normal((m, n)).astype(mx.bfloat16)
mx.eval(x, w, g)
norm = mlx_rmsnorm.rms_norm if impl == "ours" else mx.fast.rms_norm
for _ in range(3):
    if direction == "fwd":
        mx.eval(norm(x, w, 1e-5))
    else:
        mx.eval(mx.vjp(lambda x, w: norm(x, w, 1e-5), [x, w], [g])[1])
