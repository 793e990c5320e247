"""``patch(fuse=True)``: mlx-lm decoder blocks rewritten so that the residual
add that feeds a norm runs as :func:`mlx_rmsnorm.add_rms_norm`, and Gemma's
norms scale by ``1 + w`` formed in fp32 (``offset=1.0``) instead of a
``1.0 + self.weight`` rounded to the weight's dtype.

Liger-style: one small entry per architecture saying which class attribute
to swap for what; ``remove()`` puts every original back. Only methods are
swapped, never parameters: models, checkpoints and ``model.parameters()``
are the same. A block whose norm is not the class the entry expects (a user
replaced it) runs its original code.

What is fused, per block (the pre-norm pattern of llama.py, qwen3.py, ...)::

    r = attn(input_layernorm(x)); h = x + r; r = mlp(post_attention_layernorm(h))

becomes ``y, h = add_rms_norm(x, r, post_attention_layernorm.weight, eps)``
and ``r = mlp(y)``. Gemma 2/3 add a norm of r first
(``h = x + post_attention_layernorm(r)``, then ``pre_feedforward_layernorm(h)``):
the add and the second norm fuse the same way.

The block's other add, ``out = h + r``, feeds the *next* block's input norm,
across the model's layer loop, which these entries leave alone. A rewritten
block still returns ``out = h + r`` (an array, as before: the loop, caches,
pipeline sends and the final norm see what they always saw) and remembers,
in a per-thread slot, the (out, h, r) it made it from. When the next
rewritten block is called with that very array (identity), it computes its
input norm as ``y, out = add_rms_norm(h, r, input_layernorm.weight)`` and
carries that h on: the same values (``h + r`` rounded once, either way), and
the unfused ``h + r`` is left with no consumer, so MLX's lazy graph never runs
it. Anything else that reads ``out`` (a model that keeps it, the last
block's output going into the final norm) still gets it computed. The slot
holds ``out`` weakly: once nothing else holds it (the model has returned), h
and r are let go too.
"""

from __future__ import annotations

import importlib
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional

import mlx.core as mx
import mlx.nn as nn

from . import _ext

_lock = threading.RLock()
# (module, class, attribute) -> the original attribute, while swapped.
_originals: dict[tuple[str, str, str], Any] = {}


@dataclass(frozen=True)
class Swap:
    module: str  # mlx_lm.models.<file>
    cls: str  # class in that module
    attr: str  # method replaced
    make: Callable[[Any, Any], Callable]  # (module object, original) -> replacement


def _is_rms_norm(norm: Any) -> bool:
    return isinstance(norm, nn.RMSNorm)


_slot = threading.local()  # .holder: [pending] of this thread, see _defer


def _holder() -> list:
    holder = getattr(_slot, "holder", None)
    if holder is None:
        holder = _slot.holder = [None]
    return holder


def _defer(out: mx.array, h: mx.array, r: mx.array) -> mx.array:
    """Returns `out` (= h + r), remembering how it was made: (a weak
    reference to out, h, r). When out itself is gone (the model returned, or
    nothing took it), h and r are let go with it."""
    holder = _holder()

    def forget(ref, holder=holder):
        if holder[0] is not None and holder[0][0] is ref:
            holder[0] = None

    holder[0] = (weakref.ref(out, forget), h, r)
    return out


def _input_norm(norm: Any, x: mx.array, fusable: bool, offset: float) -> tuple:
    """(input_layernorm(x), the residual to carry on): fused with the previous
    block's h + r when x is that block's output."""
    holder = _holder()
    pending, holder[0] = holder[0], None
    if fusable and pending is not None and pending[0]() is x:
        y, x = _ext.add_rms_norm(pending[1], pending[2], norm.weight, norm.eps, offset=offset)
        return y, x
    return norm(x), x


def _drop_pending() -> None:
    _holder()[0] = None


def _pending() -> Optional[tuple]:
    """This thread's remembered (out ref, h, r), or None (for tests)."""
    return _holder()[0]


# --- replacements ---------------------------------------------------------------


def _pre_norm_block(mod: Any, original: Callable) -> Callable:
    """llama / mistral / qwen2 / qwen3 / qwen3_moe: ``h = x + r`` then
    ``post_attention_layernorm(h)``."""

    def __call__(self, x, mask=None, cache=None):
        norm = self.post_attention_layernorm
        if not _is_rms_norm(norm):
            _drop_pending()
            return original(self, x, mask, cache)
        y, x = _input_norm(self.input_layernorm, x, _is_rms_norm(self.input_layernorm), 0.0)
        r = self.self_attn(y, mask, cache)
        y, h = _ext.add_rms_norm(x, r, norm.weight, norm.eps)
        r = self.mlp(y)
        return _defer(h + r, h, r)

    return __call__


