"""Running the sweep: a model under each mode (the built-in twice,
``patch()``, ``patch(fuse=True)``, the built-in after ``unpatch()``, and the
bfloat16 control), its quantities (logits, cache, gradients), one model's
rows, and every model, each in its own process (``python -m lab.sweep
--worker NAME``) or in this one."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
import traceback
from typing import Any, Callable


# Float32 matmuls in float32: MLX runs them in TF32 on a GPU by default (read
# once, at the first matmul), and a norm's rounding difference then comes out
# of the next matmul up to ~1e-4 relative (H200, this sweep with TF32 on:
# olmo_hybrid and qwen3_5, whose built-ins are reproducible, 4e-5 and 6.5e-5
# in gradients), above FP32_TOL for reasons that are not the norm's. As the
# test suite's conftest does; the workers inherit it.
os.environ.setdefault("MLX_ENABLE_TF32", "0")
# The blocks fuse at every row count, the decode steps of the cache mode
# included (as shipped, fewer than 64 rows run the block's own code); so
# does sweep_one, through _fuse.set_min_rows, where the plugin was imported
# first.
os.environ.setdefault("MLX_RMSNORM_FUSE_MIN_ROWS", "0")

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402

import mlx_rmsnorm  # noqa: E402
from mlx_rmsnorm import _fuse  # noqa: E402
from mlx_rmsnorm._patching import BUILTIN, BUILTIN_LAYER_NORM  # noqa: E402

from .configs import GENERIC, SEED, build, n_params  # noqa: E402
from .judge import (BF16_BATCHES, MODES, control_low_precision, first_line, judge, judge_fp32,  # noqa: E402
                    judge_low_precision)

BATCH, PROMPT, DECODE = 2, 8, 2  # tokens: BATCH x (PROMPT + DECODE)
DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16}
# the package's parent: a worker process imports lab from there
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- the modes ------------------------------------------------------------------------


def fuse_counts() -> dict[str, int]:
    return dict(_fuse.counts())


def route_cpu(on: bool) -> bool:
    """Make CPU streams run the plugin under patch(); returns the previous value."""
    return mlx_rmsnorm.route_cpu(on)


def _exact_rms_norm(x, weight, eps, *, stream=None):
    """mx.fast.rms_norm computed in float32 from MLX ops and rounded once."""
    xf = x.astype(mx.float32)
    y = xf * mx.rsqrt(mx.mean(xf * xf, axis=-1, keepdims=True) + eps)
    if weight is None:
        return y.astype(x.dtype)
    return (y * weight.astype(mx.float32)).astype(mx.result_type(x, weight))


def _exact_layer_norm(x, weight, bias, eps, *, stream=None):
    """mx.fast.layer_norm computed in float32 from MLX ops and rounded once."""
    xf = x.astype(mx.float32)
    mean = mx.mean(xf, axis=-1, keepdims=True)
    y = (xf - mean) * mx.rsqrt(mx.var(xf, axis=-1, keepdims=True) + eps)
    out_type = x.dtype
    if weight is not None:
        y, out_type = y * weight.astype(mx.float32), mx.result_type(out_type, weight)
    if bias is not None:
        y, out_type = y + bias.astype(mx.float32), mx.result_type(out_type, bias)
    return y.astype(out_type)


def set_mode(mode: str) -> None:
    """Set `mode` up. Each starts from MLX's own norms (unpatch() leaves a
    function installed over the plugin's while it was on, as the tests' wrong
    norms are), but ``unpatched``, which checks what unpatch() alone restores."""
    if mode not in MODES + ("builtin", "builtin2", "unpatched", "exact"):
        raise ValueError(mode)
    mlx_rmsnorm.unpatch()
    if mode != "unpatched":
        mx.fast.rms_norm, mx.fast.layer_norm = BUILTIN, BUILTIN_LAYER_NORM
    if mode == "exact":  # the bfloat16 control (judge_low_precision)
        mx.fast.rms_norm, mx.fast.layer_norm = _exact_rms_norm, _exact_layer_norm
    elif mode in MODES:
        mlx_rmsnorm.patch(fuse=mode == "fuse")


PLUGIN_NODES = ("RMSNormPlugin", "AddRMSNormPlugin", "LayerNormPlugin", "AddLayerNormPlugin")


def plugin_nodes(out: mx.array) -> dict[str, int]:
    """How many plugin primitives the graph of `out` holds, by name."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "graph.dot")
        mx.export_to_dot(path, out)
        with open(path) as f:
            text = f.read()
    return {n: len(re.findall(rf"\b{n}\b", text)) for n in PLUGIN_NODES}


