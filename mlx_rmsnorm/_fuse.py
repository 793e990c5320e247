"""``patch(fuse=True)``: mlx-lm decoder blocks rewritten so that the residual
add that feeds a norm inside the block runs as :func:`mlx_rmsnorm.add_rms_norm`
(:func:`mlx_rmsnorm.add_layer_norm` for the LayerNorm blocks).

The rule: a rewrite computes what the code it replaces computes, as that
code would compute it now (to rounding), or it runs that code.

* **One body, one maker.** Every entry's block is ``r = attn(input_norm(x));
  h = x + r; r = mlp(norm(h)); return h + r`` (llama.py, qwen3.py, gpt2.py,
  ...), with other names and a few variations, which the entry's
  :class:`Block` spec names: the attribute names, the op (``rms`` or
  ``layer``), Gemma's ``1.0 + weight``, post-norms around attention and MLP
  (gemma2, gemma3_text), a parallel residual chosen per layer (gpt_neox,
  stablelm), keyword arguments (phimoe), a signature without defaults
  (stablelm), the module functions the block calls (gemma3_text's
  ``clip_residual``). :func:`_make` builds every rewrite from its spec; the
  rewrite runs ``y, h = add_rms_norm(x, r, norm.weight, norm.eps)`` in place
  of the add and the norm, inside that one call: no state outlives the
  call, so code between two blocks (an in-place ``h += v``, a hook that
  reads or replaces ``h``) sees and changes exactly what it does unfused.
  The add that feeds the *next* block's input norm is left to the model's
  loop.
* **Gemma's ``1 + w`` as mlx-lm forms it.** Gemma's norm scales by
  ``1.0 + self.weight`` rounded to the weight's dtype; the rewrite passes
  that very sum (offset 0), so a fused Gemma block differs from ``patch()``
  by nothing but the fusion. The fp32 ``1 + w`` is there for those who ask:
  ``rms_norm(..., offset=1.0)`` / ``add_rms_norm(..., offset=1.0)``.
* **Only mlx-lm's own code.** When an entry is installed, its class
  attribute must be mlx-lm's own function (not a wrapper installed before
  us: it is respected, and that class runs unfused) whose source is the one
  the entry was written for (a fingerprint of its text: an mlx-lm that
  changed the block runs its own block, with one warning naming the class);
  likewise the norm's ``__call__`` (mlx.nn's, or Gemma's ``RMSNorm``) and
  the helpers the block calls. At each call, the block must be exactly the
  entry's class and its norm exactly the norm class, with that class's own
  ``__call__`` (a subclass, or a replaced ``__call__``, runs the original
  block).
* **What the original would call now.** The original block's norm looks up
  ``mx.fast.rms_norm`` (``layer_norm``) at each call, and gemma3_text's block
  its module's ``clip_residual``: a rewrite fuses only while
  ``mx.fast.rms_norm`` is ``patch()``'s routed function and each helper is
  the function fingerprinted at install (identity checks); a wrapper put on
  either after ``patch(fuse=True)`` makes the block run its original code.
* **Wrappers installed after us are kept.** mlx-lm's ``grad_checkpoint``
  (and any hook) replaces ``cls.__call__`` with a wrapper of what it found,
  i.e. of the rewrite: checkpointing goes on working around the fused block.
  ``remove()`` puts the original back only where the class still holds our
  function; where something wrapped it, the rewrite stays in the chain but
  inert (it calls the original), so the wrapper survives and the values
  are the original's.
* **Where the built-in runs, the original runs.** On a CPU stream ``patch()``
  leaves MLX's own norm in place (see ``_patching``); the blocks do the same.
* **A decode step runs the original.** A block of fewer than
  :func:`min_rows` rows (tokens in the batch) runs its own code, tested
  before anything else: there the fused op saves next to no bandwidth and
  cost more than it saved.
* **Installed when mlx-lm's model modules are imported.** :func:`apply`
  installs on the entries' modules already in ``sys.modules`` and puts a
  finder on ``sys.meta_path`` that installs on the others right after they
  execute (:func:`remove` takes it off): a process that never imports
  mlx-lm's models pays nothing for ``fuse=True`` (``MLX_RMSNORM_PATCH=fuse``
  at interpreter start imported 14 model modules, transformers included: 3 s).
  :func:`is_fused` is True from :func:`apply` to :func:`remove`, installed or
  waiting for the modules; where mlx-lm is not installed, ``apply()`` warns
  once and the rewrite stays off.

Every decision is counted (:func:`counts`): blocks that ran fused, and
blocks that ran the original and why; ``MLX_RMSNORM_REPORT`` prints them.

The state (the row limit, the CPU switch, the counts, what is installed or
skipped) lives here and is set through functions (:func:`set_min_rows`,
:func:`set_route_cpu`, :func:`reset_counts`, :func:`apply`, :func:`remove`);
assigning it from outside is an AttributeError that names the function.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import os
import sys
import textwrap
import threading
import types
import warnings
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import mlx.core as mx
import mlx.nn as nn

from . import _ext

# --- state: assigned only by this module's functions ------------------------------

# Blocks of fewer rows (tokens in the batch) than this run their own code: a
# decode step. There the fused op saves no bandwidth worth having (a row or
# a few) and the whole token came out 2.8-4.5% slower fused than with the
# block's own code under patch(), while the rewrite with the add and the
# norm as two ops was level (H200, 2048-token prompt; docs/NOTES.md, Fused
# residual add). MLX_RMSNORM_FUSE_MIN_ROWS sets it (_autopatch, at import):
# the tests set 0 to fuse their small inputs.
DEFAULT_MIN_ROWS = 64

_lock = threading.RLock()
_counts: Counter = Counter()
_min_rows = DEFAULT_MIN_ROWS
_cpu_plugin = False  # route_cpu(True): CPU streams run the plugin (tests); see _patching
_on = False  # apply() .. remove(): the rewrite is on (installed, or waiting for its modules)
_installed: dict[tuple[str, str, str], "_Installed"] = {}
_skipped: dict[tuple[str, str, str], str] = {}  # entries not installed, and why
# "rms" / "layer": mlx.nn.RMSNorm.__call__ / LayerNorm.__call__ where MLX's own
# (None: not, warned); checked at the first install that needs it (a None
# again at the next apply()).
_norm_calls: dict[str, Optional[Callable]] = {}
_finder: Optional["_Finder"] = None  # on sys.meta_path while _on
_warned_no_mlx_lm = False

# names of the state above, and what sets each
_SETTERS = {
    "MIN_ROWS": "set_min_rows()", "_min_rows": "set_min_rows()", "_cpu_plugin": "set_route_cpu()",
    "_counts": "reset_counts()", "_on": "apply() / remove()", "_installed": "apply() / remove()",
    "_skipped": "apply() / remove()", "_norm_calls": "apply()", "_finder": "apply() / remove()",
    "_warned_no_mlx_lm": "apply()",
}


class _Module(types.ModuleType):
    """This module's type: its state is not assigned from outside (an old
    ``_fuse.MIN_ROWS = 0`` would otherwise be silently ignored)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SETTERS:
            raise AttributeError(f"mlx_rmsnorm._fuse.{name} is not assigned from outside: use "
                                 f"mlx_rmsnorm._fuse.{_SETTERS[name]}")
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Module


