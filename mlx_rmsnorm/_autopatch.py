"""Patching from outside the program: the environment variables and the
report that shows which RMSNorm primitives a run's gradients used.

MLX_RMSNORM_PATCH=1   ``patch()`` at ``import mlx_rmsnorm`` (``=fuse``:
                      ``patch(fuse=True)``, mlx-lm blocks fused); the package
                      installs a .pth file that imports it at interpreter
                      start when the variable is set, so any program in the
                      environment (``mlx_lm.lora``, a script) runs patched.
MLX_RMSNORM_ROUTE_CPU=1  ``route_cpu(True)``: under ``patch()``, calls on a
                      CPU stream run the plugin's CPU path too (by default
                      they run MLX's own op there).
MLX_RMSNORM_REPORT=1  at exit, print to stderr how many RMSNorm and LayerNorm
                      primitives (ours and the built-in's) the gradient graphs
                      held. The .pth imports the package for this variable
                      too, so on its own it reports an unpatched program. On
                      the CPU MLX expands the built-in into elementary ops,
                      so there only ours are counted.
"""

from __future__ import annotations

import atexit
import io
import os
import re
import sys
import time
from collections import Counter

import mlx.core as mx

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


def _enabled(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def primitive_counts(*outputs) -> Counter:
    """How many nodes of each primitive (by name: RMSNormPlugin, RMSNorm, ...)
    the graph that computes `outputs` holds, read from its DOT text."""
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


def summary() -> str:
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
        f"{sampled}\n"
        f"mlx_rmsnorm report: fused={mlx_rmsnorm.is_fused()} blocks_fused={blocks['fused']} "
        f"blocks_unfused={sum(v for k, v in blocks.items() if k != 'fused')}"
        + (f" ({fallbacks})" if fallbacks else "")
        + (CPU_NOTE if mlx_rmsnorm.is_patched() and mx.default_device() == mx.cpu
           and not _fuse._cpu_plugin else "")
    )


CPU_NOTE = (
    "\nmlx_rmsnorm report: the default stream is the CPU, where patch() runs MLX's own norm "
    "(expanded into plain ops, not counted above); MLX_RMSNORM_ROUTE_CPU=1 runs the plugin there"
)


def install_report() -> None:
    """Count RMSNorm primitives in the graphs of ``mx.grad`` /
    ``mx.value_and_grad`` (and so ``nn.value_and_grad``, which mlx-lm's
    trainer uses) and print them at exit."""
    global _installed
    if _installed:
        return
    _installed = True
    mx.value_and_grad = _counting(mx.value_and_grad)
    mx.grad = _counting(mx.grad)
    mx.vjp = _counting_call(mx.vjp)
    atexit.register(lambda: print(summary(), file=sys.stderr, flush=True))


# MLX_RMSNORM_PATCH's values: what patch() gets for each ("" and "0": off).
_PATCH_VALUES = {"1": False, "fuse": True}


def _bad_variable(message: str) -> None:
    """A wrong value is an error, never a silent default. From the .pth, at
    interpreter start, an exception would be printed and the program run
    unpatched: there the process stops with the one line instead."""
    in_site = any(
        f.f_code.co_name == "addpackage" and f.f_code.co_filename.endswith("site.py")
        for f in _frames()
    )
    if in_site:
        print(message, file=sys.stderr)
        raise SystemExit(2)
    raise ValueError(message)


def _frames():
    f = sys._getframe()
    while f is not None:
        yield f
        f = f.f_back


def from_environment() -> None:
    import mlx_rmsnorm
    from mlx_rmsnorm import _fuse

    rows = os.environ.get("MLX_RMSNORM_FUSE_MIN_ROWS", "").strip()
    if rows:  # before MLX_RMSNORM_PATCH: the first fused call reads it
        if not rows.isdigit():
            _bad_variable(
                f"mlx_rmsnorm: MLX_RMSNORM_FUSE_MIN_ROWS={rows!r} is not a row count (an integer "
                f">= 0; default {_fuse.MIN_ROWS}); set one or unset the variable."
            )
        _fuse.MIN_ROWS = int(rows)
    value = os.environ.get("MLX_RMSNORM_PATCH", "").strip()
    if value not in ("", "0"):
        if value.lower() not in _PATCH_VALUES:
            _bad_variable(
                f"mlx_rmsnorm: MLX_RMSNORM_PATCH={value!r} is not one of 1 (patch()), "
                "fuse (patch(fuse=True)) or 0 (off); set one of them or unset the variable."
            )
        mlx_rmsnorm.patch(fuse=_PATCH_VALUES[value.lower()])
    if _enabled("MLX_RMSNORM_ROUTE_CPU"):
        mlx_rmsnorm.route_cpu(True)
    if _enabled("MLX_RMSNORM_REPORT"):
        install_report()
