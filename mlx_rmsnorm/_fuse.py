"""``patch(fuse=True)``: mlx-lm decoder blocks rewritten so that the residual
add that feeds a norm inside the block runs as :func:`mlx_rmsnorm.add_rms_norm`,
and Gemma's norms scale by ``1 + w`` formed in fp32 (``offset=1.0``) instead
of a ``1.0 + self.weight`` rounded to the weight's dtype.

The rule: a rewrite computes what the code it replaces computes (to
rounding), by construction, or it runs that code.

* **Inside one block, nothing between calls.** A block's ``__call__`` is
  ``r = attn(input_layernorm(x)); h = x + r; r = mlp(post_attention_layernorm(h));
  return h + r`` (llama.py, qwen3.py, ...). The rewrite runs
  ``y, h = add_rms_norm(x, r, post_attention_layernorm.weight)`` in place of
  the add and the norm (``add_layer_norm`` for the LayerNorm blocks of gpt2,
  gpt_bigcode, starcoder2, gpt_neox and stablelm), inside that one call: no
  state outlives the call,
  so code between two blocks (an in-place ``h += v``, a hook that reads or
  replaces ``h``) sees and changes exactly what it does unfused. The add
  that feeds the *next* block's input norm is left to the model's loop.
* **Only mlx-lm's own code.** At ``apply()`` each entry's class attribute
  must be mlx-lm's own function (not a wrapper installed before us: it is
  respected, and that class runs unfused) whose source is the one the entry
  was written for (a fingerprint of its text: an mlx-lm that changed the
  block runs its own block, with one warning naming the class). At each
  call, the block must be exactly the entry's class and its norm exactly
  the norm class the entry knows, with that class's own ``__call__`` (a
  subclass, or a replaced ``__call__``, runs the original block).
* **Wrappers installed after us are kept.** mlx-lm's ``grad_checkpoint``
  (and any hook) replaces ``cls.__call__`` with a wrapper of what it found,
  i.e. of the rewrite: checkpointing goes on working around the fused block.
  ``remove()`` puts the original back only where the class still holds our
  function; where something wrapped it, the rewrite stays in the chain but
  inert (it calls the original), so the wrapper survives and the values
  are the original's.
* **Where the built-in runs, the original runs.** On a CPU stream ``patch()``
  leaves MLX's own norm in place (see ``_patching``); the blocks do the same.
* **A decode step runs the original.** A block of fewer than ``MIN_ROWS``
  rows (tokens in the batch) runs its own code, tested before anything
  else: there the fused op saves next to no bandwidth and cost more than
  it saved.

Every decision is counted (:func:`counts`): blocks that ran fused, and
blocks that ran the original and why; ``MLX_RMSNORM_REPORT`` prints them.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import textwrap
import threading
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional

import mlx.core as mx
import mlx.nn as nn

from . import _ext

_lock = threading.RLock()
_counts: Counter = Counter()


def counts() -> Counter:
    """Blocks run since the last :func:`reset_counts`: ``"fused"``, and
    ``"fallback:<reason>"`` for each block that ran its original code."""
    return Counter(_counts)


def reset_counts() -> None:
    _counts.clear()


# fingerprint()'s results by function (the functions the entries check: a
# few dozen, kept alive here), with the code object each was taken from:
# patch(fuse=True) after unpatch() checks every entry again, and reading and
# hashing their sources each time took 6.8 ms (2-core CPU) and slowed the
# call that followed it (docs/NOTES.md, Fused residual add).
_fingerprints: dict[Any, tuple[Any, Optional[str]]] = {}


def fingerprint(fn: Callable) -> Optional[str]:
    """A short hash of a function's source text (None when it has none)."""
    code = getattr(fn, "__code__", None)
    try:
        seen = _fingerprints.get(fn)
    except TypeError:  # unhashable: not remembered
        seen = None
    if seen is not None and seen[0] is code:
        return seen[1]
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        digest: Optional[str] = hashlib.sha256(source.encode()).hexdigest()[:16]
    except (OSError, TypeError):
        digest = None
    try:
        _fingerprints[fn] = (code, digest)
    except TypeError:
        pass
    return digest


