"""Benchmark: mlx-rmsnorm against MLX's built-in mx.fast.rms_norm.

    python -m mlx_rmsnorm.bench [--quick] [--dtype bfloat16] [--out DIR]

For every (M, N) case, in one process and side by side:
  - ceiling:  the same bytes through MLX's simplest elementwise kernel with
              the same read:write mix (backward: x + g, 2 reads and 1 write;
              forward: -x, 1 read and 1 write);
  - ours:     the backward as "auto" picks it (the persistent kernel wherever
              a row fits its launch plan, i.e. N <= 16384 for bf16; the split
              kernels beyond) and the seed's naive 3-kernel chain; the forward;
  - mlx:      mx.fast.rms_norm and its VJP.
Each is timed two ways: many independent calls in one mx.eval (kernel time,
MLX's per-eval launch cost amortised; inputs rotate over several buffers so
nothing is served from L2) and one call per mx.eval (the latency a user
sees). GB/s counts x and g read and gx written once (plus w and gw); the
forward counts x read and y written. Writes CSV, JSON and a PNG plot.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time

import mlx.core as mx

from . import rms_norm, rms_norm_vjp

# The nine shapes of the reference table (H200 numbers for QuACK, the
# built-in, Liger and torch were measured on these), then the seed's sweep.
SHAPES = [
    (16384, 8192), (16384, 4096), (32768, 2048), (65536, 1024), (262144, 128),
    (4096, 8192), (16384, 2880), (8192, 16384), (4096, 32768),
]
SWEEP_N = [2048, 4096, 8192]
SWEEP_M = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
QUICK_SHAPES = [(256, 128), (128, 1024), (64, 4099)]

EPS = 1e-5
L2_BYTES = 64 << 20  # rotate inputs over more than the L2 (50 MiB on H100/H200)


def _progress(items, desc):
    try:
        from tqdm import tqdm

        return tqdm(items, desc=desc, file=sys.stderr)
    except ImportError:  # progress is a nicety, never a requirement
        return items


def _time_many(fn, sets, calls, repeats):
    """Median seconds per call, `calls` independent calls per mx.eval."""
    def once():
        outs = [fn(*sets[i % len(sets)]) for i in range(calls)]
        t0 = time.perf_counter()
        mx.eval(outs)
        return (time.perf_counter() - t0) / calls

    once()  # warm-up: plans, kernel handles, graph cache
    return statistics.median(once() for _ in range(repeats))


def _time_single(fn, sets, repeats):
    """Median seconds of one call per mx.eval (what a user's step sees)."""
    def once(i):
        out = fn(*sets[i % len(sets)])
        t0 = time.perf_counter()
        mx.eval(out)
        return time.perf_counter() - t0

    once(0)
    return statistics.median(once(i) for i in range(repeats))


def _cases(args):
    if args.quick:
        return [(m, n, "table") for m, n in QUICK_SHAPES]
    cases = [(m, n, "table") for m, n in SHAPES]
    if not args.no_sweep:
        cases += [(m, n, "sweep") for n in SWEEP_N for m in SWEEP_M]
    return cases


def _inputs(m, n, dtype, n_sets):
    key = mx.random.key(m * 131 + n)
    sets = []
    for i in range(n_sets):
        kx, kg, key = mx.random.split(key, 3)
        sets.append(
            (mx.random.normal((m, n), key=kx).astype(dtype),
             mx.random.normal((m, n), key=kg).astype(dtype))
        )
    w = (1 + 0.1 * mx.random.normal((n,), key=key)).astype(dtype)
    mx.eval(sets, w)
    return sets, w


def run_case(m, n, dtype, calls, repeats, device):
    size = dtype.size
    tensor = m * n * size
    n_sets = max(2, min(8, -(-L2_BYTES // (2 * tensor)) + 1))
    sets, w = _inputs(m, n, dtype, n_sets)
    bwd_bytes = 3 * tensor + 2 * n * size
    fwd_bytes = 2 * tensor + n * size

    def builtin_bwd(x, g):
        return mx.vjp(lambda x, w: mx.fast.rms_norm(x, w, EPS), [x, w], [g])[1]

    contenders = {
        ("bwd", "ceiling (x+g)"): (lambda x, g: x + g, bwd_bytes),
        ("bwd", "ours auto"): (lambda x, g: rms_norm_vjp(x, w, g, EPS), bwd_bytes),
        ("bwd", "ours naive"): (lambda x, g: rms_norm_vjp(x, w, g, EPS, algorithm="naive"), bwd_bytes),
        ("bwd", "mx.fast"): (builtin_bwd, bwd_bytes),
        ("fwd", "ceiling (-x)"): (lambda x, g: -x, fwd_bytes),
        ("fwd", "ours"): (lambda x, g: rms_norm(x, w, EPS), fwd_bytes),
        ("fwd", "mx.fast"): (lambda x, g: mx.fast.rms_norm(x, w, EPS), fwd_bytes),
    }
    rows = []
    with mx.stream(device):
        for (direction, name), (fn, nbytes) in contenders.items():
            t_many = _time_many(fn, sets, calls, repeats)
            t_one = _time_single(fn, sets, repeats)
            rows.append(dict(direction=direction, impl=name, M=m, N=n,
                             dtype=str(dtype).split(".")[-1], bytes=nbytes,
                             us=t_many * 1e6, us_single=t_one * 1e6,
                             gbs=nbytes / t_many / 1e9))
    for direction in ("bwd", "fwd"):
        group = [r for r in rows if r["direction"] == direction]
        ceiling = group[0]["gbs"]
        builtin = next(r for r in group if r["impl"] == "mx.fast")["us"]
        for r in group:
            r["pct_ceiling"] = 100 * r["gbs"] / ceiling
            r["speedup_vs_builtin"] = builtin / r["us"]
    del sets
    mx.clear_cache()
    return rows


def print_table(rows, kind):
    hdr = (f"{'dir':4} {'M x N':>13} {'impl':17} {'us':>9} {'us/1-eval':>10} "
           f"{'GB/s':>7} {'% ceil':>7} {'x builtin':>9}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if r["kind"] != kind:
            continue
        print(f"{r['direction']:4} {str(r['M']) + 'x' + str(r['N']):>13} {r['impl']:17} "
              f"{r['us']:9.1f} {r['us_single']:10.1f} {r['gbs']:7.0f} "
              f"{r['pct_ceiling']:6.1f}% {r['speedup_vs_builtin']:8.2f}x")


def plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = dict(zip(SWEEP_N, ["tab:blue", "tab:orange", "tab:green"]))
    styles = {"ours auto": "-", "ours naive": "--", "mx.fast": ":"}
    for n in SWEEP_N:
        for impl, style in styles.items():
            pts = sorted((r["M"], r["us"]) for r in rows
                         if r["kind"] == "sweep" and r["N"] == n
                         and r["direction"] == "bwd" and r["impl"] == impl)
            if pts:
                ax.plot(*zip(*pts), style, color=colors[n], marker="o", ms=3,
                        label=f"N={n} {impl}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("rows M")
    ax.set_ylabel("backward time per call (us)")
    ax.set_title("RMSNorm backward, bf16: solid = ours (persistent), dashed = naive chain, "
                 "dotted = mx.fast", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="three small shapes (CI, CPU)")
    p.add_argument("--no-sweep", action="store_true", help="only the nine table shapes")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--calls", type=int, default=20, help="calls per eval (kernel timing)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="bench-results", help="folder for CSV, JSON, PNG")
    args = p.parse_args(argv)

    gpu = mx.is_available(mx.gpu)
    from . import has_cuda_kernels

    device = mx.gpu if gpu and has_cuda_kernels else mx.cpu
    dtype = getattr(mx, args.dtype)
    if args.quick:
        args.calls, args.repeats = min(args.calls, 4), min(args.repeats, 3)
    print(f"device: {device}, dtype: {args.dtype}, {args.calls} calls per eval, "
          f"median of {args.repeats}")
    rows = []
    for m, n, kind in _progress(_cases(args), "cases"):
        for r in run_case(m, n, dtype, args.calls, args.repeats, device):
            r["kind"] = kind
            rows.append(r)

    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"bench_{args.dtype}")
    with open(base + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(base + ".json", "w") as f:
        json.dump(dict(device=str(device), dtype=args.dtype, rows=rows), f, indent=1)
    if any(r["kind"] == "sweep" for r in rows):
        if plot(rows, base + ".png"):
            print(f"plot: {base}.png")
        print("\nsweep (M from 1024 to 65536):")
        print_table(rows, "sweep")
    print(f"\nresults: {base}.csv, {base}.json\n")
    print_table(rows, "table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
