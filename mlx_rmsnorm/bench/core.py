"""What every section shares: the inputs, the interleaved timing, the copy
ceiling, the statistics of a case's rows, the progress bar.

Timing: every figure is taken `repeats` times with the contenders of a shape
interleaved (each round times every contender once, round-robin, the starting
contender rotating), after one discarded warm-up round. Two ways: `calls`
independent calls in one mx.eval (kernel time: MLX's per-eval cost amortised;
inputs rotate over buffers totalling more than 64 MiB so the L2 does not
serve them) and one call per mx.eval (the latency of a lone call). With
`chain` each of the `calls` takes the previous call's output (y, gx) as its
x, as a model's layers do: MLX cannot run two calls of a figure side by
side, which independent calls let it do (at long rows LayerNorm's backward
overlaps its neighbours there). Graph
building is timed apart and left out of both, except in a section whose
figure counts it (decode: tiny tensors, where building the graph is the cost).

Ceiling: the same bytes through MLX's simplest elementwise kernel with the
same read:write mix (backward: x + g, 2 reads and 1 write; forward: -x, 1 read
and 1 write), in the same rounds. % of ceiling = ceiling time / contender time.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import mlx.core as mx

from .. import rms_norm

# MLX's own functions even while patch() is on (MLX_RMSNORM_PATCH=1 patches
# at start-up): the built-in column must never time the plugin.
from .._patching import BUILTIN as builtin_rms_norm
from .._patching import BUILTIN_LAYER_NORM as builtin_layer_norm

EPS = 1e-5
L2_BYTES = 64 << 20  # rotate inputs over more than the L2 (50 MiB on H100/H200)
MAX_SETS = 16

# Figure names of each direction: the ceiling and the built-in are what the
# others are divided by.
CEILING = {"fwd": "ceiling (-x)", "bwd": "ceiling (x+g)", "bwd_gx": "ceiling (x+g)"}
BUILTIN = "mx.fast"
# A section's figure of our RMSNorm on the same tensors (LayerNorm's): the
# tables then show ours / it.
OUR_RMS_NORM = "our RMSNorm"
DIRECTION_TITLE = {
    "fwd": "forward",
    "bwd": "backward (gx and gw)",
    "bwd_gx": "backward, gx only (frozen weight)",
}


@dataclass(frozen=True)
class Section:
    """One section of the benchmark: its shapes, its contenders
    (direction, impl, fn(x, g)) with a ceiling and the built-in per direction
    (CEILING, BUILTIN and DIRECTION_TITLE name the directions), and how its
    table is printed. A module under mlx_rmsnorm/bench/ defines its sections
    in a dict SECTIONS; registry.MODULES lists the modules."""
    shapes: Callable[[], list]  # a full run's shapes: (M, N) or (rows, heads, N)
    quick: list  # a few tiny shapes (CI, CPU)
    contenders: Callable  # (w, gpu: bool) -> [(direction, impl, fn(x, g))]
    layout: str = "direction"  # "direction": ours beside the built-in; "impl": a line per figure
    count_build: bool = False  # the figure includes graph building (host-bound shapes)
    min_calls: int = 0  # at least this many calls per eval
    title: str = ""
    default: bool = True  # part of a run that names no section
    op: str = "RMSNorm"  # the op it times (the plot's title)
    about: str = ""  # one paragraph for --help


class Progress:
    """One bar over every round of every case (a round times each contender
    of a case once), so it moves within a long case too; the description
    names the case. A plain line per case without tqdm."""

    def __init__(self, total, n_cases):
        self.n_cases = n_cases
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="round", file=sys.stderr, dynamic_ncols=True)
        except ImportError:  # progress is a nicety, never a requirement
            self.bar = None

    def case(self, i, kind, label):
        text = f"case {i + 1}/{self.n_cases}: {kind} {label}"
        if self.bar is not None:
            self.bar.set_description(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def round_done(self):
        if self.bar is not None:
            self.bar.update(1)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def device_name(device):
    """A readable name: the GPU's own (e.g. "NVIDIA H200"), or the CPU's."""
    if device == mx.gpu:
        try:
            return str(mx.device_info().get("device_name") or "GPU")
        except Exception:
            return "GPU"
    return f"CPU ({platform.machine() or 'unknown'}, {os.cpu_count()} threads)"


# ---------------------------------------------- RMSNorm contenders, shared

def vjp_both(norm, w):
    """gx and gw as mx.grad gets them: the norm differentiated by mx.vjp."""
    def f(x, g):
        return mx.vjp(lambda x, w: norm(x, w, EPS), [x, w], [g])[1]
    return f


def vjp_gx(norm, w):
    """gx alone (a frozen weight, LoRA): mx.vjp over x only."""
    def f(x, g):
        return mx.vjp(lambda x: norm(x, w, EPS), [x], [g])[1]
    return f


def bias_like(w):
    """A bias in w's dtype, as a checkpoint holds one (evaluated): the bias of
    every LayerNorm figure."""
    b = (0.1 * (w - 1)).astype(w.dtype)
    mx.eval(b)
    return b


def fwd_figures(w):
    """The forward's ceiling, ours and the built-in."""
    return [("fwd", CEILING["fwd"], lambda x, g: -x),
            ("fwd", "ours", lambda x, g: rms_norm(x, w, EPS)),
            ("fwd", BUILTIN, lambda x, g: builtin_rms_norm(x, w, EPS))]


