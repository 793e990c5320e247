"""Process-wide routing of ``mx.fast.rms_norm`` and ``mx.fast.layer_norm``
through the plugin, and the export hooks.

This module's state lives here and not in ``mlx_rmsnorm/__init__.py`` so that
``importlib.reload(mlx_rmsnorm)`` (which re-runs only ``__init__``) neither
forgets open ``patched()`` blocks nor mistakes the plugin for the built-in;
MLX's own function is also kept on ``mlx.core.fast`` itself, which outlives a
reload of this module too.

Semantics (``mx.fast.rms_norm`` is one attribute for the whole process):

* ``patch()`` / ``unpatch()`` switch it at once, for every thread. Called
  outside any ``patched()`` block of the calling thread, the switch is the
  state that stays; called inside one, it lasts until blocks close.
* ``patched()`` turns the plugin on for its block. Blocks nest and overlap
  across threads: while any block is open in any thread, a closing block
  leaves the plugin on (turning it back on if a body switched it off); the
  last block to close restores the state from before the first one opened,
  as changed by ``patch()`` / ``unpatch()`` calls made outside blocks
  meanwhile -- not by calls made inside them.
* ``fuse=True`` (``patch``, ``patched``) also rewrites the mlx-lm decoder
  blocks of the architectures in ``_fuse.ARCHITECTURES`` (residual add +
  norm as ``add_rms_norm``), installed on mlx-lm's model modules as they
  are imported; ``unpatch()`` undoes both. In ``patched(fuse=True)`` blocks the rewrite follows the same rules as
  the routing: on while any such block is open, then the state from before.
* On a CPU stream the routed functions run MLX's own ``mx.fast`` op (its
  composition of plain ops), so a CPU program -- MLX's own tests, a user's
  test suite written against the built-in -- computes bit for bit what it
  computes unpatched; the plugin's CPU path stays for explicit calls
  (``mlx_rmsnorm.rms_norm``, ``RMSNorm``). ``route_cpu(True)`` sends CPU
  streams through the plugin too (the tests exercise the CPU path so).
* Other functions on ``mx.fast`` (a user's wrapper, a profiler's hook),
  whoever installed them and whenever: "the state before" is the function
  that was there, not MLX's. ``patch()`` (and a first ``patched()`` block)
  replaces whatever ``mx.fast.rms_norm`` / ``mx.fast.layer_norm`` hold
  with the plugin and keeps it; ``unpatch()`` (and the last block's exit)
  puts back the function it replaced. A function installed over the plugin
  while it is on is the program's latest choice and stays: patching again
  leaves it, and ``unpatch()`` leaves it too, with a RuntimeWarning (it
  still calls the plugin if it calls what it wrapped; nothing can reach
  inside it). ``is_patched()`` says whether ``mx.fast`` holds the plugin's
  functions themselves, so it is False under such a function.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Any, Callable, Iterator

import mlx.core as mx

from . import _ext, _fuse


def _find_builtin(name: str) -> Callable[..., mx.array]:
    """MLX's own ``mx.fast.<name>``, kept on ``mx.fast`` itself."""
    attr = f"_mlx_rmsnorm_builtin_{name}"
    kept = getattr(mx.fast, attr, None)
    if kept is not None:
        return kept
    current = getattr(mx.fast, name)
    if current is getattr(_ext, name):  # cannot happen unless set by hand: no way back
        raise RuntimeError(
            f"[mlx_rmsnorm] mx.fast.{name} is already the plugin and MLX's own "
            "function was not kept; re-import mlx to restore it."
        )
    setattr(mx.fast, attr, current)
    return current


# mx.fast.layer_norm is routed beside rms_norm, with the same guarantees (one
# switch for both, the same blocks, the same export hooks).
BUILTIN = _find_builtin("rms_norm")
BUILTIN_LAYER_NORM = _find_builtin("layer_norm")

_lock = threading.RLock()
_open_blocks = 0  # patched() blocks open now, all threads together
_state_after_blocks = False  # what the last block to close restores
_local = threading.local()  # .depth: patched() blocks open in this thread
_open_fuse_blocks = 0  # patched(fuse=True) blocks open now
_fuse_after_blocks = False  # the block rewrite the last such block restores


