"""Patching from outside the program: the environment variables and the
report that shows which RMSNorm primitives a run's gradients used.

MLX_RMSNORM_PATCH=1   ``patch()`` at ``import mlx_rmsnorm`` (``=fuse``:
                      ``patch(fuse=True)``, mlx-lm blocks fused); the package
                      installs a .pth file that imports it at interpreter
                      start when the variable is set, so any program in the
                      environment (``mlx_lm.lora``, a script) runs patched.
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
from collections import Counter

import mlx.core as mx

_PRIMITIVES = ("RMSNormPlugin", "RMSNormPluginVJP", "RMSNorm", "RMSNormVJP",
               "AddRMSNormPlugin", "AddRMSNormPluginVJP")
# LayerNorm (patch() routes mx.fast.layer_norm too), reported after RMSNorm.
_LAYER_PRIMITIVES = ("LayerNormPlugin", "LayerNormPluginVJP", "LayerNorm", "LayerNormVJP")
# Graphs of the first calls only: under mx.compile those are the traces, and
# exporting a large eager graph at every step would cost a real run time.
_MAX_GRAPHS = 8

_counts = dict.fromkeys(_PRIMITIVES + _LAYER_PRIMITIVES, 0)
_graphs = 0
_installed = False


def _enabled(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def primitive_counts(*outputs) -> Counter:
    """How many nodes of each primitive (by name: RMSNormPlugin, RMSNorm, ...)
    the graph that computes `outputs` holds, read from its DOT text."""
    dot = io.StringIO()
    mx.export_to_dot(dot, *outputs)
    return Counter(re.findall(r'label ="([^"]+)"', dot.getvalue()))


def _count(*outputs) -> None:
    global _graphs
    if _graphs >= _MAX_GRAPHS:
        return
    _graphs += 1
    found = primitive_counts(*outputs)
    for name in _counts:
        _counts[name] += found[name]


def _counting(transform):
    def wrapped_transform(*args, **kwargs):
        fn = transform(*args, **kwargs)

        def wrapped(*a, **k):
            out = fn(*a, **k)
            try:
                _count(out)
            except Exception as e:  # a report must never break the run
                print(f"mlx_rmsnorm report: could not read a graph ({e})", file=sys.stderr)
            return out

        return wrapped

    wrapped_transform.__wrapped__ = transform
    return wrapped_transform


def summary() -> str:
    import mlx_rmsnorm

    c = _counts
    return (
        f"mlx_rmsnorm report: patched={mlx_rmsnorm.is_patched()} gradient_graphs={_graphs} "
        f"RMSNormPlugin={c['RMSNormPlugin']} RMSNormPluginVJP={c['RMSNormPluginVJP']} "
        f"builtin_RMSNorm={c['RMSNorm']} builtin_RMSNormVJP={c['RMSNormVJP']} "
        f"AddRMSNormPlugin={c['AddRMSNormPlugin']} AddRMSNormPluginVJP={c['AddRMSNormPluginVJP']} "
        f"LayerNormPlugin={c['LayerNormPlugin']} LayerNormPluginVJP={c['LayerNormPluginVJP']} "
        f"builtin_LayerNorm={c['LayerNorm']} builtin_LayerNormVJP={c['LayerNormVJP']}"
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
    atexit.register(lambda: print(summary(), file=sys.stderr, flush=True))


def from_environment() -> None:
    import mlx_rmsnorm

    if _enabled("MLX_RMSNORM_PATCH"):
        mlx_rmsnorm.patch(fuse=os.environ["MLX_RMSNORM_PATCH"].strip().lower() == "fuse")
    if _enabled("MLX_RMSNORM_REPORT"):
        install_report()
