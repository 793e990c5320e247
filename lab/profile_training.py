"""Kernel times at the shapes training calls, under Nsight Compute: ours and
the built-in, forward, backward (gx and gw) and gx-only backward, with the
x + g copy as the ceiling. One process for all shapes; a tiny `sin` marks
where each contender starts, so the report can be split afterwards:

    ncu --clock-control none --csv --metrics gpu__time_duration.sum,\
dram__throughput.avg.pct_of_peak_sustained_elapsed \
        python3 -m lab.profile_training > ncu.csv
    python3 -m lab.profile_training --report ncu.csv
On the GPU machine, by scripts/gpu_run.sh (step ncu) or by hand.
"""

import csv
import os
import sys
from collections import defaultdict

SHAPES = [(8192, 1024), (8192, 2048), (8192, 2560), (8192, 4096), (4096, 8192),
          (8192, 5120), (16384, 896), (16384, 3584), (32768, 1024),
          (131072, 128), (262144, 128), (65536, 64), (16384, 8192)]
# PROFILE_SHAPES="32768x4096,8192x5120" profiles those instead.
if os.environ.get("PROFILE_SHAPES"):
    SHAPES = [tuple(int(v) for v in s.split("x"))
              for s in os.environ["PROFILE_SHAPES"].split(",")]
REPS = 3
EPS = 1e-5


def contenders(mx, ours, builtin, w):
    def vjp(norm, with_w):
        if with_w:
            return lambda x, g: mx.vjp(lambda x, w: norm(x, w, EPS), [x, w], [g])[1]
        return lambda x, g: mx.vjp(lambda x: norm(x, w, EPS), [x], [g])[1]

    return {
        "ceiling x+g": lambda x, g: x + g,
        "fwd ours": lambda x, g: ours(x, w, EPS),
        "fwd builtin": lambda x, g: builtin(x, w, EPS),
        "bwd ours": vjp(ours, True),
        "bwd builtin": vjp(builtin, True),
        "gx-only ours": vjp(ours, False),
        "gx-only builtin": vjp(builtin, False),
    }


# ncu reports durations in the unit it finds readable; the report prints us.
US_PER_UNIT = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0,
               "ms": 1e3, "msecond": 1e3}


def run():
    import mlx.core as mx

    import mlx_rmsnorm

    for m, n in SHAPES:
        x = mx.random.normal((m, n)).astype(mx.bfloat16)
        g = mx.random.normal((m, n)).astype(mx.bfloat16)
        w = (1 + 0.1 * mx.random.normal((n,))).astype(mx.bfloat16)
        mx.eval(x, g, w)
        for name, fn in contenders(mx, mlx_rmsnorm.rms_norm, mx.fast.rms_norm, w).items():
            mx.eval(mx.sin(mx.array([1.0])))
            # On stdout, where ncu writes its CSV too: the report takes the
            # case names from there (so PROFILE_SHAPES need not be repeated).
            print(f"CASE {m}x{n} {name}", flush=True)
            for _ in range(REPS):
                mx.eval(fn(x, g))
        del x, g, w
        mx.clear_cache()
    mx.eval(mx.sin(mx.array([1.0])))


def report(path):
    with open(path) as f:
        text = f.readlines()
    names = [l[len("CASE "):].strip() for l in text if l.startswith("CASE ")]
    if not names:
        sys.exit(f"{path}: no CASE lines; profile with this script's stdout into the file")
    kernels = defaultdict(dict)  # id -> {name, us, dram}
    lines = [l for l in text if l.startswith('"')]
    for row in csv.DictReader(lines):
        k = kernels[int(row["ID"])]
        k["name"] = row["Kernel Name"]
        v = float(row["Metric Value"].replace(",", ""))
        if row["Metric Name"] == "gpu__time_duration.sum":
            k["us"] = v * US_PER_UNIT[row["Metric Unit"]]
        else:
            k["dram"] = v
    seq = [kernels[i] for i in sorted(kernels)]
    segments, cur = [], None
    for k in seq:
        if "Sin" in k["name"] or "sin" in k["name"].split("<")[0]:
            cur = []
            segments.append(cur)
        elif cur is not None:
            cur.append(k)
    segments = segments[:len(names)]
    print(f"{'case':36} {'us':>8} {'DRAM%':>6}  kernels (last rep)")
    for name, seg in zip(names, segments):
        per = len(seg) // REPS if seg else 0
        last = seg[-per:] if per else []
        us = sum(k.get("us", 0) for k in last)
        dram = max((k.get("dram", 0) for k in last), default=0)
        short = ", ".join(f"{k['name'].split('(')[0].split('<')[0][-28:]} {k.get('us', 0):.1f}"
                          for k in last)
        print(f"{name:36} {us:8.1f} {dram:6.1f}  {short}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) > 1 and argv[0] == "--report":
        report(argv[1])
    else:
        run()


if __name__ == "__main__":
    main()