# The source of the pre-norm block's __call__ in mlx-lm 0.32.x (llama, qwen2,
# qwen3, qwen3_moe and gemma share its text), of Gemma 2's and Gemma 3's
# blocks, and of Gemma's RMSNorm.__call__ (gemma, gemma2, gemma3_text).
PRE_NORM_BLOCK = frozenset({"61ea9549fdd943d9"})
GEMMA2_BLOCK = frozenset({"2a2e6cf84e96bc63"})
GEMMA3_BLOCK = frozenset({"164ea44802f70ec9"})
CLIP_RESIDUAL = frozenset({"3a9a76082c6addf7"})  # gemma3_text.clip_residual, which its block calls
GEMMA_NORM = frozenset({"38727c90a27781ac"})
# MLX's nn.RMSNorm.__call__, which the pre-norm entries fuse.
NN_RMS_NORM = frozenset({"458fba10719b034e"})
# LayerNorm blocks (mlx-lm 0.32.2): gpt2's and gpt_bigcode's share their text
# (ln_1 / attn / ln_2 / mlp); starcoder2's is PRE_NORM_BLOCK's text with
# nn.LayerNorm norms; gpt_neox's and stablelm's choose between a parallel and
# a sequential residual per layer (use_parallel_residual). MLX's
# nn.LayerNorm.__call__, which they fuse.
GPT2_BLOCK = frozenset({"ad7794027e40e7ac"})
GPT_NEOX_BLOCK = frozenset({"04496daf9381860c"})
STABLELM_BLOCK = frozenset({"f98fb62bffed37a8"})
PHIMOE_BLOCK = frozenset({"a02c52429d3d3a22"})  # llama's names, a MoE for the MLP, keywords
NN_LAYER_NORM = frozenset({"5dec28490c3dd28c"})


@dataclass(frozen=True)
class Swap:
    module: str  # mlx_lm.models.<file>
    cls: str  # class in that module
    attr: str  # method replaced
    make: Callable[[Any, Callable, "_Installed"], Callable]  # (module, original, state) -> replacement
    sources: frozenset  # fingerprints of the originals this replacement was written for
    helpers: tuple = ()  # (name, fingerprints) of module functions the original calls
    norm: str = "rms"  # the mlx.nn norm whose own __call__ apply() must find: "rms" or "layer"

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.module, self.cls, self.attr)


class _Installed:
    """A replacement put on a class: the original it replaced, and whether it
    is active (an inert one, left under a wrapper by remove(), calls the
    original)."""

    def __init__(self, original: Callable) -> None:
        self.original = original
        self.replacement: Optional[Callable] = None
        self.active = True


_installed: dict[tuple[str, str, str], _Installed] = {}
_skipped: dict[tuple[str, str, str], str] = {}  # entries not installed, and why
_nn_rms_norm_call: Optional[Callable] = None  # nn.RMSNorm.__call__, checked at apply()
_nn_layer_norm_call: Optional[Callable] = None  # nn.LayerNorm.__call__, likewise
_cpu_plugin = False  # route_cpu(True): CPU streams run the plugin (tests); see _patching


def _builtin_stream() -> bool:
    """Whether patch() leaves MLX's own norm on the default stream (CPU)."""
    return not _cpu_plugin and mx.default_device() == mx.cpu


# Blocks of fewer rows (tokens in the batch) than this run their own code: a
# decode step. There the fused op saves no bandwidth worth having (a row or
# a few) and the whole token came out 2.8-4.5% slower fused than with the
# block's own code under patch(), while the rewrite with the add and the
# norm as two ops was level (H200, 2048-token prompt; docs/NOTES.md, Fused
# residual add). MLX_RMSNORM_FUSE_MIN_ROWS sets it (_autopatch, at import):
# the tests set 0 to fuse their small inputs.
MIN_ROWS = 64


def _why_not(block: Any, block_cls: type, norm: Any, norm_cls: type, norm_call: Callable) -> Optional[str]:
    """Why this call cannot run fused (None: it can)."""
    if type(block) is not block_cls:
        return "block subclass"
    if type(norm) is not norm_cls:
        return "norm class"
    if norm_cls.__call__ is not norm_call:  # (norm_cls's own: type(norm) is norm_cls)
        return "norm __call__ replaced"
    if _builtin_stream():
        return "cpu stream (built-in)"
    return None


def _fallback(why: str) -> None:
    _counts["fallback:" + why] += 1


def _few_rows(x: mx.array) -> bool:
    """Whether ``x`` is a decode step's (fewer than MIN_ROWS rows; counted).
    Tested first, before any attribute of the block is read: a decode token
    is host work, and this path is what ``patch()`` runs plus this test."""
    if x.size < MIN_ROWS * x.shape[-1]:
        _counts["fallback:few rows (decode)"] += 1
        return True
    return False


# --- replacements ---------------------------------------------------------------


