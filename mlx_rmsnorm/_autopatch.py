"""Patching from outside the program: the environment variables and the
report that shows which norm primitives a run used.

Every variable follows one rule: the spellings below, in any case, with
surrounding spaces ignored; anything else is a one-line error naming the
variable and the values it takes, which stops the program (also when the
.pth file below reads it at interpreter start).

MLX_RMSNORM_PATCH     1: ``patch()`` at ``import mlx_rmsnorm``; fuse:
                      ``patch(fuse=True)`` (mlx-lm blocks fused); off: unset,
                      empty, 0, false, no, off. The package installs a .pth
                      file that imports it at interpreter start when the
                      variable is on, so any program in the environment
                      (``mlx_lm.lora``, a script) runs patched.
MLX_RMSNORM_ROUTE_CPU ``route_cpu(True)``: under ``patch()``, calls on a CPU
                      stream run the plugin's CPU path too (by default they
                      run MLX's own op there).
MLX_RMSNORM_REPORT    at exit, print to stderr what ran: the norm primitives
                      (ours and the built-in's) in the gradient graphs, the
                      fused blocks, our forward ops built (every call, with
                      or without a gradient, where the extension counts
                      them), and which implementation the default device
                      runs. The .pth imports the package for this variable
                      too, so on its own it reports an unpatched program.
                      These two are switches: on is 1, true, yes, on; off
                      is unset, empty, 0, false, no, off.
MLX_RMSNORM_FUSE_MIN_ROWS  the rows from which ``patch(fuse=True)``'s blocks
                      fuse: an integer >= 0 in the digits 0-9; unset or
                      empty: the default.

This module imports MLX only inside the functions that need it: the
variables' rules (read_environment) run without it, as the .pth's test
does in interpreters that have no MLX.
"""

from __future__ import annotations

import atexit
import io
import os
import re
import sys
import time
from collections import Counter

_PRIMITIVES = ("RMSNormPlugin", "RMSNormPluginVJP", "RMSNorm", "RMSNormVJP",
               "AddRMSNormPlugin", "AddRMSNormPluginVJP")
# LayerNorm (patch() routes mx.fast.layer_norm too), reported after RMSNorm.
_LAYER_PRIMITIVES = ("LayerNormPlugin", "LayerNormPluginVJP", "LayerNorm", "LayerNormVJP",
                     "AddLayerNormPlugin", "AddLayerNormPluginVJP")
# Every gradient graph is counted while counting has cost at most 2 s, or this
# share of the process's time so far (reading a graph means exporting it as
# text: a long training run must not pay that at every step); past that the
# report says how many it counted of how many.
_MAX_SHARE = 0.05
_FREE_S = 2.0

_counts = dict.fromkeys(_PRIMITIVES + _LAYER_PRIMITIVES, 0)
_graphs = 0  # gradient graphs made
_counted = 0  # of them, counted
_counting_s = 0.0  # time spent counting
_installed = False
_START = time.perf_counter()


def primitive_counts(*outputs) -> Counter:
    """How many nodes of each primitive (by name: RMSNormPlugin, RMSNorm, ...)
    the graph that computes `outputs` holds, read from its DOT text."""
    import mlx.core as mx

    dot = io.StringIO()
    mx.export_to_dot(dot, *outputs)
    return Counter(re.findall(r'label ="([^"]+)"', dot.getvalue()))


def _count(*outputs) -> None:
    global _graphs, _counted, _counting_s
    _graphs += 1
    if _counting_s > max(_FREE_S, _MAX_SHARE * (time.perf_counter() - _START)):
        return
    t = time.perf_counter()
    found = primitive_counts(*outputs)
    for name in _counts:
        _counts[name] += found[name]
    _counted += 1
    _counting_s += time.perf_counter() - t


def _counting_call(fn):
    """``fn`` that counts the graph of what it returns (``mx.vjp``: the
    primals and the cotangents; a function made by ``mx.grad``)."""

    def wrapped(*a, **k):
        out = fn(*a, **k)
        try:
            _count(out)
        except Exception as e:  # a report must never break the run
            print(f"mlx_rmsnorm report: could not read a graph ({e})", file=sys.stderr)
        return out

    wrapped.__wrapped__ = fn
    return wrapped


def _counting(transform):
    """``mx.grad`` / ``mx.value_and_grad`` whose functions count their graphs."""

    def wrapped_transform(*args, **kwargs):
        return _counting_call(transform(*args, **kwargs))

    wrapped_transform.__wrapped__ = transform
    return wrapped_transform


# Our forward primitives, as _ext._op_counts names them, and its counts of
# calls that ran MLX's op in place of ours.
_BUILT = ("RMSNormPlugin", "AddRMSNormPlugin", "LayerNormPlugin", "AddLayerNormPlugin")
_ROUTED_TO_BUILTIN = ("builtin_rms_norm", "builtin_layer_norm")


