"""Long rows (N = 16384 ... 262144): every op of ours, forward and backward,
against the copy ceiling on the same bytes, with QuACK's figures beside them
where they were measured (bench --large-n).

The ceiling of a figure is the time its bytes take at the copy rate: the
faster of MLX's two elementwise kernels timed in the same rounds (-x: one
read, one write; x + g: two reads, one write), applied to the tensors the op
must move at the least (weights and their gradients left out):

    forward   rms_norm / layer_norm          read x, write y          2 tensors
              add_rms_norm / add_layer_norm  read x, r; write h, y    4 tensors
    backward  rms_norm / layer_norm          read x, g; write gx      3 tensors
              add_rms_norm / add_layer_norm  read h, g_y, g_h; write gx   4 tensors

"ours" is the median of --repeats interleaved rounds of --calls calls in one
mx.eval (the backward as mx.grad reaches it: mx.vjp of the forward; the add
ops' backward through add_*_vjp, which is what their vjp runs). "built-in"
is what the program runs without us, timed in the same rounds: mx.fast's
norm, after MLX's add for the add ops, its backward through mx.vjp.
"""

from __future__ import annotations

import json
import statistics

import mlx.core as mx

from .. import add_layer_norm_vjp, add_rms_norm, add_rms_norm_vjp, add_layer_norm, layer_norm, rms_norm
from .core import (EPS, bias_like, copy_rates, device_name, inputs, per_eval, rotating_sets, stats,
                   time_interleaved, trim)
from .output import run_own_section, spread

# The shapes of the large-N table (x is 268 MB in bf16 at every one but
# 4096x24576, 201 MB).
SHAPES = [(8192, 16384), (4096, 24576), (4096, 32768), (2048, 65536), (1024, 131072), (512, 262144)]
QUICK = [(64, 4099), (16, 16384)]
OPS = ("rms_norm", "layer_norm", "add_rms_norm", "add_layer_norm")
TENSORS = {("fwd", False): 2, ("fwd", True): 4, ("bwd", False): 3, ("bwd", True): 4}

# Measured with torch 2.11 on one H200, bf16 (triton do_bench; QuACK 0.6.5 on
# cutlass-dsl 4.7.0): us per call. "copy" is torch's neg (forward bytes) and
# add(x, g) (backward bytes) on the same tensors. Not measured here: printed
# beside ours for reference, labelled as such.
TORCH_H200 = {
    # (M, N): (copy fwd, copy bwd, RMS fwd, RMS bwd, LN fwd, LN bwd)
    (8192, 16384): (130, 189, 135, 314, None, 308),
    (4096, 24576): (99, 144, 104, 304, 146, 343),
    (4096, 32768): (130, 189, 135, 354, 250, 374),
    (2048, 65536): (131, 189, 134, 382, 274, 424),
    (1024, 131072): (130, 189, 137, 477, 290, 548),
    (512, 262144): (131, 189, 144, 529, 339, 702),
}
_QUACK_COLUMN = {("rms_norm", "fwd"): 2, ("rms_norm", "bwd"): 3,
                 ("layer_norm", "fwd"): 4, ("layer_norm", "bwd"): 5}


def quack_us(shape, op, direction):
    """QuACK's us at this shape (bf16, H200, torch), or None."""
    figures = TORCH_H200.get(tuple(shape))
    column = _QUACK_COLUMN.get((op, direction))
    return None if figures is None or column is None else figures[column]


def peers_here(path, gpu):
    """QuACK's figures of ``lab.peers`` (JSON at path) as {(M, N): {(op,
    direction): us}}, where they were measured on this GPU (its name is
    ``gpu``); None where the file's GPU is another."""
    with open(path) as fh:
        data = json.load(fh)
    if data.get("gpu") != gpu:
        return None
    figures = {}
    for shape, names in data["figures"].items():
        m, n = (int(d) for d in shape.split("x"))
        figures[m, n] = {tuple(name.split()): f["us"] for name, f in names.items()
                         if not name.startswith("copy")}
    return figures