def _pre_norm_block(mod: Any, original: Callable, state: _Installed, cls: type) -> Callable:
    """llama / mistral / qwen2 / qwen3 / qwen3_moe: ``h = x + r`` then
    ``post_attention_layernorm(h)``, an ``nn.RMSNorm``."""

    def __call__(self, x, mask=None, cache=None):
        if not state.active or _few_rows(x):
            return original(self, x, mask, cache)
        norm = self.post_attention_layernorm
        why = _why_not(self, cls, norm, nn.RMSNorm, _nn_rms_norm_call)
        if why is not None:
            _fallback(why)
            return original(self, x, mask, cache)
        _counts["fused"] += 1
        r = self.self_attn(self.input_layernorm(x), mask, cache)
        # norm["weight"]: what nn.RMSNorm.__call__ reads (norm.weight goes
        # through nn.Module.__getattr__, a Python call)
        y, h = _ext.add_rms_norm(x, r, norm["weight"], norm.eps)
        return h + self.mlp(y)

    return __call__


def _gemma_norm(mod: Any, original: Callable, state: _Installed, cls: type) -> Callable:
    """Gemma's RMSNorm: ``rms_norm(x, 1.0 + weight)`` with the 1 added in fp32."""

    def __call__(self, x):
        if not state.active or type(self) is not cls or _builtin_stream():
            return original(self, x)
        return _ext.rms_norm(x, self.weight, self.eps, offset=1.0)

    return __call__


def _gemma_block(mod: Any, original: Callable, state: _Installed, cls: type) -> Callable:
    """gemma (v1): llama's block with Gemma norms (offset 1)."""

    def __call__(self, x, mask=None, cache=None):
        if not state.active or _few_rows(x):
            return original(self, x, mask, cache)
        norm = self.post_attention_layernorm
        why = _why_not(self, cls, norm, mod.RMSNorm, _norm_call(mod))
        if why is not None:
            _fallback(why)
            return original(self, x, mask, cache)
        _counts["fused"] += 1
        r = self.self_attn(self.input_layernorm(x), mask, cache)
        y, h = _ext.add_rms_norm(x, r, norm["weight"], norm.eps, offset=1.0)
        return h + self.mlp(y)

    return __call__


def _gemma2_block(mod: Any, original: Callable, state: _Installed, cls: type) -> Callable:
    """gemma2 / gemma3_text: ``h = x + post_attention_layernorm(r)`` then
    ``pre_feedforward_layernorm(h)``. gemma3_text clips the residual sum in
    float16 (clip_residual): float16 activations run the original block."""

    def __call__(self, x, mask=None, cache=None):
        if not state.active or _few_rows(x):
            return original(self, x, mask, cache)
        norm = self.pre_feedforward_layernorm
        why = _why_not(self, cls, norm, mod.RMSNorm, _norm_call(mod))
        if why is None and x.dtype == mx.float16:
            why = "float16 (clip_residual)"
        if why is not None:
            _fallback(why)
            return original(self, x, mask, cache)
        _counts["fused"] += 1
        r = self.self_attn(self.input_layernorm(x), mask, cache)
        y, h = _ext.add_rms_norm(x, self.post_attention_layernorm(r), norm["weight"], norm.eps, offset=1.0)
        # (gemma3_text's clip_residual is this add outside float16)
        return h + self.post_feedforward_layernorm(self.mlp(y))

    return __call__