def _built_line() -> str:
    from . import _ext

    try:
        ops = dict(_ext._op_counts())
    except Exception as e:  # noqa: BLE001 - a report must never break the run
        return f"mlx_rmsnorm report: could not read the extension's op counter ({e})"
    ours = " ".join(f"{k}={ops.get(k, 0)}" for k in _BUILT)
    theirs = " ".join(f"{k}={ops.get(k, 0)}" for k in _ROUTED_TO_BUILTIN)
    return (f"mlx_rmsnorm report: forward ops built, every call (eager or traced, with or without "
            f"a gradient): {ours} (ours); {theirs} (calls that ran MLX's mx.fast op in place of "
            f"ours: routed calls on a stream that runs the built-in, export traces, rows no plan "
            f"of ours covers)")


CPU_NOTE = (
    "\nmlx_rmsnorm report: the default stream is the CPU, where patch() runs MLX's own norm "
    "(expanded into plain ops, not counted above); MLX_RMSNORM_ROUTE_CPU=1 runs the plugin there"
)
CPU_ROUTED_NOTE = (
    "\nmlx_rmsnorm report: the default stream is the CPU, where patch() runs the plugin's CPU path "
    "(route_cpu is on)"
)
CPU_UNPATCHED_NOTE = (
    "\nmlx_rmsnorm report: the default stream is the CPU and nothing is patched: MLX's own norm ran, "
    "which MLX expands into plain ops on the CPU, so builtin_RMSNorm and builtin_LayerNorm (and "
    "their VJPs) stay 0 there whatever the program ran"
)
GPU_WITHOUT_KERNELS_NOTE = (
    "\nmlx_rmsnorm report: the default device is a GPU and this build has no CUDA kernels of ours "
    "(has_cuda_kernels() is False): mx.fast's norms (nn.RMSNorm, nn.LayerNorm) run MLX's own op "
    "there, patched or not"
)


def _device_note() -> str:
    """Which implementation the default device runs, where that is not the
    plugin's kernels."""
    import mlx.core as mx

    import mlx_rmsnorm

    from . import _patching

    if mx.default_device() == mx.cpu:
        if not mlx_rmsnorm.is_patched():
            return CPU_UNPATCHED_NOTE
        return CPU_ROUTED_NOTE if _patching.routes_cpu() else CPU_NOTE
    if not mlx_rmsnorm.has_cuda_kernels():
        return GPU_WITHOUT_KERNELS_NOTE
    return ""


def summary() -> str:
    """The report: what ran, one statement a line."""
    import mlx_rmsnorm

    from . import _fuse

    c = _counts
    sampled = "" if _counted == _graphs else (
        f" (counted the first {_counted} of {_graphs} gradient graphs: counting more would have cost "
        f"over {_MAX_SHARE:.0%} of the run's time)"
    )
    blocks = _fuse.counts()
    fallbacks = ", ".join(f"{k.split(':', 1)[1]}: {v}" for k, v in sorted(blocks.items()) if k != "fused")
    return (
        f"mlx_rmsnorm report: patched={mlx_rmsnorm.is_patched()} gradient_graphs={_graphs} "
        f"RMSNormPlugin={c['RMSNormPlugin']} RMSNormPluginVJP={c['RMSNormPluginVJP']} "
        f"builtin_RMSNorm={c['RMSNorm']} builtin_RMSNormVJP={c['RMSNormVJP']} "
        f"AddRMSNormPlugin={c['AddRMSNormPlugin']} AddRMSNormPluginVJP={c['AddRMSNormPluginVJP']} "
        f"LayerNormPlugin={c['LayerNormPlugin']} LayerNormPluginVJP={c['LayerNormPluginVJP']} "
        f"builtin_LayerNorm={c['LayerNorm']} builtin_LayerNormVJP={c['LayerNormVJP']} "
        f"AddLayerNormPlugin={c['AddLayerNormPlugin']} AddLayerNormPluginVJP={c['AddLayerNormPluginVJP']}"
        f"{sampled} (nodes of each primitive in the graphs that mx.grad, mx.value_and_grad and "
        f"mx.vjp made)\n"
        f"mlx_rmsnorm report: fused={mlx_rmsnorm.is_fused()} blocks_fused={blocks['fused']} "
        f"blocks_unfused={sum(v for k, v in blocks.items() if k != 'fused')}"
        + (f" ({fallbacks})" if fallbacks else "")
        + " (calls of mlx-lm decoder blocks under patch(fuse=True): fused, or run as their own code)\n"
        + _built_line()
        + _device_note()
    )


def install_report() -> None:
    """Count RMSNorm primitives in the graphs of ``mx.grad`` /
    ``mx.value_and_grad`` (and so ``nn.value_and_grad``, which mlx-lm's
    trainer uses) and print them at exit."""
    global _installed
    if _installed:
        return
    _installed = True
    import mlx.core as mx

    mx.value_and_grad = _counting(mx.value_and_grad)
    mx.grad = _counting(mx.grad)
    mx.vjp = _counting_call(mx.vjp)
    atexit.register(lambda: print(summary(), file=sys.stderr, flush=True))


