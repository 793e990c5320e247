"""CPU speed of the norm under patch()'s two CPU choices: MLX's built-in (what a
CPU stream runs by default) against the plugin's CPU path (route_cpu(True),
explicit calls). Run by hand on a CPU machine:

    python -m lab.cpu_speed [--reps 7]

docs/api.md ("On a CPU stream") has its table: median [min-max] ms of
`--reps` evals, forward and forward + backward (mx.vjp: gx and gw)."""

import argparse
import statistics
import time

import mlx.core as mx

import mlx_rmsnorm
from mlx_rmsnorm._patching import BUILTIN

SHAPES = [(4096, 1024), (1024, 4096), (256, 4099)]


def timed(fn, reps):
    ms = []
    for _ in range(reps):
        start = time.perf_counter()
        mx.eval(fn())
        ms.append((time.perf_counter() - start) * 1e3)
    return f"{statistics.median(ms):.1f} [{min(ms):.1f}-{max(ms):.1f}]"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=7)
    reps = parser.parse_args().reps
    print("| dtype, M x N | built-in fwd | plugin fwd | built-in fwd+bwd | plugin fwd+bwd |")
    print("|---|---|---|---|---|")
    with mx.stream(mx.cpu):
        for dtype in (mx.float32, mx.bfloat16):
            for m, n in SHAPES:
                x, g = (mx.random.normal((m, n)).astype(dtype) for _ in range(2))
                w = mx.random.normal((n,)).astype(dtype)
                mx.eval(x, g, w)
                fwd, both = [], []
                for norm in (BUILTIN, mlx_rmsnorm.rms_norm):
                    fwd.append(timed(lambda: norm(x, w, 1e-5), reps))
                    both.append(timed(lambda: mx.vjp(lambda x, w: norm(x, w, 1e-5), [x, w], [g]), reps))
                print(f"| {str(dtype).split('.')[-1]} {m}x{n} | {fwd[0]} | {fwd[1]} | {both[0]} | {both[1]} |")


if __name__ == "__main__":
    main()
