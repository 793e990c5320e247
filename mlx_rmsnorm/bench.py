"""Benchmark: mlx-rmsnorm against MLX's built-in mx.fast.rms_norm.

    python -m mlx_rmsnorm.bench [--training | --no-sweep | --sections LIST]
                                [--quick | --full] [--dtype bfloat16] [--out DIR]
    python -m mlx_rmsnorm.bench --generate [--quick] [--out DIR]

On a CPU, the default is the quick cases (a few tiny shapes per section,
seconds to a minute); --full there runs every shape (hours). On a GPU with our
kernels the default is the full run. A progress bar moves at every round of
every case (tqdm, on stderr). The default run (no section chosen) ends with
the generation benchmark (mlx_rmsnorm/bench_generate.py: prefill and
per-token decode of mlx-lm models, built-in vs patch()); --generate runs it
alone.

Sections (the default run has all four; --training = training,decode;
--no-sweep = table); each is one entry of SECTION_SPECS below:
  table     the nine reference shapes: ceiling, ours ("auto": rms_norm_vjp
            as the plan picks it; "naive": the three-kernel baseline chain, on
            the GPU only: the CPU path has one algorithm), mx.fast;
  sweep     M from 1024 to 65536 at N = 2048, 4096, 8192 (same contenders);
  training  the shapes a training step calls: M x N in {4096..32768} x
            {896..8192} and the QK-norm rows {65536..262144} x {64, 128, 256};
            forward, backward (gx and gw) and backward with gx only (a frozen
            weight), ours as mx.grad reaches it (mlx_rmsnorm.rms_norm under
            mx.vjp, not rms_norm_vjp directly) vs mx.fast.rms_norm under mx.vjp;
  ln_training, ln_table (asked for by name; not in the default run)
            LayerNorm with weight and bias, ours vs mx.fast.layer_norm:
            {8192, 16384, 32768} x {768..8192}, and the nine shapes.
  decode    the forward at text-generation shapes (1, 8, 64 rows of
            N = 1024-8192, and QK-norm rows of 128 for 8 and 32 heads): tiny
            tensors, where the host's cost of building and launching a call
            is the time, so the figure there counts graph building too.

--fused: the fused residual add + norm (add_rms_norm) at the training
shapes, forward and backward, against MLX add + built-in norm and MLX add +
our norm (fused_* functions below; its own tables and files).

Ceiling: the same bytes through MLX's simplest elementwise kernel with the
same read:write mix (backward: x + g, 2 reads and 1 write; forward: -x, 1 read
and 1 write), in the same run. % of ceiling = ceiling time / contender time.

Timing: every figure is taken `--repeats` times, with the contenders of a
shape interleaved (each repeat times every contender once, round-robin, the
starting contender rotating), after one discarded warm-up round; tables give
the median and [min-max]. Two ways: `--calls` independent calls in one
mx.eval (kernel time: MLX's per-eval cost amortised; inputs rotate over
buffers totalling more than 64 MiB so the L2 does not serve them) and one call
per mx.eval (the latency of a lone call; `--singles` of them per repeat).
Graph building is timed apart (us_build) and left out of both figures, except
in the decode section's many-calls figure. builtin/ours is the ratio of the
medians, its spread the range of the per-repeat ratios. Writes CSV, JSON
(with every sample) and a PNG (each shape's contenders as % of the ceiling).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import mlx.core as mx

from . import add_rms_norm, add_rms_norm_vjp, layer_norm, rms_norm, rms_norm_vjp

# MLX's own function even while patch() is on (MLX_RMSNORM_PATCH=1 patches at
# start-up): the built-in column must never time the plugin.
try:
    from ._patching import BUILTIN as _builtin_rms_norm
except ImportError:  # the patching state lived in __init__ before
    from . import _builtin_rms_norm
from ._patching import BUILTIN_LAYER_NORM as _builtin_layer_norm

# The nine shapes of the reference table (H200 numbers for QuACK, the
# built-in, Liger and torch were measured on these), then the M sweep.
SHAPES = [
    (16384, 8192), (16384, 4096), (32768, 2048), (65536, 1024), (262144, 128),
    (4096, 8192), (16384, 2880), (8192, 16384), (4096, 32768),
]
SWEEP_N = [2048, 4096, 8192]
SWEEP_M = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
# Tokens per GPU of a training step x the hidden sizes of common models
# (Qwen2.5-0.5B 896, Qwen3-0.6B 1024, ..., Llama-8B 4096, 14B 5120), then
# QK-norm: tokens x heads rows of the head dimension.
TRAIN_M = [4096, 8192, 16384, 32768]
TRAIN_N = [896, 1024, 2048, 2560, 3584, 4096, 5120, 8192]
QK_M = [65536, 131072, 262144]
QK_N = [64, 128, 256]
# Decode: (rows, N) for the hidden-size norms; (rows, heads, 128) for QK-norm
# (one token each of `rows` sequences, every head normalised).
DECODE_ROWS = [1, 8, 64]
DECODE_N = [1024, 2048, 4096, 8192]
DECODE_HEADS = [8, 32]
DECODE_HEAD_DIM = 128

# LayerNorm (issue 24): sections asked for by name (--sections
# ln_training,ln_table), not part of the default run; see the LayerNorm
# functions below.
LN_TRAIN_M = [8192, 16384, 32768]
LN_TRAIN_N = [768, 1024, 1280, 2048, 2560, 4096, 5120, 8192]

EPS = 1e-5
L2_BYTES = 64 << 20  # rotate inputs over more than the L2 (50 MiB on H100/H200)
MAX_SETS = 16
DECODE_CALLS = 64  # a decode step makes ~100 norm calls between evals

# Figure names of each (kind, direction): the ceiling and the built-in are
# what the others are divided by.
CEILING = {"fwd": "ceiling (-x)", "bwd": "ceiling (x+g)", "bwd_gx": "ceiling (x+g)"}
BUILTIN = "mx.fast"
DIRECTION_TITLE = {
    "fwd": "forward",
    "bwd": "backward (gx and gw)",
    "bwd_gx": "backward, gx only (frozen weight)",
}


class _Progress:
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


# ---------------------------------------------------------------- contenders

def _vjp_both(norm, w):
    """gx and gw as mx.grad gets them: the norm differentiated by mx.vjp."""
    def f(x, g):
        return mx.vjp(lambda x, w: norm(x, w, EPS), [x, w], [g])[1]
    return f


def _vjp_gx(norm, w):
    """gx alone (a frozen weight, LoRA): mx.vjp over x only."""
    def f(x, g):
        return mx.vjp(lambda x: norm(x, w, EPS), [x], [g])[1]
    return f


def _fwd_figures(w):
    return [("fwd", CEILING["fwd"], lambda x, g: -x),
            ("fwd", "ours", lambda x, g: rms_norm(x, w, EPS)),
            ("fwd", BUILTIN, lambda x, g: _builtin_rms_norm(x, w, EPS))]


# ------------------------------------------------------- LayerNorm (issue 24)
# The same timing and tables as RMSNorm's training section; contenders are
# mlx_rmsnorm.layer_norm and mx.fast.layer_norm with a weight and a bias, as
# mx.grad reaches them (mx.vjp of the forward), and the ceilings on the same
# bytes (bwd: x + g; fwd: -x).

def ln_contenders(w, gpu):
    b = (0.1 * (w - 1)).astype(w.dtype)  # a bias in w's dtype, as in a checkpoint
    mx.eval(b)

    def both(norm):
        def f(x, g):
            return mx.vjp(lambda x, w, b: norm(x, w, b, EPS), [x, w, b], [g])[1]
        return f

    def gx_only(norm):
        def f(x, g):
            return mx.vjp(lambda x: norm(x, w, b, EPS), [x], [g])[1]
        return f

    return [("bwd", CEILING["bwd"], lambda x, g: x + g),
            ("bwd", "ours", both(layer_norm)),
            ("bwd", BUILTIN, both(_builtin_layer_norm)),
            ("bwd_gx", "ours", gx_only(layer_norm)),
            ("bwd_gx", BUILTIN, gx_only(_builtin_layer_norm)),
            ("fwd", CEILING["fwd"], lambda x, g: -x),
            ("fwd", "ours", lambda x, g: layer_norm(x, w, b, EPS)),
            ("fwd", BUILTIN, lambda x, g: _builtin_layer_norm(x, w, b, EPS))]


def _decode_contenders(w, gpu):
    return _fwd_figures(w)


def _training_contenders(w, gpu):
    return [("bwd", CEILING["bwd"], lambda x, g: x + g),
            ("bwd", "ours", _vjp_both(rms_norm, w)),
            ("bwd", BUILTIN, _vjp_both(_builtin_rms_norm, w)),
            ("bwd_gx", "ours", _vjp_gx(rms_norm, w)),
            ("bwd_gx", BUILTIN, _vjp_gx(_builtin_rms_norm, w))] + _fwd_figures(w)


def _table_contenders(w, gpu):
    figs = [("bwd", CEILING["bwd"], lambda x, g: x + g),
            ("bwd", "ours auto", lambda x, g: rms_norm_vjp(x, w, g, EPS))]
    if gpu:  # the CPU path has one algorithm: a naive row would time it twice
        figs.append(("bwd", "ours naive", lambda x, g: rms_norm_vjp(x, w, g, EPS, algorithm="naive")))
    return figs + [("bwd", BUILTIN, _vjp_both(_builtin_rms_norm, w))] + _fwd_figures(w)


def _training_shapes():
    return ([(m, n) for n in TRAIN_N for m in TRAIN_M]
            + [(m, n) for n in QK_N for m in QK_M])


def _decode_shapes():
    return ([(r, n) for n in DECODE_N for r in DECODE_ROWS]
            + [(r, h, DECODE_HEAD_DIM) for h in DECODE_HEADS for r in DECODE_ROWS])


@dataclass(frozen=True)
class Section:
    """One section of the benchmark. A new one (another op, another set of
    shapes) is one more entry in SECTION_SPECS: its shapes, its contenders
    (direction, impl, fn(x, g)) with a ceiling and the built-in per
    direction (CEILING, BUILTIN, DIRECTION_TITLE, BYTES name the
    directions), and how its table is printed."""
    shapes: Callable[[], list]  # a full run's shapes: (M, N) or (rows, heads, N)
    quick: list  # a few tiny shapes (CI, CPU)
    contenders: Callable  # (w, gpu: bool) -> [(direction, impl, fn(x, g))]
    layout: str = "direction"  # "direction": ours beside the built-in; "impl": a line per figure
    count_build: bool = False  # the figure includes graph building (host-bound shapes)
    min_calls: int = 0  # at least this many calls per eval
    title: str = ""
    default: bool = True  # part of a run that names no section


SECTION_SPECS = {
    "table": Section(lambda: list(SHAPES), [(256, 128), (128, 1024), (64, 4099)],
                     _table_contenders, layout="impl", title="nine shapes"),
    "sweep": Section(lambda: [(m, n) for n in SWEEP_N for m in SWEEP_M], [(64, 1024), (128, 1024)],
                     _table_contenders, layout="impl", title="sweep"),
    "training": Section(_training_shapes, [(128, 896), (64, 1024), (512, 64)],
                        _training_contenders, title="training"),
    "decode": Section(_decode_shapes, [(1, 1024), (8, 2048), (1, 8, 128)], _decode_contenders,
                      count_build=True, min_calls=DECODE_CALLS, title="decode"),
    "ln_training": Section(lambda: [(m, n) for n in LN_TRAIN_N for m in LN_TRAIN_M],
                           [(128, 768), (64, 1024)], ln_contenders,
                           title="LayerNorm training", default=False),
    "ln_table": Section(lambda: list(SHAPES), [(256, 128), (64, 4099)], ln_contenders,
                        title="LayerNorm nine shapes", default=False),
}
SECTIONS = [name for name, spec in SECTION_SPECS.items() if spec.default]
LN_SECTIONS = [name for name, spec in SECTION_SPECS.items() if name.startswith("ln_")]
QUICK = {name: spec.quick for name, spec in SECTION_SPECS.items()}


def contenders(kind, w, gpu=True):
    """[(direction, impl, fn(x, g))]: one shape's figures. The ceilings come
    first only for readability; every repeat rotates the order anyway."""
    return SECTION_SPECS[kind].contenders(w, gpu)


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


def cases(sections, quick, shapes=None):
    """[(kind, shape)] in run order; shape is (M, N) or (rows, heads, N).
    `shapes` replaces every section's own list."""
    out = []
    for kind in sections:
        spec = SECTION_SPECS[kind]
        chosen = shapes or (spec.quick if quick else spec.shapes())
        out += [(kind, tuple(s)) for s in chosen]
    return out