def _layer_norm_block(attn: str, ln1: str, ln2: str, parallel: bool = False,
                      defaults: bool = True, mlp: str = "mlp", keywords: bool = False) -> Callable:
    """gpt2 / gpt_bigcode / starcoder2 / gpt_neox / stablelm / phimoe: ``h = x +
    attn(ln1(x), mask, cache)`` then ``ln2(h)``, an ``nn.LayerNorm``; the rewrite
    runs ``y, h = add_layer_norm(x, r, ln2.weight, ln2.bias, ln2.eps)`` (weight
    and bias where the norm has them, as nn.LayerNorm passes them) and returns
    ``h + mlp(y)``. ``parallel``: the block has ``use_parallel_residual``
    (gpt_neox, stablelm), and where it is true the original runs (its norms
    read x: no add feeds a norm). ``defaults``: mask and cache default to
    None, as in the original's signature (stablelm's has no defaults).
    ``keywords``: the original passes mask= and cache= by name (phimoe), and
    so does the rewrite."""

    def make(mod: Any, original: Callable, state: _Installed, cls: type) -> Callable:
        def fused(self, x, mask, cache):
            if type(self) is not cls:
                why: Optional[str] = "block subclass"
            elif parallel and self.use_parallel_residual:  # (then there is no ln2)
                why = "parallel residual"
            else:
                norm = getattr(self, ln2)
                why = _why_not(self, cls, norm, nn.LayerNorm, _nn_layer_norm_call)
            if why is not None:
                _fallback(why)
                return original(self, x, mask, cache)
            _counts["fused"] += 1
            if keywords:
                r = getattr(self, attn)(getattr(self, ln1)(x), mask=mask, cache=cache)
            else:
                r = getattr(self, attn)(getattr(self, ln1)(x), mask, cache)
            # weight and bias where the norm has them, as nn.LayerNorm passes them
            y, h = _ext.add_layer_norm(x, r, norm.get("weight"), norm.get("bias"), norm.eps)
            return h + getattr(self, mlp)(y)

        if defaults:

            def __call__(self, x, mask=None, cache=None):
                if not state.active or _few_rows(x):
                    return original(self, x, mask, cache)
                return fused(self, x, mask, cache)

        else:

            def __call__(self, x, mask, cache):  # type: ignore[misc]
                if not state.active or _few_rows(x):
                    return original(self, x, mask, cache)
                return fused(self, x, mask, cache)

        return __call__

    return make


def _norm_call(mod: Any) -> Optional[Callable]:
    """The ``RMSNorm.__call__`` a Gemma module must hold for its blocks to
    fuse: our replacement. Where it was not installed (a wrapper was found
    there), None: the blocks run their original code."""
    rec = _installed.get((mod.__name__, "RMSNorm", "__call__"))
    return rec.replacement if rec is not None else None


def _pre_norm(module: str, cls: str = "TransformerBlock") -> list[Swap]:
    return [Swap(f"mlx_lm.models.{module}", cls, "__call__", _pre_norm_block, PRE_NORM_BLOCK)]


def _gemma(module: str, block: Callable, sources: frozenset, helpers: tuple = ()) -> list[Swap]:
    return [
        Swap(f"mlx_lm.models.{module}", "RMSNorm", "__call__", _gemma_norm, GEMMA_NORM),
        Swap(f"mlx_lm.models.{module}", "TransformerBlock", "__call__", block, sources, helpers),
    ]


def _layer(module: str, make: Callable, sources: frozenset, cls: str = "TransformerBlock") -> list[Swap]:
    return [Swap(f"mlx_lm.models.{module}", cls, "__call__", make, sources, norm="layer")]


_GPT2 = _layer_norm_block("attn", "ln_1", "ln_2")
_LLAMA_NAMES = ("self_attn", "input_layernorm", "post_attention_layernorm")