# --- the variables --------------------------------------------------------------
# One rule for all of them (see the module's docstring). The .pth line
# (build_backend/mlx_rmsnorm_build.py, PTH_LINE) imports the package when
# MLX_RMSNORM_PATCH or MLX_RMSNORM_REPORT is not off, or any of them holds a
# value these rules refuse; tests/test_variables.py checks that the two agree.
ON = ("1", "true", "yes", "on")
OFF = ("", "0", "false", "no", "off")
# MLX_RMSNORM_PATCH's values: what patch() gets for each (OFF: no patch()).
_PATCH_VALUES = {"1": False, "fuse": True}
SWITCHES = ("MLX_RMSNORM_ROUTE_CPU", "MLX_RMSNORM_REPORT")
# MLX_RMSNORM_ALLOCATOR: where our GPU outputs come from (read in C++,
# device_memory.cpp, with the same spaces and case ignored): our pool (the
# default) or MLX's allocator.
ALLOCATORS = ("", "pool", "mlx")
# Set on sys by the .pth line just before it imports the package: the import
# runs inside site at interpreter start (the only way to know it: from Python
# 3.11 site is frozen, and addsitedir can run it later too).
FROM_PTH = "_mlx_rmsnorm_from_pth"


def _bad_variable(message: str) -> None:
    """A wrong value is an error, never a silent default. From the .pth, at
    interpreter start, site would print an exception as a traceback and run
    the program unpatched, and a SystemExit there is a "Fatal Python error"
    with a traceback of site: so the process prints the one line and ends
    at once (status 2). Elsewhere (``import mlx_rmsnorm``) a ValueError."""
    if getattr(sys, FROM_PTH, False):
        try:
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - the line below is what matters
            pass
        print(message, file=sys.stderr, flush=True)
        os._exit(2)
    raise ValueError(message)


def _raw(name: str) -> str:
    return os.environ.get(name, "")


def read_environment() -> dict:
    """Every variable, checked before anything is applied (a bad value
    anywhere stops the program with nothing patched): ``patch`` (None: off;
    else patch()'s ``fuse``), ``MLX_RMSNORM_ROUTE_CPU`` and
    ``MLX_RMSNORM_REPORT`` (bool), ``rows`` (MLX_RMSNORM_FUSE_MIN_ROWS's
    digits, "" when unset), ``MLX_RMSNORM_ALLOCATOR`` ("pool" or "mlx").
    Needs no MLX."""
    found: dict = {}
    value = _raw("MLX_RMSNORM_PATCH").strip().lower()
    if value in OFF:
        found["patch"] = None
    elif value in _PATCH_VALUES:
        found["patch"] = _PATCH_VALUES[value]
    else:
        _bad_variable(
            f"mlx_rmsnorm: MLX_RMSNORM_PATCH={_raw('MLX_RMSNORM_PATCH')!r} is not one of 1 (patch()), "
            "fuse (patch(fuse=True)) or an off value (0, false, no, off, empty); set one of them "
            "or unset the variable."
        )
    for name in SWITCHES:
        value = _raw(name).strip().lower()
        if value not in ON + OFF:
            _bad_variable(
                f"mlx_rmsnorm: {name}={_raw(name)!r} is neither on (1, true, yes, on) nor off "
                "(0, false, no, off, empty); set one of them or unset the variable."
            )
        found[name] = value in ON
    rows = _raw("MLX_RMSNORM_FUSE_MIN_ROWS").strip()
    if rows and not (rows.isascii() and rows.isdigit()):  # isdigit alone takes '³'
        _bad_variable(
            f"mlx_rmsnorm: MLX_RMSNORM_FUSE_MIN_ROWS={_raw('MLX_RMSNORM_FUSE_MIN_ROWS')!r} is not a "
            "row count (an integer >= 0 in the digits 0-9); set one or unset the variable for the "
            "default."
        )
    found["rows"] = rows
    allocator = _raw("MLX_RMSNORM_ALLOCATOR").strip().lower()
    if allocator not in ALLOCATORS:
        _bad_variable(
            f"mlx_rmsnorm: MLX_RMSNORM_ALLOCATOR={_raw('MLX_RMSNORM_ALLOCATOR')!r} is neither pool "
            "(our GPU memory pool, the default; also empty) nor mlx (MLX's allocator); set one of "
            "them or unset the variable."
        )
    found["MLX_RMSNORM_ALLOCATOR"] = allocator or "pool"
    return found


def from_environment() -> None:
    """``import mlx_rmsnorm`` applies the variables."""
    found = read_environment()
    if hasattr(sys, FROM_PTH):  # the .pth's import is done with its checks
        delattr(sys, FROM_PTH)
    import mlx_rmsnorm
    from mlx_rmsnorm import _fuse

    rows = found["rows"]
    if rows:  # before MLX_RMSNORM_PATCH: the first fused call reads it
        _fuse.set_min_rows(int(rows))
    if found["patch"] is not None:
        mlx_rmsnorm.patch(fuse=found["patch"])
    if found["MLX_RMSNORM_ROUTE_CPU"]:
        mlx_rmsnorm.route_cpu(True)
    if found["MLX_RMSNORM_REPORT"]:
        install_report()
