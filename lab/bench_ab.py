"""Variants of plan rows through MLX, side by side: the table of a bench-ab run.

`bash scripts/gpu_run.sh bench-ab` (AB_PATCHES=a.patch b.patch ...) builds
the tree and each patched copy of it on the GPU machine, runs the benchmark's
sections with each build in turn, chained (each call takes the previous
call's output, as a model's layers do) twice and side by side once, and
leaves one log a build, mode and round: OUT/ab/<build>-<mode>-<round>.log.
This reads those logs and prints, per table and shape, each build's median
us a call per run and, where the table has the column, ours / our RMSNorm:

    python -m lab.bench_ab OUT/ab
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re

# "ln_training, backward (gx and gw): us per call, ..." opens a table
TITLE = re.compile(r"^(\w+), ([^:]+): us per call")
# a row: the shape, then "median [min-max]" figures; "/ RMS" is the last column
ROW = re.compile(r"^\s+(\d+x\d+(?:x\d+)?)\s+([\d.]+) \[")


def read_log(path):
    """{(table, shape): (ours median us, ours / RMS or None)} of one log."""
    out, table, has_rms = {}, None, False
    for line in path.read_text().splitlines():
        title = TITLE.match(line)
        if title:
            table, has_rms = f"{title[1]}, {title[2]}", "/ RMS" in line
            continue
        row = ROW.match(line)
        if row and table:
            rms = float(line.split()[-1]) if has_rms else None
            out[(table, row[1])] = (float(row[2]), rms)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=pathlib.Path, help="OUT/ab of a bench-ab run")
    args = p.parse_args(argv)
    runs = collections.defaultdict(dict)  # (table, shape) -> {(build, mode, round): figures}
    builds = []
    for log in sorted(args.folder.glob("*.log")):
        build, mode, rnd = log.stem.rsplit("-", 2)
        if build not in builds:
            builds.insert(0 if build == "tree" else len(builds), build)
        for key, fig in read_log(log).items():
            runs[key][(build, mode, rnd)] = fig
    if not runs:
        raise SystemExit(f"no benchmark tables in {args.folder}")
    print("us a call (ours / our RMSNorm where the table has it), chained runs then side by side")
    for table in dict.fromkeys(t for t, _ in runs):
        print(f"\n{table}")
        print(f"{'shape':>12}  " + "  ".join(f"{b:>30}" for b in builds))
        for (t, shape), figs in runs.items():
            if t != table:
                continue
            cells = []
            for b in builds:
                parts = [f"{us:.1f}" + (f" ({rms:.2f})" if rms is not None else "")
                         for (bb, mode, rnd), (us, rms) in sorted(figs.items(),
                                                                   key=lambda kv: kv[0][1:])
                         if bb == b]
                cells.append(" ".join(parts))
            print(f"{shape:>12}  " + "  ".join(f"{c:>30}" for c in cells))


if __name__ == "__main__":
    main()
