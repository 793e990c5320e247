"""The verdicts: how far a mode's quantities may be from the built-in's
(lab.sweep's docstring says how each line is used), and the summary of a
sweep's rows. Pure functions of the runs' quantities (name -> array or the
exception it raised); nothing here runs a model."""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import mlx.core as mx

# The verdicts' lines (the module's docstring says how they are used). On the
# CPU (MLX 0.32.4, mlx-lm 0.32.2, 121 models built) the worst seen with the
# plugin: float32 3.1e-5 (afm7's quant_value_scale gradient, where the built-in
# is 6.1e-5 from float64 and the plugin 3.0e-5), everything else <= 2.6e-6;
# bfloat16 geometric mean 1.10, one quantity 1.64.
FP32_TOL = 1e-5  # float32: max|mode - built-in| / max|built-in|, every quantity
BF16_MEAN = 1.25  # geometric mean over a model's quantities and batches
BF16_MAX = 3.0  # any one quantity (over batches)
BF16_BATCHES = 3  # token batches in bfloat16
BF16_NOISE = 0.25  # a quantity the bf16 built-in gets this wrong (normwise) has no bf16 value to keep
FP32_GRAD_FLOOR = 1e-2  # of the model's largest gradient: below it a gradient's error is rounding
FP64_SLACK = 2.0  # where the float64 built-in decides (see judge_fp32)
NOISE_SLACK = 2.0  # where the built-in is not reproducible: of its own run-to-run distance
CONTROL_SLACK = 1.25  # bfloat16: of the exact control's mean and worst (see judge_low_precision)
BF16_FLOOR = 2.0**-8  # one bfloat16 ulp (relative): below it a ratio of errors means nothing

MODES = ("patch", "fuse")  # the plugin's modes, judged against the built-in


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


def _valid(*xs: Any) -> bool:
    return all(x is not None and not isinstance(x, Exception) for x in xs)


def rel(a: mx.array, b: mx.array, floor: float = 0.0) -> float:
    """max|a - b| / max(max|b|, floor) (max|a - b| where that is 0)."""
    if mx.float64 in (a.dtype, b.dtype):  # float64 runs on the CPU only
        with mx.stream(mx.cpu):
            return _rel(a.astype(mx.float64), b.astype(mx.float64), floor)
    return _rel(a.astype(mx.float32), b.astype(mx.float32), floor)


def _rel(a: mx.array, b: mx.array, floor: float) -> float:
    if a.shape != b.shape:
        return math.inf
    if a.size == 0:
        return 0.0
    diff = mx.max(mx.abs(a - b)).item()
    ref = max(mx.max(mx.abs(b)).item(), floor)
    if math.isnan(diff):
        both_nan = mx.array_equal(mx.isnan(a), mx.isnan(b)).item()
        finite = mx.where(mx.isnan(b), 0.0, b), mx.where(mx.isnan(a), 0.0, a)
        return _rel(finite[1], finite[0], floor) if both_nan else math.inf
    return diff / ref if ref > 0 else diff


def rms_rel(a: mx.array, b: mx.array) -> float:
    """||a - b||_2 / ||b||_2 in float32 (||a - b||_2 where b is all 0): the
    bfloat16 measure, an average over the elements, where the max of a small
    tensor's error hangs on a single rounding."""
    a = a.astype(mx.float32)
    b = b.astype(mx.float32)
    if a.shape != b.shape:
        return math.inf
    if a.size == 0:
        return 0.0
    diff = mx.sqrt(mx.sum(mx.square(a - b))).item()
    ref = mx.sqrt(mx.sum(mx.square(b))).item()
    return diff / ref if ref > 0 else diff


def bitwise_equal(x: dict, y: dict) -> Optional[bool]:
    """Whether every quantity of two runs is equal bit for bit; None where a
    quantity raised in either."""
    if x.keys() != y.keys():
        return False
    for k in x:
        a, b = x[k], y[k]
        if isinstance(a, Exception) or isinstance(b, Exception):
            return None
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if not mx.array_equal(a, b, equal_nan=True).item():
            return False
    return True



def judge(q: dict) -> dict:
    """What the built-in does by itself (raises, is reproducible) and whether
    the built-in after unpatch() is the first built-in run, bit for bit."""
    out: dict[str, Any] = {}
    ref = q["builtin"]
    broken = {k: first_line(v) for k, v in ref.items() if isinstance(v, Exception)}
    notes = []
    if broken:
        where = sorted({k.split(":")[0] for k in broken})
        notes.append(f"built-in raises in {', '.join(where)}: {next(iter(broken.values()))}")
    not_repro = [k for k in ref if _valid(ref[k], q["builtin2"][k])
                 and not mx.array_equal(ref[k], q["builtin2"][k], equal_nan=True).item()]
    if not_repro:
        k = not_repro[0]
        notes.append(f"built-in not reproducible in {len(not_repro)} of {len(ref)} quantities "
                     f"(first {k}: {rel(q['builtin2'][k], ref[k]):.2e})")
    out["builtin_reproducible"] = not not_repro
    out["builtin_runs"] = not isinstance(ref["logits"], Exception)
    out["builtin_note"] = "; ".join(notes)
    comparable = [k for k, v in ref.items() if _valid(v, q["unpatched"][k])]
    out["unpatch_rel"] = max((rel(q["unpatched"][k], ref[k]) for k in comparable), default=0.0)
    if not out["builtin_reproducible"] or broken:
        out["unpatch_bitwise"] = "n/a"  # the built-in is not reproducible itself (or raises)
    else:
        out["unpatch_bitwise"] = bool(bitwise_equal(ref, q["unpatched"]))
    return out


