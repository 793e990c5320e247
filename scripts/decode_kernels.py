"""GPU time of the forward kernels a decode step runs, ours against the
built-in's, under Nsight Compute (each kernel alone, caches flushed: the
latency of a lone launch, which is what a token's chain of small kernels
waits on). The shapes are those of one token of the generation benchmark's
models: the hidden-size norms (1 x 1024 Qwen3-0.6B, 1 x 4096 Llama-3-8B)
and Qwen3's QK-norms over 16 query and 8 key heads of 128.

    python3 scripts/decode_kernels.py [--launches 5]
On the GPU machine, by scripts/gpu_run.sh (step decode) or by hand.

Prints, per shape, the median kernel time of each contender, its grid,
block and registers.
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


def child(launches):
    import mlx.core as mx

    import mlx_rmsnorm
    for label, shape in SHAPES:
        x = mx.random.normal(shape).astype(mx.bfloat16)
        w = (1 + 0.1 * mx.random.normal((shape[-1],))).astype(mx.bfloat16)
        mx.eval(x, w)
        for impl in IMPLS:
            norm = mlx_rmsnorm.rms_norm if impl == "ours" else mx.fast.rms_norm
            for _ in range(launches):
                mx.eval(norm(x, w, 1e-6))
            print(f"case\t{label}\t{impl}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--launches", type=int, default=5)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.launches)
    cmd = ["ncu", "--clock-control", "none", "--kernel-name", "regex:rms_norm|fwd_rows",
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
    if len(ordered) != len(cases) * args.launches:
        print(f"expected {len(cases) * args.launches} kernels, ncu saw {len(ordered)}")
        return 1
    print(f"decode-step forwards (bf16, ncu, each launch alone), median of {args.launches} launches")
    print(f"{'shape':10} {'impl':8} {'us':>7} {'grid':>14} {'block':>14} {'regs':>5}  kernel")
    for i, (label, impl) in enumerate(cases):
        ks = ordered[i * args.launches:(i + 1) * args.launches]
        us = statistics.median(k["gpu__time_duration.sum"] for k in ks)
        k = ks[0]
        print(f"{label:10} {impl:8} {us:7.2f} {k['grid']:>14} {k['block']:>14} "
              f"{int(k['launch__registers_per_thread']):5d}  {k['name'][:60]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