def contenders(w):
    """[(op, direction, fn(x, g))] for one shape; x and g double as the
    residual and the second cotangent of the add ops."""
    b = bias_like(w)

    def grad_of(norm, params):
        def f(x, g):
            return mx.vjp(lambda x, *p: norm(x, *p, EPS), [x, *params], [g])[1]
        return f

    return [
        ("ceiling -x", "fwd", lambda x, g: -x),
        ("ceiling x+g", "bwd", lambda x, g: x + g),
        ("rms_norm", "fwd", lambda x, g: rms_norm(x, w, EPS)),
        ("rms_norm", "bwd", grad_of(rms_norm, [w])),
        ("layer_norm", "fwd", lambda x, g: layer_norm(x, w, b, EPS)),
        ("layer_norm", "bwd", grad_of(layer_norm, [w, b])),
        ("add_rms_norm", "fwd", lambda x, g: add_rms_norm(x, g, w, EPS)),
        ("add_rms_norm", "bwd", lambda x, g: add_rms_norm_vjp(x, w, g, x, EPS)),
        ("add_layer_norm", "fwd", lambda x, g: add_layer_norm(x, g, w, b, EPS)),
        ("add_layer_norm", "bwd", lambda x, g: add_layer_norm_vjp(x, w, b, g, x, EPS)),
    ]


def builtins(w):
    """[(op, direction, fn(x, g))]: what a program runs without us, on the
    inputs of ``contenders``: mx.fast's norm (after MLX's add for the add
    ops, returning (y, h)), its backward through mx.vjp (for the add ops the
    norm's gx plus g_h = x, the gradient mx.grad gives h = x + r)."""
    norms = {"rms_norm": (mx.fast.rms_norm, [w]), "layer_norm": (mx.fast.layer_norm, [w, bias_like(w)])}

    def fwd(norm, params, add):
        if add:
            return lambda x, g: (lambda h: (norm(h, *params, EPS), h))(x + g)
        return lambda x, g: norm(x, *params, EPS)

    def bwd(norm, params, add):
        def f(x, g):
            grads = mx.vjp(lambda h, *p: norm(h, *p, EPS), [x, *params], [g])[1]
            return [grads[0] + x, *grads[1:]] if add else grads
        return f

    figs = []
    for op in OPS:
        norm, params = norms[op.removeprefix("add_")]
        add = op.startswith("add_")
        figs += [(op, "fwd", fwd(norm, params, add)), (op, "bwd", bwd(norm, params, add))]
    return figs


def run_case(shape, dtype, calls, repeats, singles, device, chain=False, peers=None):
    """Rows of one shape: every op and direction against the ceiling; QuACK's
    figure beside each from ``peers`` (peers_here) where it has the shape,
    else from the H200 table."""
    m, n = shape
    tensor = m * n * dtype.size
    n_sets = rotating_sets(2 * tensor)
    with mx.stream(device):
        sets, w = inputs(shape, dtype, n_sets)
        figs = contenders(w)
        theirs = {(op, d): f for op, d, f in builtins(w)}
        base = [theirs[op, d] for op, d, _ in figs[2:]]  # the built-in of each of ours
        samples = time_interleaved([f for _, _, f in figs] + base, sets, calls, repeats, singles, chain=chain)
    del sets, w
    mx.clear_cache()
    trim()
    us = [[1e6 * e for e in samples[i]["many"]] for i in range(len(figs) + len(base))]
    # The copy rate of each round (bytes per us): the faster of -x and x + g.
    rate = copy_rates(tensor, us[0], us[1])
    rows = []
    for i, (op, direction, _) in enumerate(figs[2:], start=2):
        moved = TENSORS[direction, op.startswith("add_")] * tensor
        ceil = [moved / r for r in rate]
        st = stats(us[i])
        pct = [100 * c / u for c, u in zip(ceil, us[i])]
        theirs_us = us[len(figs) + i - 2]
        speedup = [t / u for t, u in zip(theirs_us, us[i])]  # per round
        rows.append(dict(
            kind="large_n", op=op, direction=direction, impl="ours", shape=f"{m}x{n}", M=m, N=n,
            dtype=str(dtype).split(".")[-1], bytes=moved, calls=calls, chain=chain, repeats=len(us[i]),
            us=st["med"], us_min=st["min"], us_max=st["max"],
            us_single=statistics.median([1e6 * t for t in samples[i]["single"]]),
            gbs=moved / st["med"] / 1e3, ceiling_us=statistics.median(ceil),
            pct_ceiling=100 * statistics.median(ceil) / st["med"],
            pct_ceiling_min=min(pct), pct_ceiling_max=max(pct),
            builtin_us=statistics.median(theirs_us), x_builtin=statistics.median(speedup),
            x_builtin_min=min(speedup), x_builtin_max=max(speedup),
            samples_us=us[i], **quack_of(shape, op, direction, dtype, peers)))
    return rows