def _inputs(shape, dtype, n_sets):
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


# ------------------------------------------------------------------- timing

def _sample_many(fn, sets, calls):
    """(build, eval) seconds per call with `calls` calls in one mx.eval."""
    t0 = time.perf_counter()
    outs = [fn(*sets[i % len(sets)]) for i in range(calls)]
    t1 = time.perf_counter()
    mx.eval(outs)
    t2 = time.perf_counter()
    return (t1 - t0) / calls, (t2 - t1) / calls


def _sample_single(fn, sets, i):
    """Seconds of one call in its own mx.eval (graph building not counted)."""
    out = fn(*sets[i % len(sets)])
    t0 = time.perf_counter()
    mx.eval(out)
    return time.perf_counter() - t0


def time_interleaved(figures, sets, calls, repeats, singles, on_round=None):
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
            b, e = _sample_many(figures[i], sets, calls)
            round_[i]["build"].append(b)
            round_[i]["many"].append(e)
        for s in range(singles):
            for i in order:
                round_[i]["single"].append(_sample_single(figures[i], sets, r * singles + s))
        if r > 0:
            for i in range(k):
                for key in ("build", "many", "single"):
                    samples[i][key] += round_[i][key]
        if on_round is not None:
            on_round()
    return samples


def _stats(values):
    v = sorted(values)
    if len(v) >= 2:
        q1, _, q3 = statistics.quantiles(v, n=4, method="inclusive")
    else:
        q1 = q3 = v[0]
    return dict(med=statistics.median(v), min=v[0], max=v[-1], q1=q1, q3=q3)