def _logits(out: Any) -> mx.array:
    if isinstance(out, (tuple, list)):
        out = out[0]
    if not isinstance(out, mx.array):
        out = getattr(out, "logits", out)
    return out


def run_mode(model: nn.Module, tokens: mx.array, count_nodes: bool = False) -> dict:
    """The model's logits (no cache), logits through a prompt cache and the
    gradients of a loss, each an array or the exception it raised."""
    from mlx_lm.models.cache import make_prompt_cache

    result: dict[str, Any] = {}
    _fuse.reset_counts()
    try:
        logits = _logits(model(tokens))
        if count_nodes:
            result["nodes"] = plugin_nodes(logits)
        mx.eval(logits)
        result["logits"] = logits
    except Exception as e:
        result["logits"] = e
    result["fused_forward"] = fuse_counts()

    try:
        cache = make_prompt_cache(model)
        outs = [_logits(model(tokens[:, :PROMPT], cache=cache))]
        mx.eval(outs[-1])
        for i in range(PROMPT, PROMPT + DECODE):
            outs.append(_logits(model(tokens[:, i : i + 1], cache=cache)))
            mx.eval(outs[-1])
        result["cache"] = mx.concatenate(outs, axis=1)
    except Exception as e:
        result["cache"] = e

    def loss_fn(m, x, y):
        logits = _logits(m(x))
        if logits.dtype != mx.float64:
            logits = logits.astype(mx.float32)
        return nn.losses.cross_entropy(logits, y).mean()

    try:
        loss, grads = nn.value_and_grad(model, loss_fn)(model, tokens[:, :-1], tokens[:, 1:])
        flat = dict(tree_flatten(grads))
        mx.eval(loss, flat)
        result["grads"] = flat
    except Exception as e:
        result["grads"] = e
    result["fused_all"] = fuse_counts()
    return result


def quantities(result: dict) -> dict[str, Any]:
    """name -> array or exception: logits, cache, grad:<param>."""
    q = {"logits": result["logits"], "cache": result["cache"]}
    g = result["grads"]
    if isinstance(g, Exception):
        q["grads"] = g
    else:
        q.update({f"grad:{k}": v for k, v in g.items()})
    return q



# --- one model ----------------------------------------------------------------------------


def _set_params(model: nn.Module, params: list, dtype: mx.Dtype) -> None:
    model.update(tree_unflatten([(k, v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v)
                                 for k, v in params]))
    mx.eval(model.parameters())


def _tokens(vocab: int, batch: int) -> mx.array:
    return mx.random.randint(0, vocab, (BATCH, PROMPT + DECODE), key=mx.random.key(SEED + 2 + batch))


def _run(model: nn.Module, tokens: mx.array, mode: str, count_nodes: bool = False) -> dict:
    set_mode(mode)
    try:
        return run_mode(model, tokens, count_nodes=count_nodes)
    finally:
        set_mode("builtin")


