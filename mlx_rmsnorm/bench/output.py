"""The sections' results on disk and on screen: CSV, JSON (with every
sample), a PNG (each shape's contenders as % of the ceiling) and the tables."""

from __future__ import annotations

import csv
import json
import os
import sys
import time

from .core import BUILTIN, CEILING, DIRECTION_TITLE, OUR_RMS_NORM, Progress, device_name, per_eval


def spread(med, lo, hi, fmt="{:.1f}"):
    """"median [min-max]"."""
    return f"{fmt.format(med)} [{fmt.format(lo)}-{fmt.format(hi)}]"


def get(rows, kind, shape, direction, impl):
    for r in rows:
        if (r["kind"], r["shape"], r["direction"], r["impl"]) == (kind, shape, direction, impl):
            return r
    return None


def write_outputs(rows, base, meta):
    """base.csv (a row a figure, without the samples) and base.json (meta and
    every row with its samples)."""
    flat = [{k: v for k, v in r.items() if not k.startswith("samples")} for r in rows]
    fields = list(dict.fromkeys(k for r in flat for k in r))
    with open(base + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(flat)
    with open(base + ".json", "w") as f:
        json.dump(dict(meta, rows=rows), f, indent=1)


def run_own_section(name, cases, args, device):
    """A section with tables of its own (bench --fused, --large-n): every case
    of `cases` ([(label, run)], run() -> the case's rows), a progress step a
    case, the rows written to args.out as bench_<dtype>_<name>.csv / .json
    (<name>-chain with --chain, so that a chained run keeps the plain one's).
    Returns (rows, base path, seconds)."""
    t_start = time.perf_counter()
    rows = []
    progress = Progress(len(cases), len(cases))
    try:
        for i, (label, run) in enumerate(cases):
            progress.case(i, name, label)
            rows += run()
            progress.round_done()
    finally:
        progress.close()
    elapsed = time.perf_counter() - t_start
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"bench_{args.dtype}_{name}{'-chain' if args.chain else ''}")
    write_outputs(rows, base, dict(device=device_name(device), dtype=args.dtype, sections=[name],
                                   calls=args.calls, chain=args.chain, repeats=args.repeats,
                                   quick=args.quick,
                                   seconds=elapsed))
    return rows, base, elapsed


def print_impl_table(rows, kind):
    """The table/sweep layout: one line per figure."""
    hdr = (f"{'dir':4} {'M x N':>13} {'impl':14} {'us median [min-max]':>24} "
           f"{'us/1-eval':>9} {'GB/s':>6} {'% ceil':>7} {'x builtin [min-max]':>20}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if r["kind"] != kind:
            continue
        x = r.get("speedup_vs_builtin")
        ratio = spread(x, r["speedup_min"], r["speedup_max"], "{:.2f}") if x else ""
        print(f"{r['direction']:4} {r['shape']:>13} {r['impl']:14} "
              f"{spread(r['us'], r['us_min'], r['us_max']):>24} {r['us_single']:9.1f} "
              f"{r['gbs']:6.0f} {r['pct_ceiling']:6.1f}% {ratio:>20}")


def print_direction_table(rows, kind, direction, count_build=False):
    """Training/decode layout: one line per shape, ours next to the built-in."""
    shapes = list(dict.fromkeys(r["shape"] for r in rows
                                if r["kind"] == kind and r["direction"] == direction))
    if not shapes:
        return
    first = get(rows, kind, shapes[0], direction, "ours")
    # LayerNorm's sections time our RMSNorm on the same tensors too
    rms = get(rows, kind, shapes[0], direction, OUR_RMS_NORM) is not None
    what = "us per call incl. graph building" if count_build else "us per call"
    print(f"\n{kind}, {DIRECTION_TITLE[direction]}: {what}, {per_eval(first['calls'], first.get('chain'))}, "
          f"median [min-max] of {first['repeats']} interleaved repeats; "
          f"ratio = built-in / ours; ceiling = {CEILING[direction]}"
          + ("; / RMS = ours / our RMSNorm on the same tensors" if rms else ""))
    hdr = (f"{'shape':>14} {'ours':>22} {'mx.fast':>22} {'ratio':>18} "
           f"{'ours %ceil':>10} {'mx %ceil':>9} {'ceil us':>8} {'1-eval ours':>11} {'1-eval mx':>9}"
           + (f" {'our RMSNorm':>22} {'/ RMS':>6}" if rms else ""))
    print(hdr)
    print("-" * len(hdr))
    for s in shapes:
        o = get(rows, kind, s, direction, "ours")
        b = get(rows, kind, s, direction, BUILTIN)
        line = (f"{s:>14} {spread(o['us'], o['us_min'], o['us_max']):>22} "
                f"{spread(b['us'], b['us_min'], b['us_max']):>22} "
                f"{spread(o['speedup_vs_builtin'], o['speedup_min'], o['speedup_max'], '{:.2f}'):>18} "
                f"{o['pct_ceiling']:9.0f}% {b['pct_ceiling']:8.0f}% {o['ceiling_us']:8.1f} "
                f"{o['us_single']:11.1f} {b['us_single']:9.1f}")
        if rms:
            r = get(rows, kind, s, direction, OUR_RMS_NORM)
            line += f" {spread(r['us'], r['us_min'], r['us_max']):>22} {o['us'] / r['us']:6.2f}"
        print(line)


def plot(rows, path, title, specs):
    """One panel per (section, direction), in the order of `specs` (the
    registry's {name: Section}): every shape's contenders as % of the
    ceiling, median with a min-max bar. Returns False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return False
    present = {(r["kind"], r["direction"]) for r in rows}
    panels = [(k, d) for k in specs for d in DIRECTION_TITLE if (k, d) in present]
    width = max(8.0, 0.28 * max(len({r["shape"] for r in rows if (r["kind"], r["direction"]) == p})
                                for p in panels))
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, 3.2 * len(panels)), squeeze=False)
    colors = {"ours": "tab:blue", "ours auto": "tab:blue", "ours naive": "tab:green",
              BUILTIN: "tab:orange", OUR_RMS_NORM: "tab:purple"}
    for ax, (kind, direction) in zip(axes[:, 0], panels):
        shapes = list(dict.fromkeys(r["shape"] for r in rows
                                    if r["kind"] == kind and r["direction"] == direction))
        xs = range(len(shapes))
        impls = list(dict.fromkeys(r["impl"] for r in rows if r["kind"] == kind
                                   and r["direction"] == direction
                                   and not r["impl"].startswith("ceiling")))
        for j, impl in enumerate(impls):
            pts = [get(rows, kind, s, direction, impl) for s in shapes]
            off = (j - (len(impls) - 1) / 2) * 0.25
            med = [p["pct_ceiling"] for p in pts]
            err = [[m - p["pct_ceiling_min"] for m, p in zip(med, pts)],
                   [p["pct_ceiling_max"] - m for m, p in zip(med, pts)]]
            ax.errorbar([x + off for x in xs], med, yerr=err, fmt="o", ms=3, capsize=2,
                        color=colors.get(impl), label=impl)
        ax.axhline(100, color="gray", lw=0.8, ls="--")
        # a noisy repeat's bar must not squash the medians into a line
        ax.set_ylim(0, max(110, min(ax.get_ylim()[1], 160)))
        ax.set_xticks(list(xs))
        ax.set_xticklabels(shapes, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("% of ceiling")
        what = " (us incl. graph building)" if specs[kind].count_build else ""
        ax.set_title(f"{kind}: {DIRECTION_TITLE[direction]}, vs {CEILING[direction]}{what}",
                     fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