# What patch() puts on mx.fast: mx.fast's signatures, MLX's own op on a CPU
# stream (unless route_cpu(True)), ours elsewhere; the choice is made in C++,
# per call, at no Python cost.
ROUTED_RMS_NORM = _ext.routed_rms_norm
ROUTED_LAYER_NORM = _ext.routed_layer_norm


_ROUTED = (("rms_norm", ROUTED_RMS_NORM), ("layer_norm", ROUTED_LAYER_NORM))


def _saved_attr(name: str) -> str:
    # What patch() replaced, to be put back: kept on mx.fast (like MLX's own
    # function) so that a reload of this module does not lose it; None or
    # absent while the routing is off.
    return f"_mlx_rmsnorm_replaced_{name}"


def _routing_on() -> bool:
    """Whether our routing is on: patch() installed it and nothing undid it
    (a function installed over it since may hide it: see is_patched)."""
    return getattr(mx.fast, _saved_attr("rms_norm"), None) is not None


def _set(on: bool) -> None:
    """Switch the routing; only ever replaces what patch() put there or
    what it replaced (see the module's docstring, "Other functions")."""
    for name, ours in _ROUTED:
        attr = _saved_attr(name)
        current = getattr(mx.fast, name)
        replaced = getattr(mx.fast, attr, None)
        if on:
            if current is ours:
                if replaced is None:  # put there by hand: unpatch() restores MLX's own
                    setattr(mx.fast, attr, BUILTIN if name == "rms_norm" else BUILTIN_LAYER_NORM)
                continue
            if replaced is not None and current is not replaced:
                continue  # installed over ours while on: the program's latest choice stays
            setattr(mx.fast, attr, current)  # MLX's function, or whatever was there
            setattr(mx.fast, name, ours)
        elif replaced is not None:
            if current is ours:
                setattr(mx.fast, name, replaced)
            else:
                warnings.warn(
                    f"mlx_rmsnorm: mx.fast.{name} was replaced after patch() (by {current!r}); "
                    "unpatch() leaves that function in place, and it calls the plugin if it "
                    "calls what it replaced",
                    RuntimeWarning,
                    stacklevel=4,
                )
            setattr(mx.fast, attr, None)


def is_patched() -> bool:
    """Whether ``mx.fast.rms_norm`` and ``mx.fast.layer_norm`` currently are
    the plugin's routed functions. Those run our kernels on a GPU stream, the
    plugin's CPU path on a CPU stream only with :func:`route_cpu` (else MLX's
    own op, as on a stream without our kernels); a function installed over
    them since patch() makes this False."""
    return mx.fast.rms_norm is ROUTED_RMS_NORM and mx.fast.layer_norm is ROUTED_LAYER_NORM


def route_cpu(on: bool) -> bool:
    """Whether calls on a CPU stream run the plugin under ``patch()`` (and
    the fused blocks fuse there); returns the previous setting. Off by
    default: there ``patch()`` keeps MLX's own op."""
    _check_bool("route_cpu", "on", on)
    with _lock:
        was = _ext._set_route_cpu(on)
        _fuse.set_route_cpu(on)
        return was


def routes_cpu() -> bool:
    """The :func:`route_cpu` setting (for the report): the blocks' copy of
    the extension's switch, which route_cpu() sets beside it."""
    return _fuse.routes_cpu()


