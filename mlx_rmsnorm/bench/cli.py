"""The command line of `python -m mlx_rmsnorm.bench`."""

from __future__ import annotations

import argparse
import os
import textwrap
import time

import mlx.core as mx

from .core import DIRECTION_TITLE, Progress, device_name, per_eval, run_case
from .output import plot, print_direction_table, print_impl_table, write_outputs
from .registry import SECTION_SPECS, SECTIONS, cases

USAGE = """\
Benchmark mlx-rmsnorm against MLX's built-in mx.fast.rms_norm (and
mx.fast.layer_norm, and MLX's add + norm for the fused residual add).

  python -m mlx_rmsnorm.bench                  the default sections, then generation
  python -m mlx_rmsnorm.bench --training       the training and decode shapes
  python -m mlx_rmsnorm.bench --sections ln_training,ln_table    LayerNorm
  python -m mlx_rmsnorm.bench --fused          the fused residual add + RMSNorm / LayerNorm
  python -m mlx_rmsnorm.bench --large-n        long rows (N 16384-262144): every op, % of the copy
                                               ceiling, QuACK's H200 figures beside ours
  python -m mlx_rmsnorm.bench --generate       mlx-lm generation alone
  python -m mlx_rmsnorm.bench.generation -h    the generation benchmark's own options

On a CPU the default is the quick cases (a few tiny shapes per section,
seconds to a minute); --full there runs every shape (hours). On a GPU with
the CUDA kernels the default is the full run. A progress bar on stderr moves
at every round of every case. A run that names no section ends with the
generation benchmark (prefill and per-token decode of mlx-lm models with
random weights: built-in, patch(), patch(fuse=True)).

Sections (* in a run that names none; --training = training,decode;
--no-sweep = table):
{sections}

--fused times the fused residual add + norm (add_rms_norm, add_layer_norm)
at the training shapes of the models patch(fuse=True) rewrites, forward and
backward, against MLX's add + the built-in norm and MLX's add + our norm
("fused x ours": what fusing alone gains), in its own tables and files, then
the accuracy of Gemma's norm (scale 1 + w) against float64. The LayerNorm
sections show our RMSNorm on the same tensors beside ours: LayerNorm moves
what RMSNorm moves, so ours / our RMSNorm is the figure to read.

Ceiling: the same bytes through MLX's simplest elementwise kernel with the
same read:write mix (backward: x + g, 2 reads and 1 write; forward: -x, 1 read
and 1 write), in the same run. % of ceiling = ceiling time / contender time.

Timing: every figure is taken --repeats times, with the contenders of a shape
interleaved (each repeat times every contender once, round-robin, the
starting contender rotating), after one discarded warm-up round; tables give
the median and [min-max]. Two ways: --calls independent calls in one mx.eval
(kernel time: MLX's per-eval cost amortised; inputs rotate over buffers
totalling more than 64 MiB so the L2 does not serve them) and one call per
mx.eval (the latency of a lone call; --singles of them per repeat). Graph
building is timed apart (us_build) and left out of both figures, except in
the decode section's many-calls figure. builtin/ours is the ratio of the
medians, its spread the range of the per-repeat ratios. Writes CSV, JSON
(with every sample) and a PNG (each shape's contenders as % of the ceiling)
to --out.
"""


def description():
    lines = []
    for name, spec in SECTION_SPECS.items():
        mark = "*" if spec.default else " "
        body = textwrap.wrap(spec.about or spec.title, 64)
        lines.append(f"  {name:11}{mark} {body[0]}")
        lines += [" " * 15 + line for line in body[1:]]
    return USAGE.format(sections="\n".join(lines))


def parse_shapes(text):
    """"8192x4096,1x8x128" -> [(8192, 4096), (1, 8, 128)]."""
    try:
        shapes = [tuple(int(v) for v in s.strip().lower().split("x"))
                  for s in text.split(",") if s.strip()]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) not in (2, 3) or min(s) < 1 for s in shapes):
        raise SystemExit(f"--shapes wants a comma list of MxN (or ROWSxHEADSxN), got {text!r}")
    return shapes


def parse_sections(args):
    if args.sections:
        sections = [s.strip() for s in args.sections.split(",") if s.strip()]
        bad = [s for s in sections if s not in SECTION_SPECS]
        if bad:
            raise SystemExit(f"unknown section(s) {bad}; choose from {list(SECTION_SPECS)}")
        return sections
    if args.training:
        return ["training", "decode"]
    if args.no_sweep:
        return ["table"]
    return list(SECTIONS)