def set_min_rows(n: int) -> int:
    """Blocks of fewer than ``n`` rows (tokens in the batch: a decode step)
    run their own code; returns the previous limit. 0 fuses every call."""
    global _min_rows
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError(f"mlx_rmsnorm._fuse.set_min_rows: n must be an int, got {n!r} ({type(n).__name__})")
    if n < 0:
        raise ValueError(f"mlx_rmsnorm._fuse.set_min_rows: n must be >= 0, got {n}")
    with _lock:
        was, _min_rows = _min_rows, n
        return was


def min_rows() -> int:
    """The row limit (see :func:`set_min_rows`)."""
    return _min_rows


def routes_cpu() -> bool:
    """Whether the blocks fuse on a CPU stream (:func:`set_route_cpu`)."""
    return _cpu_plugin


def set_route_cpu(on: bool) -> bool:
    """Whether the blocks fuse on a CPU stream (``_patching.route_cpu`` sets
    it beside the extension's switch); returns the previous setting."""
    global _cpu_plugin
    if not isinstance(on, bool):
        raise TypeError(f"mlx_rmsnorm._fuse.set_route_cpu: on must be True or False, got {on!r}")
    with _lock:
        was, _cpu_plugin = _cpu_plugin, on
        return was


def counts() -> Counter:
    """Blocks run since the last :func:`reset_counts`: ``"fused"``, and
    ``"fallback:<reason>"`` for each block that ran its original code."""
    return Counter(_counts)


def reset_counts() -> None:
    _counts.clear()


