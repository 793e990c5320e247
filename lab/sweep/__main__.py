"""python -m lab.sweep: the command line of the architecture sweep (the
package's docstring says what it runs and how it judges)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

# the runner first: it sets the environment the plugin reads at its import
from .runner import DTYPES, WORKER_MARK, sweep, sweep_one  # isort: skip

import mlx.core as mx

from . import __doc__ as SWEEP_DOC
from .configs import QUICK, discover
from .judge import mismatches
from .report import _fmt, markdown, write


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.sweep", description=SWEEP_DOC.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    ap.add_argument("--models", default="", help="comma-separated module names")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--out", default="", help="folder for arch_sweep.csv / .json")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--in-process", action="store_true",
                    help="run every model in this process (a model that crashes ends the sweep)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="models swept at once, each in its own process (default 1)")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)  # one model, rows as JSON
    a = ap.parse_args(argv)
    dtypes = [d for d in a.dtypes.split(",") if d]
    for d in dtypes:
        if d not in DTYPES:
            ap.error(f"--dtypes: {d!r} is not one of {', '.join(DTYPES)}")
    if "bfloat16" in dtypes:  # judged against the built-in's float32 run: that one first
        dtypes = ["float32"] + [d for d in dtypes if d != "float32"]
    if a.worker:
        def phase(text: str) -> None:
            print(f"phase: {text}", file=sys.stderr, flush=True)

        rows = sweep_one(a.worker, dtypes, progress=phase)
        print(WORKER_MARK + json.dumps(rows, default=_fmt), flush=True)
        return 0
    names = discover()
    if a.models:
        wanted = [m for m in a.models.split(",") if m]
        unknown = [m for m in wanted if m not in names]
        if unknown:
            ap.error(f"--models: not in mlx_lm.models: {', '.join(unknown)}")
        names = wanted
    elif a.quick:
        names = QUICK
    print(f"mlx {mx.__version__}, device {mx.default_device()}, {len(names)} modules, dtypes {dtypes}",
          file=sys.stderr)
    rows = sweep(names, dtypes, show_progress=not a.no_progress, isolate=not a.in_process, jobs=a.jobs)
    print(markdown(rows, dtypes))
    if a.out:
        write(rows, dtypes, a.out)
    bad = mismatches(rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