def run_case(kind, shape, dtype, calls, repeats, singles, device, on_round=None):
    spec = SECTION_SPECS[kind]
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
        n_sets = max(2, min(MAX_SETS, -(-L2_BYTES // tensor) + 1))
    bytes_of = {"fwd": 2 * tensor + n * size, "bwd": 3 * tensor + 2 * n * size,
                "bwd_gx": 3 * tensor + n * size}
    with mx.stream(device):
        sets, w = _inputs(shape, dtype, n_sets)
        figs = contenders(kind, w, gpu=device == mx.gpu)
        samples = time_interleaved([f for _, _, f in figs], sets, calls, repeats, singles, on_round)
    del sets, w
    mx.clear_cache()
    _trim()

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
        st = _stats(us)
        single = _stats([1e6 * t for t in s["single"]])
        ceil_us = per_repeat[direction, CEILING[direction]]
        builtin_us = per_repeat.get((direction, BUILTIN))
        pct = [100 * c / u for c, u in zip(ceil_us, us)]
        row = dict(kind=kind, direction=direction, impl=impl, shape=label, M=m, N=n,
                   dtype=str(dtype).split(".")[-1], bytes=bytes_of[direction],
                   calls=calls, repeats=len(us), timing=timing,
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


def _trim():
    # our pool caches freed blocks up to the most ever live: give a large
    # shape's blocks back before the next shape (its warm-up round refills)
    try:
        from . import trim_device_memory

        trim_device_memory()
    except Exception:  # not in every build; a nicety
        pass


# ------------------------------------------------------------- fused add

# The fused section's shapes: tokens per step x hidden sizes of the models
# whose blocks patch(fuse=True) rewrites (Qwen2.5-0.5B 896, Qwen3-0.6B 1024,
# Qwen3-1.7B 2048, Qwen3-4B 2560, Llama-8B / Qwen3-8B 4096, 14B 5120, 8192).
FUSED_SHAPES = [
    (8192, 896), (16384, 1024), (32768, 1024), (8192, 2048), (16384, 2048),
    (8192, 2560), (8192, 4096), (16384, 4096), (8192, 5120), (4096, 8192),
]
FUSED_QUICK = [(64, 1024), (128, 896), (33, 4099)]
# Tensors each direction moves (rows x N each; the weight and gw are left
# out): forward reads x and residual and writes h and y; backward reads h,
# g_y and g_h and writes the one gradient of x and residual.
FUSED_TENSORS = {"fwd": 4, "bwd": 4}
FUSED_IMPLS = ["fused", "MLX add + built-in norm", "MLX add + our norm"]
FUSED_BASELINE = "MLX add + built-in norm"


def fused_contenders(w):
    """[(direction, impl, fn(a, b, c))]. Forward: a = x, b = residual.
    Backward: a = h, b = g_y, c = g_h; the unfused ones differentiate the norm
    of h and add g_h, which is the backward MLX runs for `h = x + r; norm(h)`
    (the add's own backward is the identity)."""
    def unfused_bwd(norm):
        def f(h, gy, gh):
            gx, gw = mx.vjp(lambda h, w: norm(h, w, EPS), [h, w], [gy])[1]
            return gx + gh, gw
        return f

    def unfused_fwd(norm):
        def f(x, r, c):
            h = x + r
            return norm(h, w, EPS), h
        return f

    return [
        ("bwd", "copy x+g", lambda a, b, c: a + b),
        ("bwd", "fused", lambda h, gy, gh: add_rms_norm_vjp(h, w, gy, gh, EPS)),
        ("bwd", FUSED_BASELINE, unfused_bwd(_builtin_rms_norm)),
        ("bwd", "MLX add + our norm", unfused_bwd(rms_norm)),
        ("fwd", "fused", lambda x, r, c: add_rms_norm(x, r, w, EPS)),
        ("fwd", FUSED_BASELINE, unfused_fwd(_builtin_rms_norm)),
        ("fwd", "MLX add + our norm", unfused_fwd(rms_norm)),
    ]


def _fused_inputs(shape, dtype, n_sets):
    key = mx.random.key(shape[0] * 7919 + shape[-1])
    sets = []
    for _ in range(n_sets):
        ka, kb, kc, key = mx.random.split(key, 4)
        sets.append(tuple(mx.random.normal(shape, key=k).astype(dtype) for k in (ka, kb, kc)))
    w = (1 + 0.1 * mx.random.normal((shape[-1],), key=key)).astype(dtype)
    mx.eval(sets, w)
    return sets, w


def run_fused_case(shape, dtype, calls, repeats, singles, device):
    """Rows for one shape. The ceiling of each direction is the copy kernel's
    rate (x + g: 2 reads, 1 write) applied to that direction's bytes (4
    tensors): the time the fused traffic takes at the copy rate."""
    m, n = shape
    tensor = m * n * dtype.size
    n_sets = max(2, min(MAX_SETS, -(-L2_BYTES // (3 * tensor)) + 1))
    with mx.stream(device):
        sets, w = _fused_inputs(shape, dtype, n_sets)
        figs = fused_contenders(w)
        samples = time_interleaved([f for _, _, f in figs], sets, calls, repeats, singles)
    del sets, w
    mx.clear_cache()
    _trim()
    copy_us = [1e6 * e for e in samples[0]["many"]]  # 3 tensors
    rows = []
    for i, (direction, impl, _) in enumerate(figs):
        if i == 0:
            continue
        us = [1e6 * e for e in samples[i]["many"]]
        ceil = [c * FUSED_TENSORS[direction] / 3 for c in copy_us]
        base_i = next(j for j, f in enumerate(figs) if f[:2] == (direction, FUSED_BASELINE))
        base = [1e6 * e for e in samples[base_i]["many"]]
        st = _stats(us)
        rows.append(dict(
            kind="fused", direction=direction, impl=impl, shape=f"{m}x{n}", M=m, N=n,
            dtype=str(dtype).split(".")[-1], bytes=FUSED_TENSORS[direction] * tensor,
            calls=calls, repeats=len(us), us=st["med"], us_min=st["min"], us_max=st["max"],
            us_single=statistics.median([1e6 * t for t in samples[i]["single"]]),
            gbs=FUSED_TENSORS[direction] * tensor / st["med"] / 1e3,
            ceiling_us=statistics.median(ceil),
            pct_ceiling=100 * statistics.median(ceil) / st["med"],
            speedup_vs_baseline=statistics.median(base) / st["med"],
            speedup_min=min(b / u for b, u in zip(base, us)),
            speedup_max=max(b / u for b, u in zip(base, us)),
            samples_us=us))
    return rows


def print_fused_tables(rows):
    for direction, title in (("fwd", "forward: read x, residual; write h, y"),
                             ("bwd", "backward: read h, g_y, g_h; write gx (+ gw)")):
        sel = [r for r in rows if r["direction"] == direction]
        if not sel:
            continue
        print(f"\nfused add + RMSNorm, {title}: us per call, {sel[0]['calls']} calls per eval, "
              f"median of {sel[0]['repeats']} interleaved repeats; x = {FUSED_BASELINE} / impl; "
              f"ceiling = the copy kernel's rate on these 4 tensors")
        hdr = f"{'shape':>12} {'ceil us':>8}" + "".join(f" {i[:24]:>24} {'%ceil':>6} {'x':>5}"
                                                    for i in FUSED_IMPLS)
        print(hdr)
        print("-" * len(hdr))
        for shape in dict.fromkeys(r["shape"] for r in sel):
            line = None
            for impl in FUSED_IMPLS:
                r = next(r for r in sel if r["shape"] == shape and r["impl"] == impl)
                if line is None:
                    line = f"{shape:>12} {r['ceiling_us']:8.1f}"
                line += f" {_spread(r['us'], r['us_min'], r['us_max']):>24} " \
                        f"{r['pct_ceiling']:5.0f}% {r['speedup_vs_baseline']:5.2f}"
            print(line)


def gemma_accuracy(device, shape=(4096, 2048), seed=60):
    """Gemma's norm (bf16 x, stored weight w, scale 1 + w) against float64:
    ours with offset=1 (1 + w in fp32) and the built-in path mlx-lm runs,
    mx.fast.rms_norm(x, 1.0 + w) with 1 + w rounded to bf16. Max |error| in
    half-ulps of bf16 at the reference (<= 1: within one rounding of the
    output) and relative to the largest output."""
    import numpy as np

    kx, kw = mx.random.split(mx.random.key(seed))
    x = (2.0 * mx.random.normal(shape, key=kx)).astype(mx.bfloat16)
    w = (0.05 * mx.random.normal(shape[-1:], key=kw)).astype(mx.bfloat16)
    with mx.stream(device):
        ours = rms_norm(x, w, 1e-6, offset=1.0)
        builtin = _builtin_rms_norm(x, 1.0 + w, 1e-6)
        mx.eval(ours, builtin)
    xd = np.array(x.astype(mx.float32), dtype=np.float64)
    ref = xd / np.sqrt(np.mean(xd * xd, axis=-1, keepdims=True) + 1e-6) * (
        np.array(w.astype(mx.float32), dtype=np.float64) + 1.0)
    half_ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(ref), 1e-30))) - 8)
    out = {}
    for name, y in (("offset=1 (fp32 1+w)", ours), ("built-in, bf16 1+w", builtin)):
        d = np.abs(np.array(y.astype(mx.float32), dtype=np.float64) - ref)
        out[name] = (float(np.max(d / half_ulp)), float(np.max(d) / np.max(np.abs(ref))),
                     float(np.mean(d / half_ulp)))
    print(f"\nGemma norm accuracy, {shape[0]}x{shape[1]} bf16 on {device_name(device)}, vs float64 "
          f"(max and mean |err| in bf16 half-ulps; max |err| / max |ref|):")
    for name, (hu, rel, mean) in out.items():
        print(f"  {name:22} max {hu:5.2f} half-ulps  mean {mean:5.3f}  rel {rel:.2e}")
    return out


def fused_main(args, device, dtype, shapes):
    shapes = shapes or (FUSED_QUICK if args.quick else FUSED_SHAPES)
    t_start = time.perf_counter()
    rows = []
    progress = _Progress(len(shapes), len(shapes))  # a step a shape
    try:
        for i, shape in enumerate(shapes):
            progress.case(i, "fused", "x".join(map(str, shape)))
            rows += run_fused_case(tuple(shape[-2:]), dtype, args.calls, args.repeats,
                                   args.singles, device)
            progress.round_done()
    finally:
        progress.close()
    elapsed = time.perf_counter() - t_start
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"bench_{args.dtype}_fused")
    write_outputs(rows, base, dict(device=str(device), dtype=args.dtype, sections=["fused"],
                                   calls=args.calls, repeats=args.repeats, quick=args.quick,
                                   seconds=elapsed))
    print_fused_tables(rows)
    gemma_accuracy(device)
    print(f"\nresults: {base}.csv, {base}.json ({elapsed:.0f} s)")
    return 0


# ------------------------------------------------------------------- output

def _spread(med, lo, hi, fmt="{:.1f}"):
    return f"{fmt.format(med)} [{fmt.format(lo)}-{fmt.format(hi)}]"


def _get(rows, kind, shape, direction, impl):
    for r in rows:
        if (r["kind"], r["shape"], r["direction"], r["impl"]) == (kind, shape, direction, impl):
            return r
    return None


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
        ratio = _spread(x, r["speedup_min"], r["speedup_max"], "{:.2f}") if x else ""
        print(f"{r['direction']:4} {r['shape']:>13} {r['impl']:14} "
              f"{_spread(r['us'], r['us_min'], r['us_max']):>24} {r['us_single']:9.1f} "
              f"{r['gbs']:6.0f} {r['pct_ceiling']:6.1f}% {ratio:>20}")


def print_direction_table(rows, kind, direction):
    """Training/decode layout: one line per shape, ours next to the built-in."""
    shapes = list(dict.fromkeys(r["shape"] for r in rows
                                if r["kind"] == kind and r["direction"] == direction))
    if not shapes:
        return
    first = _get(rows, kind, shapes[0], direction, "ours")
    what = ("us per call incl. graph building" if SECTION_SPECS[kind].count_build
            else "us per call")
    print(f"\n{kind}, {DIRECTION_TITLE[direction]}: {what}, {first['calls']} calls per eval, "
          f"median [min-max] of {first['repeats']} interleaved repeats; "
          f"ratio = built-in / ours; ceiling = {CEILING[direction]}")
    hdr = (f"{'shape':>14} {'ours':>22} {'mx.fast':>22} {'ratio':>18} "
           f"{'ours %ceil':>10} {'mx %ceil':>9} {'ceil us':>8} {'1-eval ours':>11} {'1-eval mx':>9}")
    print(hdr)
    print("-" * len(hdr))
    for s in shapes:
        o = _get(rows, kind, s, direction, "ours")
        b = _get(rows, kind, s, direction, BUILTIN)
        print(f"{s:>14} {_spread(o['us'], o['us_min'], o['us_max']):>22} "
              f"{_spread(b['us'], b['us_min'], b['us_max']):>22} "
              f"{_spread(o['speedup_vs_builtin'], o['speedup_min'], o['speedup_max'], '{:.2f}'):>18} "
              f"{o['pct_ceiling']:9.0f}% {b['pct_ceiling']:8.0f}% {o['ceiling_us']:8.1f} "
              f"{o['us_single']:11.1f} {b['us_single']:9.1f}")


def plot(rows, path, title):
    """One panel per (section, direction): every shape's contenders as % of
    the ceiling, median with a min-max bar. Returns False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return False
    present = {(r["kind"], r["direction"]) for r in rows}
    panels = [(k, d) for k in SECTION_SPECS for d in DIRECTION_TITLE if (k, d) in present]
    width = max(8.0, 0.28 * max(len({r["shape"] for r in rows if (r["kind"], r["direction"]) == p})
                                for p in panels))
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, 3.2 * len(panels)), squeeze=False)
    colors = {"ours": "tab:blue", "ours auto": "tab:blue", "ours naive": "tab:green",
              BUILTIN: "tab:orange"}
    for ax, (kind, direction) in zip(axes[:, 0], panels):
        shapes = list(dict.fromkeys(r["shape"] for r in rows
                                    if r["kind"] == kind and r["direction"] == direction))
        xs = range(len(shapes))
        impls = list(dict.fromkeys(r["impl"] for r in rows if r["kind"] == kind
                                   and r["direction"] == direction
                                   and not r["impl"].startswith("ceiling")))
        for j, impl in enumerate(impls):
            pts = [_get(rows, kind, s, direction, impl) for s in shapes]
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
        what = " (us incl. graph building)" if SECTION_SPECS[kind].count_build else ""
        ax.set_title(f"{kind}: {DIRECTION_TITLE[direction]}, vs {CEILING[direction]}{what}",
                     fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_outputs(rows, base, meta):
    flat = [{k: v for k, v in r.items() if not k.startswith("samples")} for r in rows]
    fields = list(dict.fromkeys(k for r in flat for k in r))
    with open(base + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(flat)
    with open(base + ".json", "w") as f:
        json.dump(dict(meta, rows=rows), f, indent=1)


def parse_sections(args):
    if args.sections:
        sections = [s.strip() for s in args.sections.split(",") if s.strip()]
        bad = [s for s in sections if s not in SECTIONS + LN_SECTIONS]
        if bad:
            raise SystemExit(f"unknown section(s) {bad}; choose from {SECTIONS + LN_SECTIONS}")
        return sections
    if args.training:
        return ["training", "decode"]
    if args.no_sweep:
        return ["table"]
    return list(SECTIONS)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="a few small shapes per section (CI; the default on a CPU)")
    size.add_argument("--full", action="store_true",
                      help="every shape even on a CPU (hours there; the default on a GPU)")
    p.add_argument("--training", action="store_true", help="only the training and decode shapes")
    p.add_argument("--no-sweep", action="store_true", help="only the nine table shapes")
    p.add_argument("--sections", default="",
                   help=f"comma list from {','.join(SECTIONS + LN_SECTIONS)}")
    p.add_argument("--shapes", default="", help="comma list of MxN (e.g. 8192x4096,32768x5120): "
                   "these shapes instead of each section's own")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--calls", type=int, default=20, help="calls per eval (kernel timing)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved repeats per figure")
    p.add_argument("--singles", type=int, default=3, help="one-call evals per figure and repeat")
    p.add_argument("--out", default="bench-results", help="folder for CSV, JSON, PNG")
    p.add_argument("--generate", action="store_true", help="only the generation benchmark "
                   "(mlx-lm models, prefill and decode; python -m mlx_rmsnorm.bench_generate -h)")
    p.add_argument("--fused", action="store_true",
                   help="only the fused residual add + norm section (add_rms_norm)")
    args = p.parse_args(argv)
    if args.generate:
        return run_generate(args)
    sections = parse_sections(args)
    shapes = parse_shapes(args.shapes) if args.shapes else None

    gpu = mx.is_available(mx.gpu)
    from . import has_cuda_kernels

    device = mx.gpu if gpu and has_cuda_kernels else mx.cpu
    dtype = getattr(mx, args.dtype)
    # The full run is hours of tiny-kernel timing on a CPU: there the quick
    # cases are the default, and the first line says so.
    quick = args.quick or (device == mx.cpu and not args.full and not shapes)
    if quick:
        args.calls, args.repeats, args.singles = min(args.calls, 4), min(args.repeats, 3), 1
    if args.fused:
        args.quick = quick
        print(f"device: {device_name(device)}, dtype: {args.dtype}, section: fused, {args.calls} "
              f"calls per eval, {args.repeats} interleaved repeats (+1 warm-up)")
        return fused_main(args, device, dtype, shapes)
    run = cases(sections, quick, shapes)
    if device == mx.cpu and quick and not args.quick:
        print(f"CPU run: the quick cases ({len(run)} tiny shapes, seconds to a minute); "
              f"--full runs all {len(cases(sections, False))} (hours on a CPU). "
              "The GPU figures are in docs/performance.md.")
    name = device_name(device)
    print(f"device: {name}, dtype: {args.dtype}, sections: {','.join(sections)}, "
          f"{len(run)} cases, {args.calls} calls per eval, {args.repeats} interleaved repeats "
          f"(+1 warm-up), {args.singles} one-call evals per repeat", flush=True)
    t_start = time.perf_counter()
    rows = []
    progress = _Progress(len(run) * (args.repeats + 1), len(run))
    try:
        for i, (kind, shape) in enumerate(run):
            progress.case(i, kind, "x".join(map(str, shape)))
            rows += run_case(kind, shape, dtype, args.calls, args.repeats, args.singles, device,
                             on_round=progress.round_done)
    finally:
        progress.close()
    elapsed = time.perf_counter() - t_start

    os.makedirs(args.out, exist_ok=True)
    suffix = "" if sections == SECTIONS else "_" + "-".join(sections)
    base = os.path.join(args.out, f"bench_{args.dtype}{suffix}")
    write_outputs(rows, base, dict(device=name, dtype=args.dtype, sections=sections,
                                   calls=args.calls, repeats=args.repeats, quick=quick,
                                   seconds=elapsed))
    what = "LayerNorm" if set(sections) <= set(LN_SECTIONS) else "RMSNorm"
    if plot(rows, base + ".png", f"{what} {args.dtype} on {name}: median and min-max of "
                                 f"{args.repeats} interleaved repeats"):
        print(f"plot: {base}.png")
    # Tables in the sections' order of SECTION_SPECS, each in its layout.
    for kind in SECTION_SPECS:
        if kind not in sections:
            continue
        spec = SECTION_SPECS[kind]
        if spec.layout == "impl":
            print(f"\n{spec.title or kind}: us per call, {args.calls} calls per eval, median [min-max] "
                  f"of {args.repeats} interleaved repeats")
            print_impl_table(rows, kind)
        else:
            for direction in DIRECTION_TITLE:
                print_direction_table(rows, kind, direction)
    print(f"\nresults: {base}.csv, {base}.json ({elapsed:.0f} s)")
    if not (args.sections or args.training or args.no_sweep or args.shapes):
        run_generate(args, quick)  # the whole benchmark ends with the user's view: generation
    return 0


def run_generate(args, quick=None):
    from . import bench_generate

    if quick is None:  # --generate alone: quick where the other sections would be
        quick = args.quick or (not args.full and not (mx.is_available(mx.gpu) and _has_kernels()))
    return bench_generate.main((["--quick"] if quick else []) + ["--out", args.out])


def _has_kernels():
    from . import has_cuda_kernels

    return has_cuda_kernels


if __name__ == "__main__":
    sys.exit(main())