def sweep_model(name: str, dtypes: list[str], progress: Callable[[str], None] = lambda s: None) -> list[dict]:
    """The rows (one a dtype) of one model module."""
    base = {"model": name, "found": True}
    try:
        model, config = build(name)
    except Exception as e:
        return [dict(base, dtype=d, built=False, why=first_line(e)) for d in dtypes]
    base.update(built=True, why="", params=n_params(model), layers=len(getattr(model, "layers", []) or []))
    fp32_params = tree_flatten(model.parameters())
    vocab = config.get("vocab_size", GENERIC["vocab_size"])
    tokens = _tokens(vocab, 0)
    ref32: dict[int, dict] = {}  # batch -> the float32 built-in's quantities
    cache64: dict[str, Any] = {}

    def fp32_reference(batch: int) -> dict:
        if batch not in ref32:
            progress(f"{name} float32 builtin (batch {batch})")
            _set_params(model, fp32_params, mx.float32)
            ref32[batch] = quantities(_run(model, _tokens(vocab, batch), "builtin"))
        return ref32[batch]

    def fp64_reference() -> dict:
        """The built-in in float64 on the CPU stream (float64 runs only
        there), computed at first need; {} where it raises (MoE: GatherMM
        takes float32 only)."""
        if "q" not in cache64:
            progress(f"{name} float64 builtin")
            try:
                with mx.stream(mx.cpu):
                    _set_params(model, fp32_params, mx.float64)
                    cache64["q"] = quantities(_run(model, tokens, "builtin"))
            except Exception:
                cache64["q"] = {}
            finally:
                _set_params(model, fp32_params, mx.float32)
        return cache64["q"]

    rows = []
    for dname in dtypes:
        dtype = DTYPES[dname]
        _set_params(model, fp32_params, dtype)
        runs = {}
        for mode in ("builtin", "builtin2", "patch", "fuse", "unpatched"):
            progress(f"{name} {dname} {mode}")
            runs[mode] = _run(model, tokens, mode, count_nodes=mode in MODES)
        if dname == "float32" and isinstance(runs["builtin"]["logits"], Exception):
            # a config the model does not take (or a model that does not run here)
            why = f"built-in forward raises: {first_line(runs['builtin']['logits'])}"
            _set_params(model, fp32_params, mx.float32)
            return [dict(base, dtype=d, built=False, why=why) for d in dtypes]
        q = {m: quantities(r) for m, r in runs.items()}
        row = dict(base, dtype=dname)
        if dname == "float32":
            ref32[0] = q["builtin"]
            row.update(judge(q))
            row.update(judge_fp32(q, fp64_reference))
        else:
            row.update(judge(q))
            batches = [dict(q, ref32=fp32_reference(0))]
            if row["builtin_runs"]:  # more token batches: one batch's ratios hang together
                for batch in range(1, BF16_BATCHES):
                    r32 = fp32_reference(batch)
                    _set_params(model, fp32_params, dtype)
                    more = {"ref32": r32}
                    for mode in ("builtin",) + MODES:
                        progress(f"{name} {dname} {mode} (batch {batch})")
                        more[mode] = quantities(_run(model, _tokens(vocab, batch), mode))
                    batches.append(more)
            row.update(judge_low_precision(batches))
            row["batches"] = len(batches)
            if any(row.get(f"{mode}_match") is False for mode in MODES):
                _set_params(model, fp32_params, dtype)
                for b, batch in enumerate(batches):
                    progress(f"{name} {dname} exact control (batch {b})")
                    batch["exact"] = quantities(_run(model, _tokens(vocab, b), "exact"))
                row.update(control_low_precision(batches, row))
        for mode in MODES:
            row[f"{mode}_nodes"] = runs[mode].get("nodes", {})
        row["fused_forward"] = runs["fuse"]["fused_forward"].get("fused", 0)
        row["fused_all"] = runs["fuse"]["fused_all"].get("fused", 0)
        row["fallbacks"] = {k[len("fallback:"):]: v for k, v in runs["fuse"]["fused_all"].items()
                            if k.startswith("fallback:")}
        row["patch_fused"] = runs["patch"]["fused_all"].get("fused", 0)  # must be 0
        rows.append(row)
    _set_params(model, fp32_params, mx.float32)
    return rows


# --- the whole sweep ------------------------------------------------------------------


