"""The sweep's report: a markdown table of the rows with the summary's
counts and what was not built, and the rows as arch_sweep.csv and
arch_sweep.json."""

from __future__ import annotations

import csv
import json
import math
import os
from typing import Any

import mlx.core as mx

from .judge import BF16_FLOOR, BF16_MAX, BF16_MEAN, FP32_TOL, summary

def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return "inf" if math.isinf(x) else f"{x:.2e}"
    return str(x)


def markdown(rows: list[dict], dtypes: list[str]) -> str:
    head = ("| model | dtype | params | patch() | fuse=True | fused blocks (fwd) | "
            "plugin nodes (a: add, l: LayerNorm, al: add + LayerNorm) patch / fuse | unpatch bitwise | built-in note |")
    lines = [
        "patch() / fuse=True: float32 the worst max|a - b| / max|b| against the built-in; "
        "bfloat16 the geometric mean / max over quantities of the distance to float32 "
        "over the built-in's own (normwise).",
        "",
        head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if not r.get("built"):
            continue
        def verdict(mode):
            w = _fmt(r.get(f"{mode}_worst", 0.0))
            if r.get(f"{mode}_by_fp64"):
                w += f" (fp64 decides {len(r[f'{mode}_by_fp64'])})"
            if r.get(f"{mode}_by_noise"):
                w += f" (built-in's own noise decides {r[f'{mode}_by_noise']})"
            if r["dtype"] != "float32":
                w = f"{r.get(f'{mode}_gmean', 0.0):.2f}/{r.get(f'{mode}_worst', 0.0):.2f}"
                if "exact_gmean" in r:
                    w += f" (exact control {r['exact_gmean']:.2f}/{r['exact_worst']:.2f})"
            if r.get(f"{mode}_match") is None:
                return "n/a"
            tag = "ok" if r.get(f"{mode}_match") else "**MISMATCH**"
            err = r.get(f"{mode}_error", "")
            extra = "" if r.get(f"{mode}_match") else f" ({r.get(f'{mode}_worst_at', '')})"
            if err:
                extra = f" ({err[:60]})"
            return f"{tag} {w}{extra}"

        def nodes(mode):
            n = r.get(f"{mode}_nodes", {})
            if not n:
                return "-"
            parts = [f"{n.get(k, 0)}{tag}" for k, tag in
                     (("RMSNormPlugin", ""), ("AddRMSNormPlugin", "a"), ("LayerNormPlugin", "l"),
                      ("AddLayerNormPlugin", "al"))
                     if n.get(k, 0) or k == "RMSNormPlugin"]
            return "+".join(parts)

        fb = ", ".join(f"{k} x{v}" for k, v in r.get("fallbacks", {}).items())
        lines.append(
            f"| {r['model']} | {r['dtype']} | {r.get('params', '')} | {verdict('patch')} | "
            f"{verdict('fuse')} | {r.get('fused_forward', 0)}{' (' + fb + ')' if fb else ''} | "
            f"{nodes('patch')} / {nodes('fuse')} | {r.get('unpatch_bitwise', '')} | "
            f"{r.get('builtin_note', '')[:80]} |"
        )
    s = summary(rows, dtypes)
    lines.append("")
    lines.append(f"found {s['found']}, built {s['built']}")
    for d in dtypes:
        t = s[d]
        fb = ", ".join(f"{k} x{v}" for k, v in sorted(t["fallbacks"].items())) or "none"
        lines.append(
            f"{d}: the built-in runs in {t['compared']} of {s['built']}; matched "
            f"patch() {t['matched_patch']}/{t['compared']}, patch(fuse=True) "
            f"{t['matched_fuse']}/{t['compared']}; built-in not reproducible in "
            f"{t['builtin_not_reproducible']}, raises (somewhere) in {t['builtin_raises']}; "
            f"after unpatch() bit for bit {t['unpatch_bitwise_ok']}/{t['unpatch_bitwise_checked']}"
        )
        lines.append(
            f"  fused: {len(t['fused_models'])} models, {t['fused_blocks']} blocks in one forward "
            f"of each ({', '.join(t['fused_models'])}); fallbacks (all runs): {fb}"
        )
        extra = []
        if t["no_plugin_node"]:
            extra.append(f"no plugin node under patch() (nothing compared): {', '.join(t['no_plugin_node'])}")
        if t["decided_by_fp64"]:
            extra.append(f"float64 decided (the built-in itself > 1e-5 off): {', '.join(t['decided_by_fp64'])}")
        if t["decided_by_noise"]:
            extra.append("the built-in's own run-to-run distance decided (not reproducible): "
                         f"{', '.join(t['decided_by_noise'])}")
        if t["decided_by_control"]:
            extra.append("the exact-norm control decided (no further from float32 than it): "
                         f"{', '.join(t['decided_by_control'])}")
        if t["bf16_noise"]:
            extra.append(f"{t['bf16_noise']} quantities left out as bf16 noise")
        if extra:
            lines.append("  " + "; ".join(extra))
    if s["not_built"]:
        lines.append("")
        lines.append("not built:")
        for m, why in sorted(s["not_built"].items()):
            lines.append(f"- {m}: {why}")
    return "\n".join(lines)


def write(rows: list[dict], dtypes: list[str], out: str) -> None:
    os.makedirs(out, exist_ok=True)
    flat_rows = []
    keys: list[str] = []
    for r in rows:
        f = {k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in r.items()}
        flat_rows.append(f)
        keys += [k for k in f if k not in keys]
    with open(os.path.join(out, "arch_sweep.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(flat_rows)
    import mlx_lm

    meta = {
        "mlx": mx.__version__, "mlx_lm": getattr(mlx_lm, "__version__", "?"),
        "device": str(mx.default_device()), "dtypes": dtypes,
        "fp32_tol": FP32_TOL, "bf16_mean": BF16_MEAN, "bf16_max": BF16_MAX,
        "bf16_floor": BF16_FLOOR,
        "summary": summary(rows, dtypes), "rows": rows,
    }
    with open(os.path.join(out, "arch_sweep.json"), "w") as fh:
        json.dump(meta, fh, indent=1, default=_fmt)