def quack_of(shape, op, direction, dtype, peers=None):
    """A row's QuACK fields: quack_us, and quack_here (True: measured on this
    GPU by lab.peers, in this run's peers file; False: the H200 table)."""
    if dtype != mx.bfloat16:
        return dict(quack_us=None, quack_here=False)
    if peers and tuple(shape) in peers:
        return dict(quack_us=peers[tuple(shape)].get((op, direction)), quack_here=True)
    return dict(quack_us=quack_us(shape, op, direction), quack_here=False)


def format_row(r, on_h200=True):
    """One line: MxN, the op, the direction, ours, the ceiling, NN%, the
    built-in (x: built-in / ours, median of the rounds), QuACK (ours / QuACK
    only where QuACK's figure is from this GPU, lab.peers in this run, or
    this run is on an H200 too: on another GPU the figures are not
    comparable)."""
    line = (f"{r['shape']:>12}  {r['op']:<14} {r['direction']:<4} "
            f"ours {spread(r['us'], r['us_min'], r['us_max']):>22} us  "
            f"ceiling {r['ceiling_us']:7.1f} us  {r['pct_ceiling']:3.0f}%  "
            f"built-in {r['builtin_us']:7.1f} us ({r['x_builtin']:4.2f}x)")
    q = r.get("quack_us")
    if q is not None:
        here = r.get("quack_here")
        figure = f"{q:6.1f} us (torch, this GPU" if here else f"{q:4.0f} us (torch, H200"
        ratio = f"ours/QuACK {r['us'] / q:4.2f}" if here or on_h200 else "not this GPU: no ratio"
        line += f"  QuACK {figure}; {ratio})"
    return line


def run(args, device, dtype, shapes):
    """The section on its own (bench --large-n): one line per figure, CSV, JSON."""
    run_list = [tuple(s[-2:]) for s in shapes] if shapes else (QUICK if args.quick else SHAPES)
    print(f"device: {device_name(device)}, dtype: {args.dtype}, section: large-n, {len(run_list)} "
          f"shapes x {len(OPS)} ops x 2 directions, {per_eval(args.calls, args.chain)}, "
          f"{args.repeats} interleaved repeats (+1 warm-up)", flush=True)
    peers_file = getattr(args, "peers", None)
    peers = peers_here(peers_file, device_name(device)) if peers_file else None
    if peers_file:
        print(f"QuACK's figures: {peers_file}" + (" (this GPU)" if peers is not None else
                                                  " is of another GPU: the H200 table instead"))
    rows, base, elapsed = run_own_section(
        "large-n", [("x".join(map(str, shape)),
                     lambda shape=shape: run_case(shape, dtype, args.calls, args.repeats, args.singles,
                                                  device, args.chain, peers))
                    for shape in run_list], args, device)
    print(f"\nlarge N: us per call, median [min-max] of {args.repeats} interleaved repeats of "
          f"{per_eval(args.calls, args.chain)}; ceiling = the copy rate (faster of MLX's -x and "
          "x+g, same rounds) on the bytes the op must move; NN% = ceiling / ours; built-in: mx.fast (after "
          "MLX's add for the add ops), x = built-in / ours; QuACK: measured with torch (do_bench), "
          + ("on this GPU in this run (lab.peers)" if peers is not None
             else "on an H200 (bf16), not in this run"))
    on_h200 = "H200" in device_name(device)
    for r in rows:
        print(format_row(r, on_h200))
    print(f"\nresults: {base}.csv, {base}.json ({elapsed:.0f} s)")
    return 0