def is_fused() -> bool:
    """Whether the rewrite is on: from :func:`apply` to :func:`remove`,
    whether the entries' modules are imported yet (installed then) or not
    (installed when they are). False where mlx-lm is not installed."""
    return _on


def skipped() -> dict[tuple[str, str, str], str]:
    """Entries that were left alone when their module was seen, and why."""
    return dict(_skipped)


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
class Block:
    """One entry: where the block class is, what its ``__call__`` must be,
    and the names and variations of the one body every rewrite runs."""

    module: str  # mlx_lm.models.<file>
    cls: str  # the block class in it
    sources: frozenset  # fingerprints of the cls.__call__ this entry was written for
    op: str = "rms"  # "rms": add_rms_norm, the norm calls mx.fast.rms_norm; "layer": add_layer_norm
    attn: str = "self_attn"
    input_norm: str = "input_layernorm"
    norm: str = "post_attention_layernorm"  # the norm the add feeds: fused with it
    mlp: str = "mlp"
    # The norm's class: None, mlx.nn's (RMSNorm or LayerNorm, by op); else a
    # class of the module (Gemma's RMSNorm), whose __call__ must have one of
    # norm_sources.
    norm_class: Optional[str] = None
    norm_sources: frozenset = frozenset()
    one_plus_w: bool = False  # the norm scales by 1.0 + weight, in the weight's dtype (Gemma)
    post_attn_norm: Optional[str] = None  # applied to attn's output before the add (gemma2, gemma3_text)
    post_mlp_norm: Optional[str] = None  # applied to the mlp's output before the last add
    parallel: bool = False  # use_parallel_residual, read per call: true runs the original (gpt_neox, stablelm)
    keywords: bool = False  # attn gets mask= and cache= by name (phimoe)
    defaults: bool = True  # mask and cache default to None in the signature (stablelm: no defaults)
    # (name, fingerprints) of module functions the block calls: checked when
    # installed, and at each call still the very function found then.
    helpers: tuple = ()
    # a helper that is the residual add outside float16 (gemma3_text's
    # clip_residual clips in float16): float16 runs the original
    clip: Optional[str] = None
    attr: str = "__call__"

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.module, self.cls, self.attr)


class _Installed:
    """A replacement put on a class: the class, the original it replaced,
    and whether it is active (an inert one, left under a wrapper by
    remove(), calls the original)."""

    def __init__(self, cls: type, original: Callable) -> None:
        self.cls = cls
        self.original = original
        self.replacement: Optional[Callable] = None
        self.active = True


def _builtin_stream() -> bool:
    """Whether patch() leaves MLX's own norm on the default stream (CPU)."""
    return not _cpu_plugin and mx.default_device() == mx.cpu


def _why_not(norm: Any, norm_cls: type, norm_call: Callable) -> Optional[str]:
    """Why this call's norm cannot run fused (None: it can)."""
    if type(norm) is not norm_cls:
        return "norm class"
    if norm_cls.__call__ is not norm_call:  # (norm_cls's own: type(norm) is norm_cls)
        return "norm __call__ replaced"
    if _builtin_stream():
        return "cpu stream (built-in)"
    return None


def _few_rows(x: mx.array) -> bool:
    """Whether ``x`` is a decode step's (fewer than min_rows() rows; counted).
    Tested first, before any attribute of the block is read: a decode token
    is host work, and this path is what ``patch()`` runs plus this test."""
    if x.size < _min_rows * x.shape[-1]:
        _counts["fallback:few rows (decode)"] += 1
        return True
    return False


# --- the one maker ------------------------------------------------------------------


