"""The fused residual add + norm (add_rms_norm, add_layer_norm) at the
training shapes of the models whose blocks patch(fuse=True) rewrites, forward
and backward, against MLX's add + the built-in norm and MLX's add + our norm;
then the accuracy of Gemma's norm (scale 1 + w) against float64."""

from __future__ import annotations

import statistics

import mlx.core as mx

from .. import add_layer_norm, add_layer_norm_vjp, add_rms_norm, add_rms_norm_vjp, layer_norm, rms_norm
from .core import (EPS, bias_like, builtin_layer_norm, builtin_rms_norm, device_name, per_eval, rotating_sets,
                   stats, time_interleaved, trim)
from .output import run_own_section, spread

# Tokens per step x hidden sizes of the models whose blocks patch(fuse=True)
# rewrites (Qwen2.5-0.5B 896, Qwen3-0.6B 1024, Qwen3-1.7B 2048, Qwen3-4B 2560,
# Llama-8B / Qwen3-8B 4096, 14B 5120, 8192).
FUSED_SHAPES = [
    (8192, 896), (16384, 1024), (32768, 1024), (8192, 2048), (16384, 2048),
    (8192, 2560), (8192, 4096), (16384, 4096), (8192, 5120), (4096, 8192),
]
FUSED_QUICK = [(64, 1024), (128, 896), (33, 4099)]
# The same for the LayerNorm blocks (add_layer_norm): GPT-2 small / medium /
# large / XL 768, 1024, 1280, 1600; StableLM-2 1.6B 2048, 3B 2560;
# StarCoder2-3B 3072, 7B 4608, 15B and GPT-NeoX-20B 6144; 8192.
FUSED_LN_SHAPES = [
    (8192, 768), (16384, 1024), (32768, 1024), (8192, 1280), (16384, 1600),
    (8192, 2048), (8192, 2560), (8192, 3072), (8192, 4608), (8192, 6144), (4096, 8192),
]
FUSED_LN_QUICK = [(64, 768), (33, 1000)]
# Tensors each direction moves (rows x N each; the weight and gw are left
# out): forward reads x and residual and writes h and y; backward reads h,
# g_y and g_h and writes the one gradient of x and residual.
FUSED_TENSORS = {"fwd": 4, "bwd": 4}
FUSED_IMPLS = ["fused", "MLX add + built-in norm", "MLX add + our norm"]
FUSED_BASELINE = "MLX add + built-in norm"


def fused_contenders(w, op="RMSNorm"):
    """[(direction, impl, fn(a, b, c))]. Forward: a = x, b = residual.
    Backward: a = h, b = g_y, c = g_h; the unfused ones differentiate the norm
    of h and add g_h, which is the backward MLX runs for `h = x + r; norm(h)`
    (the add's own backward is the identity). `op`: RMSNorm (a weight) or
    LayerNorm (a weight and a bias)."""
    if op == "LayerNorm":
        b = bias_like(w)
        params = [w, b]
        fused_fwd = lambda x, r, c: add_layer_norm(x, r, w, b, EPS)  # noqa: E731
        fused_bwd = lambda h, gy, gh: add_layer_norm_vjp(h, w, b, gy, gh, EPS)  # noqa: E731
        norms = (builtin_layer_norm, layer_norm)
    else:
        params = [w]
        fused_fwd = lambda x, r, c: add_rms_norm(x, r, w, EPS)  # noqa: E731
        fused_bwd = lambda h, gy, gh: add_rms_norm_vjp(h, w, gy, gh, EPS)  # noqa: E731
        norms = (builtin_rms_norm, rms_norm)

    def unfused_bwd(norm):
        def f(h, gy, gh):
            grads = mx.vjp(lambda h, *p: norm(h, *p, EPS), [h, *params], [gy])[1]
            return [grads[0] + gh, *grads[1:]]
        return f

    def unfused_fwd(norm):
        def f(x, r, c):
            h = x + r
            return norm(h, *params, EPS), h
        return f

    builtin, ours = norms
    return [
        ("bwd", "copy x+g", lambda a, b, c: a + b),
        ("bwd", "fused", fused_bwd),
        ("bwd", FUSED_BASELINE, unfused_bwd(builtin)),
        ("bwd", "MLX add + our norm", unfused_bwd(ours)),
        ("fwd", "fused", fused_fwd),
        ("fwd", FUSED_BASELINE, unfused_fwd(builtin)),
        ("fwd", "MLX add + our norm", unfused_fwd(ours)),
    ]


def fused_inputs(shape, dtype, n_sets):
    key = mx.random.key(shape[0] * 7919 + shape[-1])
    sets = []
    for _ in range(n_sets):
        ka, kb, kc, key = mx.random.split(key, 4)
        sets.append(tuple(mx.random.normal(shape, key=k).astype(dtype) for k in (ka, kb, kc)))
    w = (1 + 0.1 * mx.random.normal((shape[-1],), key=key)).astype(dtype)
    mx.eval(sets, w)
    return sets, w


