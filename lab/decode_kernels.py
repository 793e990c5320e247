"""GPU time of the forward kernels a decode step runs, ours against the
built-in's, under Nsight Compute (each kernel alone, caches flushed: the
latency of a lone launch, which is what a token's chain of small kernels
waits on). The shapes are those of one token of the generation benchmark's
models: the hidden-size norms (1 x 1024 Qwen3-0.6B, 1 x 4096 Llama-3-8B)
and Qwen3's QK-norms over 16 query and 8 key heads of 128.

    python3 -m lab.decode_kernels [--launches 5]
On the GPU machine, by scripts/gpu_run.sh (step decode) or by hand.

Prints, per shape, the median kernel time of each contender, its grid,
block and registers. At the hidden-size shapes also the residual add before
the norm, as a decode step under `patch(fuse=True)` runs it: MLX's add then
our norm ("add+ours", the two kernels' times summed) against `add_rms_norm`
("fused", one kernel).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import statistics
import subprocess
import sys

# (label, x shape): x as the model hands it to the norm
SHAPES = [("1x1024", (1, 1, 1024)), ("1x4096", (1, 1, 4096)),
          ("q 16x128", (1, 1, 16, 128)), ("k 8x128", (1, 1, 8, 128)),
          ("64x4096", (1, 64, 4096))]
IMPLS = ("builtin", "ours")
ADD_SHAPES = ("1x1024", "1x4096", "64x4096")  # the fused add's contenders there
KERNELS = "rms_norm|fwd_rows|binary"  # MLX's norm, ours, MLX's add


def child(launches):
    import mlx.core as mx
    import numpy as np

    import mlx_rmsnorm
    rng = np.random.default_rng(0)

    def bf16(a):  # from the host: no GPU kernel that the kernel filter could catch
        return mx.array(a.astype(np.float32)).astype(mx.bfloat16)

    for label, shape in SHAPES:
        x, r = bf16(rng.standard_normal(shape)), bf16(rng.standard_normal(shape))
        w = bf16(1 + 0.1 * rng.standard_normal(shape[-1]))
        mx.eval(x, r, w)
        cases = {"builtin": (lambda: [mx.fast.rms_norm(x, w, 1e-6)], 1),
                 "ours": (lambda: [mlx_rmsnorm.rms_norm(x, w, 1e-6)], 1)}
        if label in ADD_SHAPES:
            def add_then_norm():
                h = x + r
                return [mlx_rmsnorm.rms_norm(h, w, 1e-6), h]
            cases["add+ours"] = (add_then_norm, 2)
            cases["fused"] = (lambda: list(mlx_rmsnorm.add_rms_norm(x, r, w, 1e-6)), 1)
        for impl, (run, kernels) in cases.items():
            for _ in range(launches):
                mx.eval(*run())
            print(f"case\t{label}\t{impl}\t{kernels}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--launches", type=int, default=5)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.launches)
    cmd = ["ncu", "--clock-control", "none", "--kernel-name", f"regex:{KERNELS}",
           "--metrics", "gpu__time_duration.sum,launch__registers_per_thread", "--csv",
           sys.executable, os.path.abspath(__file__), "--child", "--launches", str(args.launches)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        print(out.stdout[-3000:], out.stderr[-3000:])
        return out.returncode
    cases = [line.split("\t")[1:] for line in out.stdout.splitlines() if line.startswith("case\t")]
    rows = [r for r in csv.reader(io.StringIO("\n".join(
        line for line in out.stdout.splitlines() if line.startswith('"'))))]
    head, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(head)}
    kernels = {}  # ID -> dict
    for r in body:
        k = kernels.setdefault(int(r[col["ID"]]), dict(name=r[col["Kernel Name"]],
                               grid=r[col["Grid Size"]], block=r[col["Block Size"]]))
        # time units: ns / nsecond, us / usecond, ms / msecond (by ncu version)
        scale = {"n": 1e-3, "u": 1.0, "m": 1e3}.get(r[col["Metric Unit"]][:1], 1.0)
        k[r[col["Metric Name"]]] = float(r[col["Metric Value"]].replace(",", "")) * scale
    ordered = [kernels[i] for i in sorted(kernels)]
    expected = sum(int(n) for _, _, n in cases) * args.launches
    if len(ordered) != expected:
        print(f"expected {expected} kernels, ncu saw {len(ordered)}")
        return 1
    print(f"decode-step forwards (bf16, ncu, each launch alone), median of {args.launches} launches"
          " (add+ours: the two kernels' sum)")
    print(f"{'shape':10} {'impl':8} {'us':>7} {'grid':>14} {'block':>14} {'regs':>5}  kernel")
    at = 0
    for label, impl, n in cases:
        n = int(n)
        launches = [ordered[at + i * n:at + (i + 1) * n] for i in range(args.launches)]
        at += n * args.launches
        us = statistics.median(sum(k["gpu__time_duration.sum"] for k in ks) for ks in launches)
        k = launches[0][-1]  # the norm (after MLX's add where there is one)
        print(f"{label:10} {impl:8} {us:7.2f} {k['grid']:>14} {k['block']:>14} "
              f"{int(k['launch__registers_per_thread']):5d}  {k['name'][:60]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