def _make(spec: Block, mod: Any, rec: _Installed, norm_cls: type, norm_call: Callable,
          helpers: tuple) -> Callable:
    """The rewrite of ``rec.original`` (``spec.cls`` in ``mod``): ``r =
    attn(input_norm(x)); y, h = add_norm(x, post_attn_norm(r), norm);
    return h + post_mlp_norm(mlp(y))``, or the original where a check says
    the fused code would not compute what it computes. ``helpers``: (name,
    function) found when installed. The ops are looked up on _ext at each
    call (lab/host_cost.py swaps them for its composed variant)."""
    original, cls = rec.original, rec.cls
    rms = spec.op == "rms"
    fast = mx.fast
    routed = _ext.routed_rms_norm if rms else _ext.routed_layer_norm
    replaced = "mx.fast.rms_norm replaced" if rms else "mx.fast.layer_norm replaced"
    attn, ln1, ln2, mlp = spec.attn, spec.input_norm, spec.norm, spec.mlp
    post_attn, post_mlp, parallel, keywords = spec.post_attn_norm, spec.post_mlp_norm, spec.parallel, spec.keywords
    one_plus_w = spec.one_plus_w
    clip = f"float16 ({spec.clip})" if spec.clip else None
    float16 = mx.float16

    def fused(self, x, mask, cache):
        if type(self) is not cls:
            why: Optional[str] = "block subclass"
        elif parallel and self.use_parallel_residual:  # (then there is no add before a norm)
            why = "parallel residual"
        else:
            norm = getattr(self, ln2)
            why = _why_not(norm, norm_cls, norm_call)
            # what the original's norm calls now, and its module's helpers
            if why is None and (fast.rms_norm if rms else fast.layer_norm) is not routed:
                why = replaced
            for name, fn in helpers:
                if why is None and getattr(mod, name, None) is not fn:
                    why = name + " replaced"
            if why is None and clip is not None and x.dtype == float16:
                why = clip
        if why is not None:
            _counts["fallback:" + why] += 1
            return original(self, x, mask, cache)
        _counts["fused"] += 1
        if keywords:
            r = getattr(self, attn)(getattr(self, ln1)(x), mask=mask, cache=cache)
        else:
            r = getattr(self, attn)(getattr(self, ln1)(x), mask, cache)
        if post_attn is not None:
            r = getattr(self, post_attn)(r)
        if rms:
            # norm["weight"]: what nn.RMSNorm.__call__ reads (norm.weight goes
            # through nn.Module.__getattr__, a Python call); Gemma's norm
            # scales by 1.0 + weight, added as it adds it
            w = norm["weight"]
            y, h = _ext.add_rms_norm(x, r, 1.0 + w if one_plus_w else w, norm.eps)
        else:
            # weight and bias where the norm has them, as nn.LayerNorm passes them
            y, h = _ext.add_layer_norm(x, r, norm.get("weight"), norm.get("bias"), norm.eps)
        r = getattr(self, mlp)(y)
        if post_mlp is not None:
            r = getattr(self, post_mlp)(r)
        return h + r

    if spec.defaults:

        def __call__(self, x, mask=None, cache=None):
            if not rec.active or _few_rows(x):
                return original(self, x, mask, cache)
            return fused(self, x, mask, cache)

    else:

        def __call__(self, x, mask, cache):  # type: ignore[misc]
            if not rec.active or _few_rows(x):
                return original(self, x, mask, cache)
            return fused(self, x, mask, cache)

    return __call__


# --- the entries --------------------------------------------------------------------


def _models(name: str) -> str:
    return f"mlx_lm.models.{name}"


_LLAMA = Block(_models("llama"), "TransformerBlock", PRE_NORM_BLOCK)
_GEMMA = Block(_models("gemma"), "TransformerBlock", PRE_NORM_BLOCK, norm_class="RMSNorm",
               norm_sources=GEMMA_NORM, one_plus_w=True)
_GEMMA2 = Block(_models("gemma2"), "TransformerBlock", GEMMA2_BLOCK, norm="pre_feedforward_layernorm",
                norm_class="RMSNorm", norm_sources=GEMMA_NORM, one_plus_w=True,
                post_attn_norm="post_attention_layernorm", post_mlp_norm="post_feedforward_layernorm")
_GPT2 = Block(_models("gpt2"), "TransformerBlock", GPT2_BLOCK, op="layer", attn="attn", input_norm="ln_1",
              norm="ln_2")


def _like(base: Block, module: str, **changes: Any) -> Block:
    """``base`` for another module (and whatever else ``changes`` says)."""
    return replace(base, module=_models(module), **changes)


