"""Small cases for compute-sanitizer (memcheck, racecheck, synccheck,
initcheck): every launch-plan row and the boundaries between rows, the
fallbacks (odd N, N past the tables, misaligned inputs), M smaller than the
grid, every dtype pairing and RMSNorm backward algorithm, for each of the
four ops (--ops: rms_norm, layer_norm, add_rms_norm, add_layer_norm; forward
and backward each). Sizes stay small: the tools slow kernels down by orders
of magnitude.

Run by scripts/gpu_run.sh (step sanitize), or by hand:
    compute-sanitizer --tool memcheck python3 -m lab.sanitize_cases
    compute-sanitizer --tool racecheck python3 -m lab.sanitize_cases --max-n 16392 --long-rows 64
    compute-sanitizer --tool synccheck python3 -m lab.sanitize_cases --max-n 16384

racecheck tracks every shared-memory access and is by far the slowest tool:
--max-n and --long-rows give it a smaller set (the whole persistent table);
--min-n runs the rest apart. synccheck stops the process ("an illegal memory
access") past N = 16384, where the cluster rows begin; memcheck runs those
clean (docs/NOTES.md).
"""

import argparse
import sys
import time

import mlx.core as mx

import mlx_rmsnorm

# Row lengths in elements around each table threshold (bf16: 8 per vector).
NS = [1, 7, 31, 32, 33, 64, 65, 128, 129, 256, 257, 1000, 1024, 1025, 2048, 2880,
      4096, 4099, 8192, 8193, 16384, 16392, 32768, 40000, 65536, 65544]
PAIRS = [(mx.bfloat16, mx.bfloat16), (mx.float32, mx.float32), (mx.bfloat16, mx.float32),
         (mx.bfloat16, None)]  # float16 shares every code path with bfloat16
OPS = ("rms_norm", "layer_norm", "add_rms_norm", "add_layer_norm")


def op_outputs(op, x, w, g, device):
    """The forward's and the backward's outputs of one op on x (the residual
    added is g's values in x's dtype), weight w (the bias, LayerNorm's: w's)."""
    eps = 1e-5
    b = w
    r = g.astype(x.dtype)
    if op == "rms_norm":
        outs = [mlx_rmsnorm.rms_norm(x, w, eps, stream=device)]
        for algorithm in ("auto", "split", "naive"):
            outs += mlx_rmsnorm.rms_norm_vjp(x, w, g, eps, algorithm=algorithm, stream=device)
        # misaligned rows (offset by one element)
        xo = mx.concatenate([mx.zeros((1,), x.dtype), x.reshape(-1)])[1:].reshape(x.shape)
        return outs + list(mlx_rmsnorm.rms_norm_vjp(xo, w, g, eps, stream=device))
    if op == "layer_norm":
        return [mlx_rmsnorm.layer_norm(x, w, b, eps, stream=device),
                *mlx_rmsnorm.layer_norm_vjp(x, w, b, g, eps, stream=device)]
    if op == "add_rms_norm":
        y, h = mlx_rmsnorm.add_rms_norm(x, r, w, eps, stream=device)
        return [y, h, *mlx_rmsnorm.add_rms_norm_vjp(h, w, g, r, eps, stream=device)]
    y, h = mlx_rmsnorm.add_layer_norm(x, r, w, b, eps, stream=device)
    return [y, h, *mlx_rmsnorm.add_layer_norm_vjp(h, w, b, g, r, eps, stream=device)]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--min-n", type=int, default=1, help="skip shorter rows")
    p.add_argument("--max-n", type=int, default=max(NS), help="skip longer rows")
    p.add_argument("--long-rows", type=int, default=300,
                   help="rows for N past 4099 (N <= 4099 always takes 300)")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma list from {','.join(OPS)}")
    args = p.parse_args()
    ops = args.ops.split(",")
    if not set(ops) <= set(OPS):
        raise SystemExit(f"--ops: from {','.join(OPS)}, got {args.ops!r}")
    start = time.time()
    device = mx.gpu if mx.is_available(mx.gpu) and mlx_rmsnorm.has_cuda_kernels() else mx.cpu
    count = 0
    for n in [n for n in NS if args.min_n <= n <= args.max_n]:
        # fewer rows for the longest: a run under a sanitizer stays within minutes
        long_rows = args.long_rows if n <= 16392 else min(args.long_rows, 40)
        print(f"  N={n} ({time.time() - start:.0f} s)", file=sys.stderr, flush=True)
        for m in (1, 300 if n <= 4099 else long_rows):
            for x_t, w_t in PAIRS:
                key = mx.random.key(n * 7 + m)
                kx, kg, kw = mx.random.split(key, 3)
                x = mx.random.normal((m, n), key=kx).astype(x_t)
                w = None if w_t is None else mx.random.normal((n,), key=kw).astype(w_t)
                out_t = x_t if w is None else mx.result_type(x_t, w_t)
                g = mx.random.normal((m, n), key=kg).astype(out_t)
                for op in ops:
                    mx.eval([a for a in op_outputs(op, x, w, g, device) if a is not None])
                    count += 1
    print(f"sanitize cases: {count} op/shape/dtype cases on {device} ({args.min_n} <= N <= {args.max_n}; "
          f"{','.join(ops)}), forward and backward each (rms_norm: 3 backward algorithms and a "
          "misaligned backward)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
