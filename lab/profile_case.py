"""Runs one norm direction a few times (bf16, with a weight; LayerNorm with a
bias too) so that a profiler can catch its kernels:

    ncu ... python3 -m lab.profile_case {fwd,bwd} {ours,builtin} M N [rms|layer|add_rms|add_layer]

add_*: the fused residual add (the built-in: MLX's add, then its norm).

Run under ncu by scripts/gpu_run.sh (steps profile and profile-ln).
"""

import sys

import mlx.core as mx

import mlx_rmsnorm

def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    direction, impl = argv[0:2]
    m, n = (int(v) for v in argv[2:4])
    op = argv[4] if len(argv) > 4 else "rms"
    x = mx.random.normal((m, n)).astype(mx.bfloat16)
    w = mx.random.normal((n,)).astype(mx.bfloat16)
    b = mx.random.normal((n,)).astype(mx.bfloat16)
    g = mx.random.normal((m, n)).astype(mx.bfloat16)
    r = mx.random.normal((m, n)).astype(mx.bfloat16)  # the fused add's residual
    mx.eval(x, w, b, g, r)
    ours = impl == "ours"
    params = [w] if op.endswith("rms") else [w, b]
    if op == "rms":
        norm = mlx_rmsnorm.rms_norm if ours else mx.fast.rms_norm
    elif op == "layer":
        layer = mlx_rmsnorm.layer_norm if ours else mx.fast.layer_norm
        norm = lambda x, w, b, eps: layer(x, w, b, eps)  # noqa: E731
    else:  # y of the fused add
        fused = {"add_rms": mlx_rmsnorm.add_rms_norm, "add_layer": mlx_rmsnorm.add_layer_norm}[op]
        plain = {"add_rms": mx.fast.rms_norm, "add_layer": mx.fast.layer_norm}[op]
        norm = (lambda x, *p: fused(x, r, *p)[0]) if ours else (lambda x, *p: plain(x + r, *p))
    for _ in range(3):
        if direction == "fwd":
            mx.eval(norm(x, *params, 1e-5))
        else:
            mx.eval(mx.vjp(lambda x, *p: norm(x, *p, 1e-5), [x, *params], [g])[1])


if __name__ == "__main__":
    main()
