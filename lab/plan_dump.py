"""The launch plans of a build's planners on a model GPU, with no GPU
(lab/plan_dump.cu): for each op, direction, dtype pairing, row length, row
count and switch, every call the plan makes (kernel symbol, grid, block,
dynamic shared memory, cluster), for the plan families 90, 80 and 75. Two
builds that print the same lines pick the same kernels the same way; with
lab/sass_compare.py (the kernels' machine code) this checks a refactor of the
planners on a machine without a GPU:

    cmake -S cuda -B BUILD -DMLX_RMSNORM_CUDA_ARCHS="80-real;90-real"
    cmake --build BUILD --target rmsnorm_kernels
    python -m lab.plan_dump BUILD --out plans.txt

The model GPU's answers (occupancy, clusters) are not a real GPU's: read the
plans to compare builds, not as a GPU's plans. The program's --check mode
(every plan well formed, no dump) is what .ci/run runs.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def build(build_dir: str) -> str:
    objs = os.path.join(build_dir, "CMakeFiles", "rmsnorm_kernels.dir")
    exe = os.path.join(build_dir, "plan_dump")
    subprocess.run(
        ["nvcc", "-std=c++17", "-O1", "-I", os.path.join(ROOT, "cuda"),
         "-o", exe, os.path.join(HERE, "plan_dump.cu")]
        + [os.path.join(objs, f"{name}.cu.o") for name in ("forward", "backward", "layer_norm")],
        check=True)
    return exe


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build_dir", help="a cmake build of cuda/ (rmsnorm_kernels built)")
    ap.add_argument("--out", help="write the plans here (default: stdout)")
    args = ap.parse_args(argv)
    exe = build(args.build_dir)
    # The kernels' host stubs are local symbols: name the program's
    # "@0x<offset>" by the executable's own symbol table.
    nm = subprocess.run(["nm", "--defined-only", exe], check=True, capture_output=True,
                        text=True).stdout
    names = {}
    for line in nm.splitlines():
        addr, kind, name = line.split(maxsplit=2)
        if kind in "tTwW" and not name.endswith(".cold"):
            names[f"@0x{int(addr, 16):x}"] = name
    out = open(args.out, "w") if args.out else sys.stdout
    for family in (90, 80, 75):
        out.write(f"# family {family}\n")
        env = dict(os.environ, PLAN_DUMP_FAMILY=str(family))
        text = subprocess.run([exe], env=env, check=True, capture_output=True, text=True).stdout
        out.write(re.sub(r"@0x[0-9a-f]+", lambda m: names.get(m.group(0), m.group(0)), text))
    if args.out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