# model_type -> its entry: the one place that says which model types fuse.
# mlx-lm maps "mistral" onto llama.py (MODEL_REMAPPING), so llama's entry
# serves it. Not here (their blocks are not this add-then-norm): phi,
# phixtral, cohere, cohere2, gptj (parallel attention and MLP), nemotron
# (LayerNorm1P, a subclass with its own __call__); olmo and dbrx (an add
# feeds a LayerNorm, in other block shapes) are not written yet; phi3small's
# block is starcoder2's text, but its forward crashes MLX 0.32.4's CPU build,
# so it is left out untested.
ARCHITECTURES: dict[str, Block] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _like(_LLAMA, "qwen2"),
    "qwen3": _like(_LLAMA, "qwen3"),
    "qwen3_moe": _like(_LLAMA, "qwen3_moe", cls="Qwen3MoeDecoderLayer"),
    "gemma": _GEMMA,
    "gemma2": _GEMMA2,
    # gemma3_text: gemma2's block with its residual adds as clip_residual,
    # which clips in float16 (gemma2 adds plainly, and fuses in float16)
    "gemma3_text": _like(_GEMMA2, "gemma3_text", sources=GEMMA3_BLOCK,
                         helpers=(("clip_residual", CLIP_RESIDUAL),), clip="clip_residual"),
    "gpt2": _GPT2,
    "gpt_bigcode": _like(_GPT2, "gpt_bigcode"),
    "starcoder2": _like(_LLAMA, "starcoder2", op="layer"),
    "gpt_neox": _like(_LLAMA, "gpt_neox", sources=GPT_NEOX_BLOCK, op="layer", attn="attention", parallel=True),
    "stablelm": _like(_LLAMA, "stablelm", cls="DecoderLayer", sources=STABLELM_BLOCK, op="layer",
                      parallel=True, defaults=False),
    "phimoe": _like(_LLAMA, "phimoe", cls="PhiMoEDecoderLayer", sources=PHIMOE_BLOCK, op="layer",
                    mlp="block_sparse_moe", keywords=True),
}

# module -> its entries (one each today)
_BY_MODULE: dict[str, tuple[Block, ...]] = {}
for _spec in ARCHITECTURES.values():
    if _spec not in _BY_MODULE.get(_spec.module, ()):
        _BY_MODULE[_spec.module] = _BY_MODULE.get(_spec.module, ()) + (_spec,)
del _spec


def fused_architectures() -> list[str]:
    """The mlx-lm ``model_type`` values whose blocks ``patch(fuse=True)`` rewrites."""
    return sorted(ARCHITECTURES)


# --- installing ---------------------------------------------------------------------

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_CONTEXTLIB = contextlib.__file__


def _stacklevel() -> int:
    """The stack level of the first caller outside this package, the import
    system and contextlib (the caller of patch(), of patched(), or the
    import that installed an entry)."""
    f, level = sys._getframe(1), 2  # the caller of _stacklevel() is level 1
    while f.f_back is not None:
        name = f.f_back.f_code.co_filename
        if not (name.startswith(_PACKAGE) or name.startswith("<frozen") or name == _CONTEXTLIB):
            return level
        f, level = f.f_back, level + 1
    return level


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=_stacklevel())


def _leave(what: str, why: str) -> None:
    _warn(f"mlx_rmsnorm: patch(fuse=True) leaves {what} as it is ({why}); it runs its own code, "
          "unfused (the rest of the plugin is on).")


def _own_code(fn: Any, module: str, qualname: str, sources: frozenset) -> Optional[str]:
    """Why ``fn`` is not the library's own function the entry was written
    for (None: it is)."""
    if getattr(fn, "__module__", None) != module or getattr(fn, "__qualname__", None) != qualname:
        return "wrapped before patch()"
    if fingerprint(fn) not in sources:
        return "changed block (another mlx-lm version)"
    return None


def _mlx_norm_call(op: str) -> Optional[Callable]:
    """``mlx.nn.RMSNorm.__call__`` (op "rms") or ``LayerNorm.__call__``
    ("layer") where it is MLX's own (the entries of that norm fuse only
    then), else None, with one warning. Checked once (a None again at the
    next apply())."""
    if op not in _norm_calls:
        cls, sources = (nn.RMSNorm, NN_RMS_NORM) if op == "rms" else (nn.LayerNorm, NN_LAYER_NORM)
        call = cls.__dict__.get("__call__")
        why = _own_code(call, cls.__module__, f"{cls.__name__}.__call__", sources)
        if why is not None:
            _leave(f"mlx.nn.{cls.__name__}", why)
            call = None
        _norm_calls[op] = call
    return _norm_calls[op]