# ------------------------------------------------------------------- timing

def rotating_sets(set_bytes):
    """How many input sets of `set_bytes` a figure rotates over: enough that
    they total more than the L2 (at least 2, at most MAX_SETS)."""
    return max(2, min(MAX_SETS, -(-L2_BYTES // set_bytes) + 1))


def copy_rates(tensor, neg_us, add_us):
    """The copy rate of each round, in bytes per us, from the ceilings' us on
    tensors of `tensor` bytes: the faster of -x (two tensors) and x + g
    (three)."""
    return [max(2 * tensor / a, 3 * tensor / c) for a, c in zip(neg_us, add_us)]


def inputs(shape, dtype, n_sets):
    """`n_sets` (x, g) pairs of `shape` and a weight, seeded by the shape."""
    seed = 1
    for d in shape:
        seed = seed * 131 + d
    key = mx.random.key(seed % (1 << 31))
    sets = []
    for _ in range(n_sets):
        kx, kg, key = mx.random.split(key, 3)
        sets.append((mx.random.normal(shape, key=kx).astype(dtype),
                     mx.random.normal(shape, key=kg).astype(dtype)))
    # weight in x's dtype, as in a bf16 checkpoint (the built-in's fast path)
    w = (1 + 0.1 * mx.random.normal((shape[-1],), key=key)).astype(dtype)
    mx.eval(sets, w)
    return sets, w


def per_eval(calls, chain):
    """How a figure's calls were timed, for the tables' headers."""
    return f"{calls} {'chained ' if chain else ''}calls per eval"


def chained(out, x):
    """The output of a call that the next call of a chain takes as its x: the
    first of x's shape and dtype (y, h's partner y, gx, the ceiling's)."""
    for a in out if isinstance(out, (list, tuple)) else [out]:
        if isinstance(a, mx.array) and a.shape == x.shape and a.dtype == x.dtype:
            return a
    raise ValueError(f"a chained figure must return an array of x's shape {x.shape} and dtype {x.dtype}")


def sample_many(fn, sets, calls, chain=False):
    """(build, eval) seconds per call with `calls` calls in one mx.eval;
    `chain`: each call's x is the previous call's output (chained)."""
    t0 = time.perf_counter()
    outs = []
    for i in range(calls):
        args = sets[i % len(sets)]
        if chain and outs:
            args = (chained(outs[-1], args[0]), *args[1:])
        outs.append(fn(*args))
    t1 = time.perf_counter()
    mx.eval(outs)
    t2 = time.perf_counter()
    return (t1 - t0) / calls, (t2 - t1) / calls


def sample_single(fn, sets, i):
    """Seconds of one call in its own mx.eval (graph building not counted)."""
    out = fn(*sets[i % len(sets)])
    t0 = time.perf_counter()
    mx.eval(out)
    return time.perf_counter() - t0


def time_interleaved(figures, sets, calls, repeats, singles, on_round=None, chain=False):
    """Samples for every figure: {index: dict(build=[], many=[], single=[])}.
    Round 0 is a warm-up (plans, kernel handles, MLX's graph cache, our pool's
    cache) and is dropped; each later round times every figure once, in an
    order that starts one further along each round, so no figure always runs
    right after the same neighbour."""
    k = len(figures)
    samples = {i: dict(build=[], many=[], single=[]) for i in range(k)}
    for r in range(repeats + 1):
        order = [(r + j) % k for j in range(k)]
        round_ = {i: dict(build=[], many=[], single=[]) for i in range(k)}
        for i in order:
            b, e = sample_many(figures[i], sets, calls, chain)
            round_[i]["build"].append(b)
            round_[i]["many"].append(e)
        for s in range(singles):
            for i in order:
                round_[i]["single"].append(sample_single(figures[i], sets, r * singles + s))
        if r > 0:
            for i in range(k):
                for key in ("build", "many", "single"):
                    samples[i][key] += round_[i][key]
        if on_round is not None:
            on_round()
    return samples


def stats(values):
    """Median, min, max and quartiles."""
    v = sorted(values)
    if len(v) >= 2:
        q1, _, q3 = statistics.quantiles(v, n=4, method="inclusive")
    else:
        q1 = q3 = v[0]
    return dict(med=statistics.median(v), min=v[0], max=v[-1], q1=q1, q3=q3)


def run_case(kind, spec, shape, dtype, calls, repeats, singles, device, on_round=None, chain=False):
    """The rows of one shape of section `kind` (its Section `spec`): every
    contender's figures against the ceiling and the built-in of its
    direction; `chain`: the calls of an eval chained (sample_many)."""
    size = dtype.size
    numel = 1
    for d in shape:
        numel *= d
    tensor = numel * size
    n = shape[-1]
    calls = max(calls, spec.min_calls)
    if spec.count_build:  # tiny tensors: the L2 holds them anyway
        n_sets = 4
    else:
        n_sets = rotating_sets(tensor)
    bytes_of = {"fwd": 2 * tensor + n * size, "bwd": 3 * tensor + 2 * n * size,
                "bwd_gx": 3 * tensor + n * size}
    with mx.stream(device):
        sets, w = inputs(shape, dtype, n_sets)
        figs = spec.contenders(w, device == mx.gpu)
        samples = time_interleaved([f for _, _, f in figs], sets, calls, repeats, singles, on_round, chain)
    del sets, w
    mx.clear_cache()
    trim()

    label = "x".join(str(d) for d in shape)
    m = numel // n
    # Decode: the host's graph building is the cost a generation step pays
    # for every call, so it is part of the figure there.
    timing = "build+eval" if spec.count_build else "eval"
    per_repeat = {}
    for i, (direction, impl, _) in enumerate(figs):
        s = samples[i]
        us = [1e6 * (b + e) if spec.count_build else 1e6 * e for b, e in zip(s["build"], s["many"])]
        per_repeat[direction, impl] = us
    # gx-only shares the backward's ceiling (same bytes but gw, which is tiny)
    for direction in ("bwd_gx",):
        if any(d == direction for d, _, _ in figs):
            per_repeat[direction, CEILING[direction]] = per_repeat["bwd", CEILING["bwd"]]

    rows = []
    for i, (direction, impl, _) in enumerate(figs):
        s = samples[i]
        us = per_repeat[direction, impl]
        st = stats(us)
        single = stats([1e6 * t for t in s["single"]])
        ceil_us = per_repeat[direction, CEILING[direction]]
        builtin_us = per_repeat.get((direction, BUILTIN))
        pct = [100 * c / u for c, u in zip(ceil_us, us)]
        row = dict(kind=kind, direction=direction, impl=impl, shape=label, M=m, N=n,
                   dtype=str(dtype).split(".")[-1], bytes=bytes_of[direction],
                   calls=calls, chain=chain, repeats=len(us), timing=timing,
                   us=st["med"], us_min=st["min"], us_max=st["max"],
                   us_q1=st["q1"], us_q3=st["q3"],
                   us_build=1e6 * statistics.median(s["build"]),
                   us_single=single["med"], us_single_min=single["min"],
                   us_single_max=single["max"],
                   gbs=bytes_of[direction] / st["med"] / 1e3,
                   ceiling_us=statistics.median(ceil_us),
                   pct_ceiling=100 * statistics.median(ceil_us) / st["med"],
                   pct_ceiling_min=min(pct), pct_ceiling_max=max(pct))
        if builtin_us is not None:
            ratios = [b / u for b, u in zip(builtin_us, us)]
            row.update(speedup_vs_builtin=statistics.median(builtin_us) / st["med"],
                       speedup_min=min(ratios), speedup_max=max(ratios))
        row["samples_us"] = us
        row["samples_single_us"] = [1e6 * t for t in s["single"]]
        rows.append(row)
    return rows


def trim():
    # our pool caches freed blocks up to the most ever live: give a large
    # shape's blocks back before the next shape (its warm-up round refills)
    try:
        from .. import trim_device_memory

        trim_device_memory()
    except Exception:  # not in every build; a nicety
        pass