def sweep_one(name: str, dtypes: list[str], progress: Callable[[str], None] = lambda s: None) -> list[dict]:
    """sweep_model in this process, with the CPU routing on and the blocks
    fused at every row count (the cache mode's decode steps too), never
    raising."""
    was_routed = route_cpu(True)
    was_rows = _fuse.set_min_rows(0)  # (the environment's default is read only at the plugin's import)
    t0 = time.perf_counter()
    try:
        rows = sweep_model(name, dtypes, progress=progress)
    except Exception as e:  # a failure of the sweep itself: say so, go on
        where = traceback.extract_tb(e.__traceback__)[-1]
        rows = [{"model": name, "found": True, "built": False, "dtype": d,
                 "why": f"sweep error: {first_line(e)} ({os.path.basename(where.filename)}:{where.lineno})"}
                for d in dtypes]
    finally:
        mlx_rmsnorm.unpatch()
        route_cpu(was_routed)
        _fuse.set_min_rows(was_rows)
        mx.clear_cache()
    for r in rows:
        r["seconds"] = round(time.perf_counter() - t0, 2)
    return rows


WORKER_MARK = "ARCH_SWEEP_ROWS "


def sweep_isolated(name: str, dtypes: list[str], timeout: float = 900,
                   progress: Callable[[str], None] = lambda s: None) -> list[dict]:
    """sweep_one in a child process: a model that crashes the interpreter
    (phi3small's forward is a segmentation fault in MLX 0.32.4's CPU build) or
    hangs is recorded as not built, with the phase it died in."""
    import signal
    import subprocess

    progress(f"{name}")
    cmd = [sys.executable, "-m", "lab.sweep", "--worker", name, "--dtypes", ",".join(dtypes)]
    path = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + ([path] if path else [])))
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        phase = _last_phase(err)
        return [{"model": name, "found": True, "built": False, "dtype": d,
                 "why": f"timed out after {timeout:.0f} s in {phase}"} for d in dtypes]
    for line in p.stdout.splitlines():
        if line.startswith(WORKER_MARK):
            return json.loads(line[len(WORKER_MARK):])
    if p.returncode < 0:
        try:
            died = f"signal {-p.returncode} ({signal.Signals(-p.returncode).name})"
        except ValueError:
            died = f"signal {-p.returncode}"
    else:
        tail = [l for l in p.stderr.strip().splitlines() if l.strip()]
        died = f"exit {p.returncode}: {tail[-1][:160] if tail else ''}"
    phase = _last_phase(p.stderr)
    return [{"model": name, "found": True, "built": False, "dtype": d,
             "why": f"the process died in {phase}: {died}",
             "seconds": round(time.perf_counter() - t0, 2)} for d in dtypes]


def _last_phase(stderr: str) -> str:
    phases = [l[len("phase: "):] for l in stderr.splitlines() if l.startswith("phase: ")]
    return phases[-1] if phases else "start-up"


def sweep(names: list[str], dtypes: list[str], show_progress: bool = True,
          isolate: bool = True, jobs: int = 1) -> list[dict]:
    """Every model of `names` (each in its own process with `isolate`;
    `jobs` of those processes at a time: on a GPU machine the models are
    small and the processes' start-up dominates). Rows in `names`' order."""
    try:
        from tqdm import tqdm

        bar = tqdm(total=len(names), disable=not show_progress, file=sys.stderr, dynamic_ncols=True)
    except ImportError:
        bar = None
    set_desc = getattr(bar, "set_description_str", lambda s: None)

    def one(name: str) -> list[dict]:
        if isolate:
            return sweep_isolated(name, dtypes, progress=set_desc if jobs == 1 else lambda s: None)
        return sweep_one(name, dtypes, progress=set_desc)

    by_name: dict[str, list[dict]] = {}
    try:
        if isolate and jobs > 1:
            from concurrent.futures import ThreadPoolExecutor, as_completed

            pool = ThreadPoolExecutor(jobs)
            try:
                futures = {pool.submit(one, name): name for name in names}
                for done in as_completed(futures):
                    by_name[futures[done]] = done.result()
                    set_desc(futures[done])
                    bar is not None and bar.update()
            finally:  # on an interrupt: no new models; the running ones end with their timeout
                pool.shutdown(wait=False, cancel_futures=True)
        else:
            for name in names:
                by_name[name] = one(name)
                bar is not None and bar.update()
    except KeyboardInterrupt:  # a time limit (SIGINT): the models done so far, said so
        print(f"interrupted: {len(by_name)} of {len(names)} models swept", file=sys.stderr)
    if bar is not None:
        bar.close()
    return [row for name in names if name in by_name for row in by_name[name]]