def _check_bool(fn: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(
            f"mlx_rmsnorm.{fn}: {name} must be True or False, got {value!r} ({type(value).__name__})"
        )


def _set_fuse(on: bool) -> None:
    _fuse.apply() if on else _fuse.remove()


def _switch(on: bool, fuse: bool = False) -> None:
    global _state_after_blocks, _fuse_after_blocks
    with _lock:
        if getattr(_local, "depth", 0) == 0:
            _state_after_blocks = on
            if fuse or not on:
                _fuse_after_blocks = fuse
        _set(on)
        if fuse or not on:
            _set_fuse(fuse)


def is_fused() -> bool:
    """Whether ``patch(fuse=True)``'s rewrite of mlx-lm's blocks is on: from
    ``patch(fuse=True)`` to ``unpatch()``, whether the model modules are
    imported yet (rewritten then) or not (rewritten when they are); False
    where mlx-lm is not installed."""
    return _fuse.is_fused()


def patch(fuse: bool = False) -> None:
    """Route ``mx.fast.rms_norm`` and ``mx.fast.layer_norm`` (and so every
    ``nn.RMSNorm`` and ``nn.LayerNorm``) through the plugin.

    With ``fuse=True``, also rewrite the decoder blocks of the mlx-lm
    architectures in :func:`fused_architectures` so that a residual add
    followed by a norm runs as one :func:`add_rms_norm` (Gemma's ``1 + w``
    formed as mlx-lm forms it, in the weight's dtype); the blocks are
    rewritten when mlx-lm's model modules are imported (at once for those
    already imported), and without mlx-lm only the routing is on, with a
    warning. ``patch()`` without it leaves an earlier rewrite on.
    Process-wide and idempotent; undone by :func:`unpatch`.
    """
    _check_bool("patch", "fuse", fuse)
    _switch(True, fuse)


def unpatch() -> None:
    """Restore MLX's built-in ``mx.fast.rms_norm`` and ``mx.fast.layer_norm``,
    and every rewritten mlx-lm class. Idempotent."""
    _switch(False)


def fused_architectures() -> list[str]:
    """The mlx-lm ``model_type`` values whose decoder blocks ``patch(fuse=True)`` rewrites."""
    return _fuse.fused_architectures()


@contextlib.contextmanager
def patched(fuse: bool = False) -> Iterator[None]:
    """The plugin inside the block (with ``fuse=True`` also the mlx-lm block
    rewrite); on leaving the last open block, the state found before the first
    (see the module's docstring for threads)."""
    global _open_blocks, _state_after_blocks, _open_fuse_blocks, _fuse_after_blocks
    _check_bool("patched", "fuse", fuse)
    with _lock:
        if _open_blocks == 0:
            _state_after_blocks = _routing_on()
            _fuse_after_blocks = is_fused()
        _open_blocks += 1
        _local.depth = getattr(_local, "depth", 0) + 1
        _set(True)
        if fuse:
            _open_fuse_blocks += 1
            _set_fuse(True)
    try:
        yield
    finally:
        with _lock:
            _open_blocks -= 1
            _local.depth -= 1
            _set(True if _open_blocks else _state_after_blocks)
            if fuse:
                _open_fuse_blocks -= 1
            if _open_fuse_blocks:
                _set_fuse(True)
            elif fuse or not _open_blocks:
                _set_fuse(_fuse_after_blocks)


# --- export -------------------------------------------------------------------
# MLX serializes a graph by primitive name from a fixed table (mlx/export.cpp),
# so our primitives cannot be written, and its export-tracing flag is not
# visible to extensions. These wrappers mark the traced function's run, and the
# op then builds what mx.fast.rms_norm builds: the file holds only MLX's ops
# and imports where the plugin is not installed.


def _marked(fun: Callable[..., Any]) -> Callable[..., Any]:
    def traced(*args: Any, **kwargs: Any) -> Any:
        was = _ext._set_export_tracing(True)
        try:
            return fun(*args, **kwargs)
        finally:
            _ext._set_export_tracing(was)

    return traced


def _install_export_hooks() -> None:
    original_export_function = mx.export_function
    original_exporter = mx.exporter
    if getattr(original_export_function, "_mlx_rmsnorm_hook", False):
        return

    def export_function(file_or_callback: Any, fun: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        return original_export_function(file_or_callback, _marked(fun), *args, **kwargs)

    def exporter(file: str, fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return original_exporter(file, _marked(fun), *args, **kwargs)

    for hook, original in ((export_function, original_export_function), (exporter, original_exporter)):
        hook.__doc__ = original.__doc__
        hook.__wrapped__ = original  # type: ignore[attr-defined]
        hook._mlx_rmsnorm_hook = True  # type: ignore[attr-defined]
    mx.export_function = export_function
    mx.exporter = exporter


_install_export_hooks()