def judge_fp32(q: dict, fp64_reference: Callable[[], dict]) -> dict:
    """float32: each quantity of each mode within FP32_TOL of the built-in's,
    relative to max|built-in| (a gradient: to at least FP32_GRAD_FLOOR of the
    model's largest gradient). Where that fails, the float64 built-in decides:
    the mode matches if it is no more than FP64_SLACK times as far from it as
    the built-in (the built-in itself is further than FP32_TOL from the exact
    value there). Before that, where the built-in's second run differs from
    its first, a mode within NOISE_SLACK times that distance matches (counted
    in ``*_by_noise``)."""
    out: dict[str, Any] = {}
    ref = q["builtin"]
    grads = [mx.max(mx.abs(v)).item() for k, v in ref.items() if k.startswith("grad:") and _valid(v) and v.size]
    g_floor = FP32_GRAD_FLOOR * max(grads, default=0.0)
    for mode in MODES:
        errors, fails, by_fp64, by_noise = [], [], [], []
        worst, worst_k, compared = 0.0, "", 0
        for k, b in ref.items():
            a = q[mode][k]
            if not _valid(b):
                continue  # the built-in's
            if not _valid(a):
                errors.append(f"{k}: {first_line(a)}")
                continue
            compared += 1
            floor = g_floor if k.startswith("grad:") else 0.0
            d = rel(a, b, floor=floor)
            if not d <= worst:  # NaN counts as worst
                worst, worst_k = d, k
            if d <= FP32_TOL:
                continue
            # a built-in that is not reproducible run to run (gather / scatter
            # backwards of MoE models on a GPU): its second run's distance is
            # what rounding alone moves that quantity
            b2 = q["builtin2"].get(k)
            if _valid(b2) and d <= NOISE_SLACK * rel(b2, b, floor=floor):
                by_noise.append(k)
                continue
            t = fp64_reference().get(k)
            if _valid(t) and rel(a, t) <= FP64_SLACK * rel(b, t):
                by_fp64.append(k)
            else:
                fails.append(k)
        out[f"{mode}_match"] = (not errors and not fails) if compared or errors else None
        out[f"{mode}_compared"] = compared
        out[f"{mode}_worst"] = worst
        out[f"{mode}_worst_at"] = worst_k
        out[f"{mode}_fails"] = fails[:5]
        out[f"{mode}_by_fp64"] = by_fp64[:5]
        out[f"{mode}_by_noise"] = len(by_noise)
        out[f"{mode}_error"] = errors[0] if errors else ""
        out[f"{mode}_errors"] = len(errors)
    return out