def _install(spec: Block, mod: Any) -> None:
    """Install ``spec``'s rewrite on its class in ``mod`` (or reactivate it;
    or leave the class alone, with a warning, where it is not the code the
    entry was written for). Under _lock."""
    key = spec.key
    rec = _installed.get(key)
    if rec is not None:
        rec.active = True  # shared entry, or reactivated
        return
    if key in _skipped:
        return
    if spec.norm_class is None:
        norm_call = _mlx_norm_call(spec.op)
        if norm_call is None:  # mlx.nn's norm is not MLX's own (warned once)
            return
        norm_cls: Any = nn.RMSNorm if spec.op == "rms" else nn.LayerNorm
    cls = getattr(mod, spec.cls, None)
    if not isinstance(cls, type):
        return
    original = cls.__dict__.get(spec.attr)
    what = f"{spec.module}.{spec.cls}"
    why = _own_code(original, spec.module, f"{spec.cls}.{spec.attr}", spec.sources)
    if why is None and spec.norm_class is not None:
        norm_cls = getattr(mod, spec.norm_class, None)
        norm_call = getattr(norm_cls, "__dict__", {}).get("__call__")
        why = _own_code(norm_call, spec.module, f"{spec.norm_class}.__call__", spec.norm_sources)
        if why is not None:
            what = f"{spec.module}.{spec.norm_class} and so {what}"
    helpers = []
    for name, sources in spec.helpers:
        fn = getattr(mod, name, None)
        if why is None and fingerprint(fn) not in sources:
            why = f"changed {name} (another mlx-lm version)"
        helpers.append((name, fn))
    if why is not None:
        _skipped[key] = why
        _leave(what, why)
        return
    rec = _Installed(cls, original)
    replacement = _make(spec, mod, rec, norm_cls, norm_call, tuple(helpers))
    replacement.__wrapped__ = original  # type: ignore[attr-defined]
    replacement._mlx_rmsnorm_fused = True  # type: ignore[attr-defined]
    rec.replacement = replacement
    _installed[key] = rec
    setattr(cls, spec.attr, replacement)


def _install_module(mod: Any) -> None:
    """Install the entries of ``mod`` (an mlx-lm model module) while the
    rewrite is on."""
    with _lock:
        if _on:
            for spec in _BY_MODULE.get(getattr(mod, "__name__", None), ()):
                _install(spec, mod)


class _Loader:
    """A model module's loader, for one execution: after the module runs,
    its entries are installed. The module keeps its own loader."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _install_module(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class _Finder:
    """On ``sys.meta_path`` while the rewrite is on: the spec of an entry's
    module being imported, found by the other finders, with a loader that
    installs the entries once the module has run."""

    def __init__(self) -> None:
        self._finding = threading.local()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in _BY_MODULE or not _on or getattr(self._finding, "name", None) == name:
            return None
        self._finding.name = name
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._finding.name = None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader)
        return spec

    def invalidate_caches(self) -> None:
        pass


def _mlx_lm_installed() -> bool:
    if sys.modules.get("mlx_lm") is not None:
        return True
    try:
        return importlib.util.find_spec("mlx_lm") is not None
    except (ImportError, ValueError):
        return False


def apply() -> None:
    """Turn the rewrite on (idempotent): install (or reactivate) the entries
    of the model modules already imported, and have the others installed
    when they are imported. The entries of a norm whose ``mlx.nn``
    ``__call__`` is not MLX's own (RMSNorm, or LayerNorm for the LayerNorm
    blocks) are left alone, with a warning. Without mlx-lm: one warning (the
    first time), and the rewrite stays off."""
    global _on, _finder, _warned_no_mlx_lm
    with _lock:
        if not _on and not _mlx_lm_installed():
            if not _warned_no_mlx_lm:
                _warned_no_mlx_lm = True
                _warn("mlx_rmsnorm: patch(fuse=True) found no mlx-lm (the mlx_lm package is not "
                      "installed): there are no decoder blocks to fuse, and only the routing of "
                      "mx.fast.rms_norm / mx.fast.layer_norm through the plugin (patch()) is on.")
            return
        _on = True
        for op in [op for op, call in _norm_calls.items() if call is None]:
            del _norm_calls[op]  # not MLX's own when last seen: looked at again
        for rec in _installed.values():
            rec.active = True
        for module in _BY_MODULE:
            mod = sys.modules.get(module)
            if mod is not None:
                _install_module(mod)
        if _finder is None:
            _finder = _Finder()
            sys.meta_path.insert(0, _finder)


def remove() -> None:
    """Undo :func:`apply`: the finder goes; the original goes back where the
    class still holds our replacement; a replacement that something wrapped
    since stays, inert. Nothing else is touched (idempotent)."""
    global _on, _finder
    with _lock:
        _on = False
        if _finder is not None:
            try:
                sys.meta_path.remove(_finder)
            except ValueError:
                pass
            _finder = None
        for key, rec in list(_installed.items()):
            if rec.cls.__dict__.get(key[2]) is rec.replacement:
                setattr(rec.cls, key[2], rec.original)
                del _installed[key]
            else:
                rec.active = False
        _skipped.clear()  # the next apply() looks again