def _gemma_norm(mod: Any, original: Callable) -> Callable:
    """Gemma's RMSNorm: ``rms_norm(x, 1.0 + weight)`` with the 1 added in fp32."""

    def __call__(self, x):
        return _ext.rms_norm(x, self.weight, self.eps, offset=1.0)

    return __call__


def _gemma_block(mod: Any, original: Callable) -> Callable:
    """gemma (v1): llama's block with Gemma norms (offset 1)."""

    def __call__(self, x, mask=None, cache=None):
        norm = self.post_attention_layernorm
        if type(norm) is not mod.RMSNorm:
            _drop_pending()
            return original(self, x, mask, cache)
        inorm = self.input_layernorm
        y, x = _input_norm(inorm, x, type(inorm) is mod.RMSNorm, 1.0)
        r = self.self_attn(y, mask, cache)
        y, h = _ext.add_rms_norm(x, r, norm.weight, norm.eps, offset=1.0)
        r = self.mlp(y)
        return _defer(h + r, h, r)

    return __call__


def _gemma2_block(mod: Any, original: Callable) -> Callable:
    """gemma2 / gemma3_text: ``h = x + post_attention_layernorm(r)`` then
    ``pre_feedforward_layernorm(h)``. gemma3_text clips the residual sum in
    float16 (clip_residual): float16 activations keep the original block."""

    def __call__(self, x, mask=None, cache=None):
        norm = self.pre_feedforward_layernorm
        if type(norm) is not mod.RMSNorm or x.dtype == mx.float16:
            _drop_pending()
            return original(self, x, mask, cache)
        inorm = self.input_layernorm
        y, x = _input_norm(inorm, x, type(inorm) is mod.RMSNorm, 1.0)
        r = self.self_attn(y, mask, cache)
        y, h = _ext.add_rms_norm(
            x, self.post_attention_layernorm(r), norm.weight, norm.eps, offset=1.0
        )
        post = self.post_feedforward_layernorm(self.mlp(y))
        return _defer(h + post, h, post)  # (clip_residual is this add outside float16)

    return __call__


def _pre_norm(module: str, cls: str = "TransformerBlock") -> list[Swap]:
    return [Swap(f"mlx_lm.models.{module}", cls, "__call__", _pre_norm_block)]


def _gemma(module: str, block: Callable) -> list[Swap]:
    return [
        Swap(f"mlx_lm.models.{module}", "RMSNorm", "__call__", _gemma_norm),
        Swap(f"mlx_lm.models.{module}", "TransformerBlock", "__call__", block),
    ]


# model_type -> what to swap. mlx-lm maps "mistral" onto llama.py
# (MODEL_REMAPPING), so llama's entry serves it.
ARCHITECTURES: dict[str, list[Swap]] = {
    "llama": _pre_norm("llama"),
    "mistral": _pre_norm("llama"),
    "qwen2": _pre_norm("qwen2"),
    "qwen3": _pre_norm("qwen3"),
    "qwen3_moe": _pre_norm("qwen3_moe", "Qwen3MoeDecoderLayer"),
    "gemma": _gemma("gemma", _gemma_block),
    "gemma2": _gemma("gemma2", _gemma2_block),
    "gemma3_text": _gemma("gemma3_text", _gemma2_block),
}


def fused_architectures() -> list[str]:
    """The mlx-lm ``model_type`` values whose blocks ``patch(fuse=True)`` rewrites."""
    return sorted(ARCHITECTURES)


def _import(name: str) -> Optional[Any]:
    try:
        return importlib.import_module(name)
    except Exception:  # mlx-lm absent, or a file this version does not have
        return None


def is_fused() -> bool:
    """Whether the mlx-lm blocks are currently rewritten."""
    return bool(_originals)


def apply() -> None:
    """Swap every entry's methods (idempotent)."""
    with _lock:
        for swaps in ARCHITECTURES.values():
            for sw in swaps:
                key = (sw.module, sw.cls, sw.attr)
                if key in _originals:
                    continue  # shared entry (mistral -> llama) or already on
                mod = _import(sw.module)
                cls = getattr(mod, sw.cls, None) if mod is not None else None
                if cls is None:
                    continue
                original = cls.__dict__[sw.attr]
                replacement = sw.make(mod, original)
                replacement.__wrapped__ = original  # type: ignore[attr-defined]
                replacement._mlx_rmsnorm_fused = True  # type: ignore[attr-defined]
                _originals[key] = original
                setattr(cls, sw.attr, replacement)


def remove() -> None:
    """Put every original method back (idempotent)."""
    _drop_pending()
    with _lock:
        for (module, cls_name, attr), original in list(_originals.items()):
            mod = _import(module)
            cls = getattr(mod, cls_name, None) if mod is not None else None
            if cls is not None:
                setattr(cls, attr, original)
            del _originals[(module, cls_name, attr)]