def judge_low_precision(batches: list[dict], modes: tuple = MODES) -> dict:
    """bfloat16, over token batches: r = rms_rel(mode, float32 built-in) /
    rms_rel(built-in, float32 built-in) per quantity and batch; the geometric
    mean of every r at most BF16_MEAN, and for each quantity the geometric
    mean over batches of r -- its denominator at least the median of the
    built-in's errors in that batch, so that a quantity the built-in happened
    to get nearly right does not count as the mode's fault -- at most BF16_MAX."""
    out: dict[str, Any] = {}
    owns = []  # per batch: quantity -> the built-in's bf16 error
    for batch in batches:
        ref32, b_q = batch["ref32"], batch["builtin"]
        owns.append({k: rms_rel(b_q[k], ref32[k]) for k in b_q if _valid(b_q[k], ref32.get(k))})
    noisy = {k for own in owns for k, e in own.items() if e > BF16_NOISE}
    for mode in modes:
        ratios, ratios_b, errors = [], [], []
        per_q: dict[str, list[float]] = {}
        for batch, own_q in zip(batches, owns):
            ref32, b_q, a_q = batch["ref32"], batch["builtin"], batch[mode]
            typical = sorted(own_q.values())[len(own_q) // 2] if own_q else 0.0
            for k, own in own_q.items():
                if k in noisy:
                    continue
                a = a_q[k]
                if not _valid(a):
                    errors.append(f"{k}: {first_line(a)}")
                    continue
                # both errors floored: below one ulp neither says anything
                mine = max(rms_rel(a, ref32[k]), BF16_FLOOR)
                ratios.append(mine / max(own, BF16_FLOOR))
                ratios_b.append(max(rms_rel(a, b_q[k]), BF16_FLOOR) / max(own, BF16_FLOOR))
                per_q.setdefault(k, []).append(mine / max(own, typical, BF16_FLOOR))
        worst_k, worst = "", 0.0
        for k, rs in per_q.items():
            g = _gmean(rs)
            if not g <= worst:
                worst, worst_k = g, k
        mean = _gmean(ratios)
        compared = len(per_q)
        ok = not errors and mean <= BF16_MEAN and worst <= BF16_MAX
        out[f"{mode}_match"] = ok if compared or errors else None
        out[f"{mode}_compared"] = compared
        out[f"{mode}_gmean"] = mean
        out[f"{mode}_worst"] = worst
        out[f"{mode}_worst_at"] = worst_k
        out[f"{mode}_vs_builtin_gmean"] = _gmean(ratios_b)
        out[f"{mode}_error"] = errors[0] if errors else ""
        out[f"{mode}_errors"] = len(errors)
    out["bf16_noise"] = len(noisy)
    out["bf16_noise_at"] = sorted(noisy)[:5]
    return out


def control_low_precision(batches: list[dict], row: dict) -> dict:
    """The bfloat16 control: the exact-norm run judged as a mode; a failing
    mode matches if its mean and worst are within CONTROL_SLACK of the
    control's (both figures kept as ``exact_gmean`` / ``exact_worst``)."""
    c = judge_low_precision(batches, ("exact",))
    out = {"exact_gmean": c["exact_gmean"], "exact_worst": c["exact_worst"]}
    if c["exact_errors"]:
        return out
    for mode in MODES:
        if row.get(f"{mode}_match") is False and not row.get(f"{mode}_errors") \
                and row[f"{mode}_gmean"] <= CONTROL_SLACK * c["exact_gmean"] \
                and row[f"{mode}_worst"] <= CONTROL_SLACK * c["exact_worst"]:
            out[f"{mode}_match"] = True
            out[f"{mode}_by_control"] = True
    return out


def _gmean(xs: list[float]) -> float:
    if not xs:
        return 0.0
    if any(math.isnan(x) or math.isinf(x) for x in xs):
        return math.inf
    return math.exp(sum(math.log(max(x, 1e-30)) for x in xs) / len(xs))


def mismatches(rows: list[dict]) -> list[dict]:
    """The built rows where a mode does not match the built-in, or the built-in
    after unpatch() is not the first built-in run."""
    return [r for r in rows if r.get("built") and (
        r.get("patch_match") is False or r.get("fuse_match") is False
        or r.get("unpatch_bitwise") is False)]


def summary(rows: list[dict], dtypes: list[str]) -> dict:
    models = sorted({r["model"] for r in rows})
    built = sorted({r["model"] for r in rows if r.get("built")})
    s: dict[str, Any] = {"found": len(models), "built": len(built), "not_built": {}}
    for r in rows:
        if not r.get("built"):
            s["not_built"][r["model"]] = r.get("why", "")
    for d in dtypes:
        dr = [r for r in rows if r.get("built") and r["dtype"] == d]
        s[d] = {
            "compared": sum(bool(r.get("builtin_runs")) for r in dr),
            "matched_patch": sum(bool(r.get("patch_match")) for r in dr),
            "matched_fuse": sum(bool(r.get("fuse_match")) for r in dr),
            "fused_models": sorted(r["model"] for r in dr if r.get("fused_forward", 0) > 0),
            "fused_blocks": sum(r.get("fused_forward", 0) for r in dr),
            "fallbacks": _add_counts(r.get("fallbacks", {}) for r in dr),
            "no_plugin_node": sorted(r["model"] for r in dr if r.get("builtin_runs")
                                     and not sum(r.get("patch_nodes", {}).values())),
            "decided_by_fp64": sorted(r["model"] for r in dr if r.get("patch_by_fp64")
                                      or r.get("fuse_by_fp64")),
            "decided_by_noise": sorted(r["model"] for r in dr if r.get("patch_by_noise")
                                       or r.get("fuse_by_noise")),
            "decided_by_control": sorted(r["model"] for r in dr if r.get("patch_by_control")
                                         or r.get("fuse_by_control")),
            "bf16_noise": sum(r.get("bf16_noise", 0) for r in dr),
            "builtin_not_reproducible": sum(not r.get("builtin_reproducible", True) for r in dr),
            "builtin_raises": sum(bool(r.get("builtin_note", "").startswith("built-in raises")) for r in dr),
            "unpatch_bitwise_ok": sum(r.get("unpatch_bitwise") is True for r in dr),
            "unpatch_bitwise_checked": sum(r.get("unpatch_bitwise") in (True, False) for r in dr),
        }
    return s


def _add_counts(dicts: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            total[k] = total.get(k, 0) + v
    return total