# model_type -> what to swap. mlx-lm maps "mistral" onto llama.py
# (MODEL_REMAPPING), so llama's entry serves it. Not here (their blocks are not
# this add-then-norm with nn.LayerNorm): phi, phixtral, cohere, cohere2, gptj
# (parallel attention and MLP), nemotron (LayerNorm1P, a subclass with its own
# __call__); olmo and dbrx (an add feeds a LayerNorm, in other block shapes)
# are not written yet; phi3small's
# block is starcoder2's text, but its forward crashes MLX 0.32.4's CPU build,
# so it is left out untested.
ARCHITECTURES: dict[str, list[Swap]] = {
    "llama": _pre_norm("llama"),
    "mistral": _pre_norm("llama"),
    "qwen2": _pre_norm("qwen2"),
    "qwen3": _pre_norm("qwen3"),
    "qwen3_moe": _pre_norm("qwen3_moe", "Qwen3MoeDecoderLayer"),
    "gemma": _gemma("gemma", _gemma_block, PRE_NORM_BLOCK),
    "gemma2": _gemma("gemma2", _gemma2_block, GEMMA2_BLOCK),
    "gemma3_text": _gemma("gemma3_text", _gemma2_block, GEMMA3_BLOCK, (("clip_residual", CLIP_RESIDUAL),)),
    "gpt2": _layer("gpt2", _GPT2, GPT2_BLOCK),
    "gpt_bigcode": _layer("gpt_bigcode", _GPT2, GPT2_BLOCK),
    "starcoder2": _layer("starcoder2", _layer_norm_block(*_LLAMA_NAMES), PRE_NORM_BLOCK),
    "gpt_neox": _layer("gpt_neox", _layer_norm_block("attention", *_LLAMA_NAMES[1:], parallel=True),
                       GPT_NEOX_BLOCK),
    "stablelm": _layer("stablelm", _layer_norm_block(*_LLAMA_NAMES, parallel=True, defaults=False),
                       STABLELM_BLOCK, "DecoderLayer"),
    "phimoe": _layer("phimoe", _layer_norm_block(*_LLAMA_NAMES, mlp="block_sparse_moe", keywords=True),
                     PHIMOE_BLOCK, "PhiMoEDecoderLayer"),
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
    """Whether any mlx-lm class currently runs a rewrite."""
    return any(rec.active for rec in _installed.values())


def skipped() -> dict[tuple[str, str, str], str]:
    """Entries that ``apply()`` left alone, and why."""
    return dict(_skipped)


def _own_code(fn: Any, module: str, qualname: str, sources: frozenset) -> Optional[str]:
    """Why ``fn`` is not the library's own function the entry was written
    for (None: it is)."""
    if getattr(fn, "__module__", None) != module or getattr(fn, "__qualname__", None) != qualname:
        return "wrapped before patch()"
    if fingerprint(fn) not in sources:
        return "changed block (another mlx-lm version)"
    return None


def _warn(what: str, why: str) -> None:
    warnings.warn(
        f"mlx_rmsnorm: patch(fuse=True) leaves {what} as it is ({why}); it runs its own code, "
        "unfused (the rest of the plugin is on).",
        RuntimeWarning,
        stacklevel=6,  # the caller of patch() / patched()
    )


def _mlx_norm_call(cls: type, sources: frozenset) -> Optional[Callable]:
    """``cls.__call__`` where it is MLX's own (the entries of that norm fuse
    only then), else None, with a warning."""
    call = cls.__dict__.get("__call__")
    why = _own_code(call, cls.__module__, f"{cls.__name__}.__call__", sources)
    if why is not None:
        _warn(f"mlx.nn.{cls.__name__}", why)
        return None
    return call


def apply() -> None:
    """Install (or reactivate) every entry's replacement (idempotent). The
    entries of a norm whose ``mlx.nn`` ``__call__`` is not MLX's own (``norm``:
    RMSNorm, or LayerNorm for the LayerNorm blocks) are left alone, with a
    warning."""
    global _nn_rms_norm_call, _nn_layer_norm_call
    with _lock:
        if _nn_rms_norm_call is None:
            _nn_rms_norm_call = _mlx_norm_call(nn.RMSNorm, NN_RMS_NORM)
        if _nn_layer_norm_call is None:
            _nn_layer_norm_call = _mlx_norm_call(nn.LayerNorm, NN_LAYER_NORM)
        norm_ok = {"rms": _nn_rms_norm_call is not None, "layer": _nn_layer_norm_call is not None}
        for swaps in ARCHITECTURES.values():
            for sw in swaps:
                if sw.key in _installed:
                    _installed[sw.key].active = True  # shared entry, or reactivated
                    continue
                if sw.key in _skipped or not norm_ok[sw.norm]:
                    continue
                mod = _import(sw.module)
                cls = getattr(mod, sw.cls, None) if mod is not None else None
                if cls is None:
                    continue
                original = cls.__dict__.get(sw.attr)
                why = _own_code(original, sw.module, f"{sw.cls}.{sw.attr}", sw.sources)
                for name, sources in sw.helpers:
                    if why is None and fingerprint(getattr(mod, name, None)) not in sources:
                        why = f"changed {name} (another mlx-lm version)"
                if why is not None:
                    _skipped[sw.key] = why
                    _warn(f"{sw.module}.{sw.cls}", why)
                    continue
                rec = _Installed(original)
                replacement = sw.make(mod, original, rec, cls)
                replacement.__wrapped__ = original  # type: ignore[attr-defined]
                replacement._mlx_rmsnorm_fused = True  # type: ignore[attr-defined]
                rec.replacement = replacement
                _installed[sw.key] = rec
                setattr(cls, sw.attr, replacement)


def remove() -> None:
    """Undo :func:`apply`: the original goes back where the class still holds
    our replacement; a replacement that something wrapped since stays,
    inert. Nothing else is touched (idempotent)."""
    with _lock:
        for (module, cls_name, attr), rec in list(_installed.items()):
            mod = _import(module)
            cls = getattr(mod, cls_name, None) if mod is not None else None
            if cls is not None and cls.__dict__.get(attr) is rec.replacement:
                setattr(cls, attr, rec.original)
                del _installed[(module, cls_name, attr)]
            else:
                rec.active = False
        _skipped.clear()  # the next apply() looks again