def run_fused_case(shape, dtype, calls, repeats, singles, device, op="RMSNorm", chain=False):
    """Rows for one shape. The ceiling of each direction is the copy kernel's
    rate (x + g: 2 reads, 1 write) applied to that direction's bytes (4
    tensors): the time the fused traffic takes at the copy rate."""
    m, n = shape
    tensor = m * n * dtype.size
    n_sets = rotating_sets(3 * tensor)
    with mx.stream(device):
        sets, w = fused_inputs(shape, dtype, n_sets)
        figs = fused_contenders(w, op)
        samples = time_interleaved([f for _, _, f in figs], sets, calls, repeats, singles, chain=chain)
    del sets, w
    mx.clear_cache()
    trim()
    copy_us = [1e6 * e for e in samples[0]["many"]]  # 3 tensors
    rows = []
    for i, (direction, impl, _) in enumerate(figs):
        if i == 0:
            continue
        us = [1e6 * e for e in samples[i]["many"]]
        ceil = [c * FUSED_TENSORS[direction] / 3 for c in copy_us]
        base_i = next(j for j, f in enumerate(figs) if f[:2] == (direction, FUSED_BASELINE))
        base = [1e6 * e for e in samples[base_i]["many"]]
        st = stats(us)
        rows.append(dict(
            kind="fused", op=op, direction=direction, impl=impl, shape=f"{m}x{n}", M=m, N=n,
            dtype=str(dtype).split(".")[-1], bytes=FUSED_TENSORS[direction] * tensor,
            calls=calls, chain=chain, repeats=len(us), us=st["med"], us_min=st["min"], us_max=st["max"],
            us_single=statistics.median([1e6 * t for t in samples[i]["single"]]),
            gbs=FUSED_TENSORS[direction] * tensor / st["med"] / 1e3,
            ceiling_us=statistics.median(ceil),
            pct_ceiling=100 * statistics.median(ceil) / st["med"],
            speedup_vs_baseline=statistics.median(base) / st["med"],
            speedup_min=min(b / u for b, u in zip(base, us)),
            speedup_max=max(b / u for b, u in zip(base, us)),
            samples_us=us))
    return rows


def print_fused_tables(rows, device=None):
    for op, direction, title in [(op, d, t) for op in ("RMSNorm", "LayerNorm") for d, t in (
            ("fwd", "forward: read x, residual; write h, y"),
            ("bwd", "backward: read h, g_y, g_h; write gx (+ gw" + (", gb)" if op == "LayerNorm" else ")")))]:
        sel = [r for r in rows if r["direction"] == direction and r.get("op", "RMSNorm") == op]
        if not sel:
            continue
        print(f"\nfused add + {op}, {title}: us per call, {per_eval(sel[0]['calls'], sel[0]['chain'])}, "
              f"median of {sel[0]['repeats']} interleaved repeats; x = {FUSED_BASELINE} / impl; "
              f"fused x ours = {FUSED_IMPLS[2]} / fused; "
              f"ceiling = the copy kernel's rate on these 4 tensors")
        hdr = f"{'shape':>12} {'ceil us':>8}" + "".join(f" {i[:24]:>24} {'%ceil':>6} {'x':>5}"
                                                    for i in FUSED_IMPLS) + f" {'fused x ours':>12}"
        print(hdr)
        print("-" * len(hdr))
        for shape in dict.fromkeys(r["shape"] for r in sel):
            line = None
            us = {}
            for impl in FUSED_IMPLS:
                r = next(r for r in sel if r["shape"] == shape and r["impl"] == impl)
                if line is None:
                    line = f"{shape:>12} {r['ceiling_us']:8.1f}"
                line += f" {spread(r['us'], r['us_min'], r['us_max']):>24} " \
                        f"{r['pct_ceiling']:5.0f}% {r['speedup_vs_baseline']:5.2f}"
                us[impl] = r["us"]
            # the fused op against the same two steps with our norm: what fusing alone gains
            print(line + f" {us[FUSED_IMPLS[2]] / us[FUSED_IMPLS[0]]:12.2f}")


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
        builtin = builtin_rms_norm(x, 1.0 + w, 1e-6)
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


def run(args, device, dtype, shapes):
    """The section on its own (bench --fused): its tables, CSV, JSON and the
    Gemma accuracy lines."""
    if shapes:  # the given shapes, for both ops
        run_list = [(op, shape) for op in ("RMSNorm", "LayerNorm") for shape in shapes]
    else:
        run_list = ([("RMSNorm", s) for s in (FUSED_QUICK if args.quick else FUSED_SHAPES)]
                    + [("LayerNorm", s) for s in (FUSED_LN_QUICK if args.quick else FUSED_LN_SHAPES)])
    rows, base, elapsed = run_own_section(
        "fused", [(f"{op} {'x'.join(map(str, shape))}",
                   lambda op=op, shape=shape: run_fused_case(tuple(shape[-2:]), dtype, args.calls, args.repeats,
                                                             args.singles, device, op, args.chain))
                  for op, shape in run_list], args, device)
    print_fused_tables(rows, device)
    gemma_accuracy(device)
    print(f"\nresults: {base}.csv, {base}.json ({elapsed:.0f} s)")
    return 0