def parser():
    p = argparse.ArgumentParser(prog="python -m mlx_rmsnorm.bench", description=description(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="a few small shapes per section (CI; the default on a CPU)")
    size.add_argument("--full", action="store_true",
                      help="every shape even on a CPU (hours there; the default on a GPU)")
    p.add_argument("--training", action="store_true", help="only the training and decode shapes")
    p.add_argument("--no-sweep", action="store_true", help="only the nine table shapes")
    p.add_argument("--sections", default="",
                   help=f"comma list from {','.join(SECTION_SPECS)}")
    p.add_argument("--shapes", default="", help="comma list of MxN (e.g. 8192x4096,32768x5120): "
                   "these shapes instead of each section's own")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--calls", type=int, default=20, help="calls per eval (kernel timing)")
    p.add_argument("--chain", action="store_true",
                   help="each call of an eval takes the previous call's output as its x, as a "
                        "model's layers do (no two calls side by side in MLX's graph)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved repeats per figure")
    p.add_argument("--singles", type=int, default=3, help="one-call evals per figure and repeat")
    p.add_argument("--out", default="bench-results", help="folder for CSV, JSON, PNG")
    p.add_argument("--generate", action="store_true", help="only the generation benchmark "
                   "(mlx-lm models, prefill and decode; python -m mlx_rmsnorm.bench.generation -h)")
    p.add_argument("--fused", action="store_true",
                   help="only the fused residual add + norm section (add_rms_norm, add_layer_norm)")
    p.add_argument("--large-n", action="store_true",
                   help="only the long-row section (also --sections large-n): rms_norm, layer_norm, "
                        "add_rms_norm, add_layer_norm forward and backward at N 16384-262144")
    p.add_argument("--peers", default=None, metavar="JSON",
                   help="--large-n: QuACK's figures timed on this GPU by python3 -m lab.peers "
                        "(torch), printed beside ours with the ratio")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    if args.generate:
        return run_generate(args)
    if args.sections.strip() == "large-n":  # a section with its own tables, like --fused
        args.large_n, args.sections = True, ""
    sections = parse_sections(args)
    shapes = parse_shapes(args.shapes) if args.shapes else None

    gpu = mx.is_available(mx.gpu)
    device = mx.gpu if gpu and _has_kernels() else mx.cpu
    dtype = getattr(mx, args.dtype)
    # The full run is hours of tiny-kernel timing on a CPU: there the quick
    # cases are the default, and the first line says so.
    quick = args.quick or (device == mx.cpu and not args.full and not shapes)
    if quick:
        args.calls, args.repeats, args.singles = min(args.calls, 4), min(args.repeats, 3), 1
    if args.large_n:
        from . import large_n

        args.quick = quick
        return large_n.run(args, device, dtype, shapes)
    if args.fused:
        from . import fused

        args.quick = quick
        print(f"device: {device_name(device)}, dtype: {args.dtype}, section: fused, "
              f"{per_eval(args.calls, args.chain)}, {args.repeats} interleaved repeats (+1 warm-up)")
        return fused.run(args, device, dtype, shapes)
    run = cases(sections, quick, shapes)
    if device == mx.cpu and quick and not args.quick:
        print(f"CPU run: the quick cases ({len(run)} tiny shapes, seconds to a minute); "
              f"--full runs all {len(cases(sections, False))} (hours on a CPU). "
              "The GPU figures are in docs/performance.md.")
    name = device_name(device)
    print(f"device: {name}, dtype: {args.dtype}, sections: {','.join(sections)}, "
          f"{len(run)} cases, {per_eval(args.calls, args.chain)}, {args.repeats} interleaved repeats "
          f"(+1 warm-up), {args.singles} one-call evals per repeat", flush=True)
    t_start = time.perf_counter()
    rows = []
    progress = Progress(len(run) * (args.repeats + 1), len(run))
    try:
        for i, (kind, shape) in enumerate(run):
            progress.case(i, kind, "x".join(map(str, shape)))
            rows += run_case(kind, SECTION_SPECS[kind], shape, dtype, args.calls, args.repeats,
                             args.singles, device, on_round=progress.round_done, chain=args.chain)
    finally:
        progress.close()
    elapsed = time.perf_counter() - t_start

    os.makedirs(args.out, exist_ok=True)
    suffix = "" if sections == SECTIONS else "_" + "-".join(sections)
    base = os.path.join(args.out, f"bench_{args.dtype}{suffix}")
    write_outputs(rows, base, dict(device=name, dtype=args.dtype, sections=sections,
                                   calls=args.calls, chain=args.chain, repeats=args.repeats, quick=quick,
                                   seconds=elapsed))
    ops = list(dict.fromkeys(SECTION_SPECS[s].op for s in sections))
    what = ops[0] if len(ops) == 1 else "RMSNorm"
    if plot(rows, base + ".png", f"{what} {args.dtype} on {name}: median and min-max of "
                                 f"{args.repeats} interleaved repeats", SECTION_SPECS):
        print(f"plot: {base}.png")
    # Tables in the registry's order, each in its section's layout.
    for kind, spec in SECTION_SPECS.items():
        if kind not in sections:
            continue
        if spec.layout == "impl":
            print(f"\n{spec.title or kind}: us per call, {per_eval(args.calls, args.chain)}, median [min-max] "
                  f"of {args.repeats} interleaved repeats")
            print_impl_table(rows, kind)
        else:
            for direction in DIRECTION_TITLE:
                print_direction_table(rows, kind, direction, spec.count_build)
    print(f"\nresults: {base}.csv, {base}.json ({elapsed:.0f} s)")
    if not (args.sections or args.training or args.no_sweep or args.shapes):
        run_generate(args, quick)  # the whole benchmark ends with the user's view: generation
    return 0


def run_generate(args, quick=None):
    from . import generation

    if quick is None:  # --generate alone: quick where the other sections would be
        quick = args.quick or (not args.full and not (mx.is_available(mx.gpu) and _has_kernels()))
    return generation.main((["--quick"] if quick else []) + ["--out", args.out])


def _has_kernels():
    from .. import has_cuda_kernels

    return has_cuda_kernels()
