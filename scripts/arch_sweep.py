"""Every mlx-lm architecture, built tiny, under MLX's built-in norms, under
``patch()`` and under ``patch(fuse=True)``.

For each model module of the installed ``mlx_lm.models`` (a module with a
``ModelArgs`` dataclass and a ``Model``) the sweep fills the fields of
``ModelArgs`` with small values (GENERIC, then the per-module OVERRIDES),
builds the model with a fixed seed, perturbs every float parameter a little
(so that no two norm weights are equal and a swapped weight shows), and runs,
in float32 and in bfloat16 (the float32 parameters cast):

* ``logits``: the forward of one batch without a cache;
* ``cache``: the same tokens through ``make_prompt_cache``: a prefill, then
  two one-token decode steps (the logits of all steps, concatenated);
* ``grad:<param>``: the gradients of a cross-entropy loss with respect to
  every trainable parameter (``nn.value_and_grad``).

Modes: ``builtin`` (run twice, to know whether the built-in is bitwise
reproducible), ``patch`` (``patch()``), ``fuse`` (``patch(fuse=True)``) and
``unpatched`` (the built-in again after ``unpatch()``). Verdicts:

* float32: every quantity within ``FP32_TOL`` (1e-5) relative to the built-in:
  ``max|a - b| / max|b|``, for a gradient ``max|b|`` at least
  ``FP32_GRAD_FLOOR`` (1e-2) of the model's largest gradient (a gradient that
  is zero in exact arithmetic, such as a router's behind a top-k, is rounding
  noise in both). Where that fails, the built-in in float64 (on the CPU stream)
  decides: the mode matches if it is no more than ``FP64_SLACK`` (2) times as
  far from float64 as the built-in is (the built-in is itself further than
  1e-5 from the exact value there); such quantities are listed (``*_by_fp64``).
  Where the built-in is not reproducible run to run (the gather / scatter
  backwards of MoE models on a GPU), a quantity within ``NOISE_SLACK`` (2)
  times the built-in's own run-to-run distance matches (``*_by_noise``).
  Float32 matmuls run in float32 (``MLX_ENABLE_TF32=0``, unless set): TF32
  would carry a norm's last-bit differences into 1e-4 of the next matmul;
* bfloat16: the mode as close to float32 as the built-in is. Per quantity and
  token batch, r = rms_rel(mode, fp32 built-in) / rms_rel(bf16 built-in, fp32
  built-in), normwise (``||a - b|| / ||b||``). Over ``BF16_BATCHES`` (3) token
  batches, the geometric mean of all r at most ``BF16_MEAN`` (1.25) and, per
  quantity, the geometric mean over batches at most ``BF16_MAX`` (3) (there the
  denominator is at least the median error of the built-in in that batch). One
  batch's ratios move together -- an error early in the graph reaches every
  gradient -- so one batch's mean scatters from 0.8 to 1.35 between token
  draws for a mode that computes the same thing; hence several batches and a
  line above 1. The distance of the mode to the bf16 built-in over the
  built-in's own is reported beside it (``*_vs_builtin_gmean``): it sits near
  sqrt(2) for two equally good roundings, so it makes a poor pass line.
  Quantities that the bf16 built-in gets more than ``BF16_NOISE`` (25 %) wrong
  in some batch (scalar parameters summed over every element: apertus's xIELU
  alpha / beta / eps, 20 % to 150 % off) are left out of the bf16 verdict and
  counted (``bf16_noise``); float32 still checks them. Where a mode fails
  that line, a control decides: the built-in model with its norms computed
  exactly in float32 and rounded once (``exact``, MLX ops; the built-in's
  kernel rounds twice, ``w * bf16(x * rstd)``). A top-k router turns a last-bit
  difference into another expert, so in MoE models any other rounding of the
  norms, however good, can sit 2x further from float32 than the built-in's on
  a few batches. The mode matches (``*_by_control``) when it is no further
  from float32 than that control, within ``CONTROL_SLACK`` (1.25), on both
  lines;
* ``unpatched`` equals the first built-in run bit for bit where the built-in
  is reproducible run to run; a built-in that is not, or that raises, is
  recorded as the built-in's (``builtin_note``), not as a mismatch.

On the CPU, ``patch()`` runs MLX's built-in on CPU streams unless
``mlx_rmsnorm._patching.route_cpu(True)``; the sweep turns that on (where it
exists) so that it compares the plugin and not the built-in with itself. On a
CUDA machine the default device is the GPU and everything runs there.

A model whose float32 built-in forward raises is "not built" (its config is
not one the model takes, or it does not run here), with the first line of the
exception; one whose built-in raises only in bfloat16 or only in the cache or
gradient part is built, and the note says where the built-in raises. Each
model runs in its own process (``--in-process`` to run them all in this one):
a model that crashes the interpreter is "not built", with the phase it died in.

CLI::

    python scripts/arch_sweep.py [--quick] [--models a,b] \
        [--dtypes float32,bfloat16] [--out DIR] [--in-process]

prints a markdown table, the counts (found / built / matched per mode and
dtype / fused) and what was not built and why, and writes ``arch_sweep.csv``
and ``arch_sweep.json`` to ``--out``. Exit status 1 when some built model does
not match. ``tests/test_architectures.py`` runs the quick subset
(``MLX_RMSNORM_FULL_SWEEP=1``: all of them).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib
import json
import math
import os
import pkgutil
import re
import sys
import tempfile
import time
import traceback
import typing
from typing import Any, Callable, Optional

# Float32 matmuls in float32: MLX runs them in TF32 on a GPU by default (read
# once, at the first matmul), and a norm's rounding difference then comes out
# of the next matmul up to ~1e-4 relative (H200, this sweep with TF32 on:
# olmo_hybrid and qwen3_5, whose built-ins are reproducible, 4e-5 and 6.5e-5
# in gradients), above FP32_TOL for reasons that are not the norm's. As the
# test suite's conftest does; the workers inherit it.
os.environ.setdefault("MLX_ENABLE_TF32", "0")
# The blocks fuse at every row count, the decode steps of the cache mode
# included (as shipped, fewer than 64 rows run the block's own code).
os.environ.setdefault("MLX_RMSNORM_FUSE_MIN_ROWS", "0")

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402

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
MAX_PARAMS = 4_000_000  # a model above this was not made small: refused before allocating
PERTURB = 0.1  # relative size of the noise added to every float parameter

BATCH, PROMPT, DECODE = 2, 8, 2  # tokens: BATCH x (PROMPT + DECODE)
SEED = 0

# Small values for the ModelArgs fields most models share. Every field of a
# model's ModelArgs found here is set (defaults too: many defaults are the full
# model's sizes), then the model's OVERRIDES.
GENERIC: dict[str, Any] = {
    # widths and depth
    "hidden_size": 64, "d_model": 64, "n_embd": 64, "hidden_dim": 64, "model_dim": 64, "dim": 64,
    "num_hidden_layers": 2, "n_layers": 2, "n_layer": 2, "num_layers": 2, "num_transformer_layers": 2,
    "intermediate_size": 128, "ffn_hidden_size": 128, "n_inner": 128, "ff_intermediate_size": 128,
    "intermediate_size_mlp": 128, "block_dim": 64,
    "num_attention_heads": 4, "n_heads": 4, "n_head": 4, "num_heads": 4, "num_query_heads": 4,
    "num_key_value_heads": 2, "n_kv_heads": 2, "num_kv_heads": 2, "num_attention_groups": 2,
    "head_dim": 16, "vocab_size": 128, "num_vocab": 128, "rotary_dim": 8,
    "vocab_size_per_layer_input": 128, "hidden_size_per_layer_input": 16,
    # norms and positions
    "rms_norm_eps": 1e-5, "layer_norm_epsilon": 1e-5, "layer_norm_eps": 1e-5, "norm_eps": 1e-5,
    "layernorm_epsilon": 1e-5, "rope_theta": 10000.0,
    "max_position_embeddings": 128, "n_positions": 128, "n_ctx": 128, "block_size": 128,
    "model_max_length": 128, "partial_rotary_factor": 0.5, "rotary_pct": 0.5,
    "rotary_emb_base": 10000.0, "sliding_window": 4, "sliding_window_pattern": 2,
    "qk_norm": True, "use_qk_norm": True, "full_attention_interval": 2,
    # mixture of experts: 4 experts, 2 a token; layer 0 dense where a model has dense layers
    "num_experts": 4, "n_routed_experts": 4, "num_local_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "moe_topk": 2, "moe_intermediate_size": 32,
    "expert_ffn_hidden_size": 32, "shared_expert_intermediate_size": 32,
    "shared_intermediate_size": 32, "n_shared_experts": 1, "num_shared_experts": 1,
    "num_shared_expert": 1, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 1.0, "norm_topk_prob": True, "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    # multi-head latent attention
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    # state-space and linear-attention layers
    "state_size": 8, "ssm_state_size": 8, "conv_kernel": 4, "n_groups": 1, "time_step_rank": 8,
    "use_conv_bias": True, "conv_bias": False, "conv_L_cache": 3,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
    # scalings some models multiply in (values other than 1 so that they show)
    "embedding_multiplier": 2.0, "attention_multiplier": 0.25, "residual_multiplier": 0.5,
    "logits_scaling": 2.0, "scale_emb": 2.0, "scale_depth": 1.4, "dim_model_base": 32,
    # biases off unless a model asks
    "attention_bias": False, "mlp_bias": False, "use_bias": False, "tie_word_embeddings": False,
}

# Where the generic filling does not build a model (or builds one too large),
# the fields to set for that module. One row a module; the value replaces the
# generic one.
OVERRIDES: dict[str, dict[str, Any]] = {
    "afm7": {"num_kv_reuse_layers": 1},
    "afmoe": {"layer_types": ["sliding_attention", "full_attention"], "num_dense_layers": 1},
    "apertus": {"post_norm": False},
    "baichuan_m1": {"sliding_window_layers": [0], "conv_window": 2},
    "bailing_hybrid": {"layer_group_size": 2, "group_norm_size": 1},
    "bailing_moe_linear": {"layer_group_size": 2, "group_norm_size": 1},
    "deepseek_v2": {"rope_scaling": {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64,
                                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                                     "mscale_all_dim": 1.0}},
    "dbrx": {
        "ffn_config": {"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2},
        "attn_config": {"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000.0},
    },
    "exaone4": {"sliding_window_pattern": "LG", "rope_scaling": None},
    "exaone_moe": {
        "layer_types": ["sliding_attention", "full_attention"],
        "is_moe_layer": [False, True],
    },
    "gear": {"layer_types": ["sliding_attention", "full_attention"]},
    "gemma3n": {"text_config": {
        "model_type": "gemma3n", "layer_types": ["sliding_attention", "full_attention"],
        "num_kv_shared_layers": 0, "activation_sparsity_pattern": [0.0, 0.0],
        "rope_local_base_freq": 10000.0, "final_logit_softcapping": 30.0,
        "altup_num_inputs": 2, "altup_coef_clip": 120.0, "altup_correct_scale": True,
        "altup_active_idx": 0, "laurel_rank": 8}},
    "gemma4_text": {"global_head_dim": 32, "num_kv_shared_layers": 0, "sliding_window_pattern": 2},
    "glm4_moe": {"rope_scaling": None},
    "glm_moe_dsa": {
        "index_head_dim": 16, "index_n_heads": 2, "index_topk": 4, "topk_method": "noaux_tc",
        "scoring_func": "sigmoid", "moe_layer_freq": 1,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    },
    "granitemoehybrid": {"layer_types": ["mamba", "attention"], "mamba_n_heads": 4,
                         "mamba_d_head": 16, "mamba_n_groups": 1, "mamba_d_state": 8,
                         "mamba_d_conv": 4, "mamba_expand": 2},
    "hunyuan": {"rope_scaling": {"alpha": 1000.0, "factor": 1.0, "type": "dynamic"},
                "use_mixed_mlp_moe": True, "use_cla": False, "cla_share_factor": 2},
    "jamba": {"attn_layer_offset": 1, "attn_layer_period": 2, "expert_layer_offset": 1,
              "expert_layer_period": 2, "mamba_d_conv": 4, "mamba_d_state": 8, "mamba_expand": 2},
    "kimi_k3": {"text_config": {"linear_attn_config": {
        "num_heads": 4, "head_dim": 16, "kda_layers": [1], "short_conv_kernel_size": 4},
        "num_experts_per_token": 2, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
        "v_head_dim": 16, "q_lora_rank": 32, "kv_lora_rank": 16}},
    "kimi_linear": {"linear_attn_config": {"num_heads": 4, "head_dim": 16, "kda_layers": [1],
                                           "full_attn_layers": [2], "short_conv_kernel_size": 4}},
    "lfm2": {"block_multiple_of": 16, "block_ffn_dim_multiplier": 1.0,
             "block_auto_adjust_ff_dim": False, "full_attn_idxs": [1]},
    "lfm2_moe": {"use_expert_bias": True, "num_dense_layers": 1, "full_attn_idxs": [1]},
    "llama4_text": {"no_rope_layers": [1, 0]},
    "llama4": {"text_config": {"model_type": "llama4_text", "attention_chunk_size": 4,
                               "interleave_moe_layer_step": 2, "rope_scaling": None,
                               "num_experts_per_tok": 1,
                               "num_hidden_layers": 4}},  # its loop reads cache[3]
    "longcat_flash": {"attention_method": "MLA", "zero_expert_type": "identity",
                      "zero_expert_num": 1, "mla_scale_q_lora": True, "mla_scale_kv_lora": True},
    "longcat_flash_ngram": {"zero_expert_num": 1, "mla_scale_q_lora": True,
                            "mla_scale_kv_lora": True},
    "mamba2": {"time_step_limit": (0.0, float("inf")), "num_heads": 8},
    "mellum": {"layer_types": ["sliding_attention", "full_attention"],
               "rope_parameters": {"sliding_attention": {"rope_theta": 10000.0},
                                   "full_attention": {"rope_theta": 10000.0}}},
    "mistral4": {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default",
                                     "llama_4_scaling_beta": 0.1,
                                     "original_max_position_embeddings": 64}},
    "mimo_v2_flash": {
        "hybrid_layer_pattern": [1, 0], "moe_layer_freq": [0, 1],
        "add_swa_attention_sink_bias": True, "add_full_attention_sink_bias": False,
        "sliding_window_size": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "swa_rope_theta": 10000.0, "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2,
        "swa_head_dim": 16, "swa_v_head_dim": 16,
    },
    "minicpm3": {"rope_scaling": {"original_max_position_embeddings": 64,
                                  "short_factor": 1.0, "long_factor": 1.0}},
    "minimax": {"rotary_dim": 8},
    "ministral3": {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default",
                                       "llama_4_scaling_beta": 0.1,
                                       "original_max_position_embeddings": 64}},
    "nemotron": {"hidden_act": "relu2"},
    "nemotron-nas": {"block_configs": [
        {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 1.0}},
        {"attention": {"replace_with_linear": True}, "ffn": {"ffn_mult": 1.0}}]},
    "nemotron_h": {"mamba_num_heads": 4, "mamba_head_dim": 16, "mamba_proj_bias": False,
                   "hybrid_override_pattern": "M*"},
    "olmo_hybrid": {"linear_allow_neg_eigval": False},
    "olmo3": {"layer_types": ["sliding_attention", "full_attention"]},
    "openelm": {"ffn_dim_divisor": 16, "ffn_multipliers": [1.0, 2.0],
                "num_query_heads": [4, 4], "num_kv_heads": [2, 2]},
    "plamo": {"n_shared_head": 2},
    "qwen": {"kv_channels": 16},
    "phi3small": {"dense_attention_every_n_layers": 2, "gegelu_limit": 20.0},
    "recurrent_gemma": {"conv1d_width": 4, "logits_soft_cap": 30.0, "attention_window_size": 4,
                        "block_types": ["recurrent", "attention"]},
    "rwkv7": {"a_low_rank_dim": 8, "v_low_rank_dim": 8, "gate_low_rank_dim": 8,
              "decay_low_rank_dim": 8},
    "spark2_5": {"rope_parameters": {"sliding_attention": {"rope_theta": 10000.0},
                                     "full_attention": {"rope_theta": 10000.0}}},
    "stablelm": {"use_qkv_bias": False},
    "qwen3_5": {"text_config": {"num_experts": 0}},  # dense (qwen3_5_moe is the MoE)
    "step3p5": {"moe_num_experts": 4, "moe_top_k": 2, "share_expert_dim": 32},
    # text models behind a multimodal wrapper: the text_config is GENERIC, the
    # OVERRIDES row of its model_type and these values
    "gemma3": {"text_config": {"model_type": "gemma3_text"}},
    "gemma4": {"text_config": {"model_type": "gemma4_text"}},
    "lfm2-vl": {"text_config": {"model_type": "lfm2"}},
    "mistral3": {"text_config": {"model_type": "ministral3"}},
    "muse_spark": {"text_config": {"num_shared_experts": 0,
        "post_norm_eps": 1e-5, "rope_parameters": {"rope_theta": 10000.0},
        "layer_rope_theta": [10000.0, 0], "layer_types": ["sliding_attention", "full_attention"],
        "final_logit_softcapping": 30.0, "output_multiplier": 1.0, "moe_hidden_size": 32,
        "mlp_layer_types": ["sparse", "sparse"]}},
}

# Modules of mlx_lm.models that hold no model (helpers imported by models).
NOT_MODELS = {"activations", "base", "bitlinear_layers", "cache", "gated_delta", "mla",
              "pipeline", "rope_utils", "ssm", "switch_layers"}

# The CI subset: dense pre-norm (llama, qwen3), Gemma's 1 + w norms (gemma,
# gemma2, gemma3_text), a mixture of experts (qwen3_moe) and LayerNorm (gpt2).
QUICK = ["llama", "qwen3", "gemma", "gemma2", "gemma3_text", "qwen3_moe", "gpt2"]

TEXT_ARGS = ("TextArgs", "TextConfig", "TextModelArgs")  # a wrapper's own text args class
DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16}
MODES = ("patch", "fuse")


# --- the plugin, guarded for the interfaces that are still landing -----------------


def _plugin():
    import mlx_rmsnorm

    return mlx_rmsnorm


def _fuse_module():
    try:
        from mlx_rmsnorm import _fuse

        return _fuse
    except Exception:
        return None


def fuse_counts() -> dict[str, int]:
    f = _fuse_module()
    fn = getattr(f, "counts", None) if f is not None else None
    return dict(fn()) if fn is not None else {}


def reset_fuse_counts() -> None:
    f = _fuse_module()
    fn = getattr(f, "reset_counts", None) if f is not None else None
    if fn is not None:
        fn()


def route_cpu(on: bool) -> Optional[bool]:
    """Make CPU streams run the plugin under patch() (where the switch exists);
    returns the previous value, None where there is no switch."""
    try:
        from mlx_rmsnorm import _patching
    except Exception:
        return None
    fn = getattr(_patching, "route_cpu", None)
    return fn(on) if fn is not None else None


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
    p = _plugin()
    if mode in ("builtin", "builtin2", "unpatched"):
        p.unpatch()
    elif mode == "exact":  # the bfloat16 control (judge_low_precision)
        p.unpatch()
        mx.fast.rms_norm, mx.fast.layer_norm = _exact_rms_norm, _exact_layer_norm
    elif mode == "patch":
        p.unpatch()
        p.patch()
    elif mode == "fuse":
        p.unpatch()
        p.patch(fuse=True)
    else:
        raise ValueError(mode)


# --- discovering and building ---------------------------------------------------------


def discover() -> list[str]:
    """The module names of mlx_lm.models that may hold a model (all but helpers)."""
    import mlx_lm.models as models

    names = [m.name for m in pkgutil.iter_modules(models.__path__)]
    return sorted(n for n in names if n not in NOT_MODELS)


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


def _import_model_module(name: str):
    try:
        return importlib.import_module(f"mlx_lm.models.{name}")
    except SystemExit as e:  # olmo.py exits when ai2-olmo is missing
        raise ImportError(f"import exits ({e.code}): needs a package not installed") from None


def _type_default(annotation: Any) -> Any:
    """A small value for a required field the tables do not know, by its type."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union and type(None) in typing.get_args(annotation):
        return None
    if annotation in (bool, "bool"):
        return False
    if annotation in (int, "int"):
        return 2
    if annotation in (float, "float"):
        return 1.0
    if origin in (list, typing.List) or annotation is list:
        return []
    if origin in (dict, typing.Dict) or annotation is dict:
        return {}
    raise ValueError(f"no small value for a field of type {annotation!r}")


def small_config(name: str, model_type: Optional[str] = None, args_cls: Any = None) -> dict:
    """The config dict (as in a checkpoint's config.json) of a tiny `name`."""
    mod = _import_model_module(name)
    if args_cls is None:
        args_cls = getattr(mod, "ModelArgs")
    if not dataclasses.is_dataclass(args_cls):
        raise TypeError(f"{name}.ModelArgs is not a dataclass")
    over = OVERRIDES.get(name, {})
    config: dict[str, Any] = {"model_type": model_type or name}
    for f in dataclasses.fields(args_cls):
        if f.name == "model_type":
            continue
        if f.name in over:
            continue
        if f.name in GENERIC:
            config[f.name] = GENERIC[f.name]
        elif f.name == "text_config":
            config[f.name] = _text_config(mod, {"model_type": name})
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            config[f.name] = _type_default(f.type)
    for key, value in over.items():
        if key == "text_config":
            value = _text_config(mod, {"model_type": name, **value})
        config[key] = value
    return config


def _text_config(mod: Any, inner: dict) -> dict:
    """A wrapper's small text_config: every GENERIC value (the inner args
    class's from_dict keeps the fields it has), small values for the required
    fields of the module's own text args class where it has one, the OVERRIDES
    row of the inner model_type and the wrapper's own values."""
    config = dict(GENERIC)
    for attr in TEXT_ARGS:
        cls = getattr(mod, attr, None)
        if dataclasses.is_dataclass(cls):
            for f in dataclasses.fields(cls):
                if (f.name not in GENERIC and f.default is dataclasses.MISSING
                        and f.default_factory is dataclasses.MISSING):
                    try:
                        config[f.name] = _type_default(f.type)
                    except ValueError:
                        pass  # the row must give it
            break
    row = {k: v for k, v in OVERRIDES.get(inner.get("model_type", ""), {}).items() if k != "text_config"}
    return {**config, **row, **inner}


def _jsonable(config: dict) -> dict:
    return json.loads(json.dumps(config, default=str))


def perturb(model: nn.Module, key: mx.array) -> None:
    """Adds noise of PERTURB x (the parameter's std, or 1 where it is constant)
    to every float parameter: equal norm weights (all ones) would hide a
    swapped weight."""
    flat = tree_flatten(model.parameters())
    keys = mx.random.split(key, max(len(flat), 1))
    new = []
    for (path, p), k in zip(flat, keys):
        if not mx.issubdtype(p.dtype, mx.floating) or p.size == 0:
            continue
        p32 = p.astype(mx.float32)
        std = mx.std(p32).item() if p.size > 1 else 0.0
        scale = PERTURB * (std if std > 0 else 1.0)
        new.append((path, (p32 + scale * mx.random.normal(p.shape, key=k)).astype(p.dtype)))
    model.update(tree_unflatten(new))


def build(name: str) -> tuple[nn.Module, dict]:
    """A tiny `name` model in float32, seeded, perturbed, evaluated."""
    mod = _import_model_module(name)
    if not hasattr(mod, "Model") or not hasattr(mod, "ModelArgs"):
        raise TypeError("no Model / ModelArgs")
    config = small_config(name)
    args = mod.ModelArgs.from_dict(config)
    mx.random.seed(SEED)
    model = mod.Model(args)  # MLX is lazy: nothing is allocated before the eval below
    size = n_params(model)
    if size > MAX_PARAMS:
        raise ValueError(f"too large: {size} parameters (a size field the small values miss)")
    model.set_dtype(mx.float32)
    perturb(model, mx.random.key(SEED + 1))
    mx.eval(model.parameters())
    return model, config


def n_params(model: nn.Module) -> int:
    return sum(p.size for _, p in tree_flatten(model.parameters()))


# --- running one mode ---------------------------------------------------------------------

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
    reset_fuse_counts()
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


def _valid(*xs: Any) -> bool:
    return all(x is not None and not isinstance(x, Exception) for x in xs)


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


# --- the whole sweep ------------------------------------------------------------------


def sweep_one(name: str, dtypes: list[str], progress: Callable[[str], None] = lambda s: None) -> list[dict]:
    """sweep_model in this process, with the CPU routing on, never raising."""
    was_routed = route_cpu(True)
    t0 = time.perf_counter()
    try:
        rows = sweep_model(name, dtypes, progress=progress)
    except Exception as e:  # a failure of the sweep itself: say so, go on
        where = traceback.extract_tb(e.__traceback__)[-1]
        rows = [{"model": name, "found": True, "built": False, "dtype": d,
                 "why": f"sweep error: {first_line(e)} ({os.path.basename(where.filename)}:{where.lineno})"}
                for d in dtypes]
    finally:
        _plugin().unpatch()
        if was_routed is not None:
            route_cpu(was_routed)
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
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", name, "--dtypes", ",".join(dtypes)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
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


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    ap.add_argument("--models", default="", help="comma-separated module names")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--out", default="", help="folder for arch_sweep.csv / .json")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--in-process", action="store_true",
                    help="run every model in this process (a model that crashes ends the sweep)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="models swept at once, each in its own process (default 1)")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)  # one model, rows as JSON
    a = ap.parse_args(argv)
    dtypes = [d for d in a.dtypes.split(",") if d]
    for d in dtypes:
        if d not in DTYPES:
            ap.error(f"--dtypes: {d!r} is not one of {', '.join(DTYPES)}")
    if "bfloat16" in dtypes:  # judged against the built-in's float32 run: that one first
        dtypes = ["float32"] + [d for d in dtypes if d != "float32"]
    if a.worker:
        def phase(text: str) -> None:
            print(f"phase: {text}", file=sys.stderr, flush=True)

        rows = sweep_one(a.worker, dtypes, progress=phase)
        print(WORKER_MARK + json.dumps(rows, default=_fmt), flush=True)
        return 0
    names = discover()
    if a.models:
        wanted = [m for m in a.models.split(",") if m]
        unknown = [m for m in wanted if m not in names]
        if unknown:
            ap.error(f"--models: not in mlx_lm.models: {', '.join(unknown)}")
        names = wanted
    elif a.quick:
        names = QUICK
    print(f"mlx {mx.__version__}, device {mx.default_device()}, {len(names)} modules, dtypes {dtypes}",
          file=sys.stderr)
    rows = sweep(names, dtypes, show_progress=not a.no_progress, isolate=not a.in_process, jobs=a.jobs)
    print(markdown(rows, dtypes))
    if a.out:
        write(rows, dtypes, a.out)
    bad = mismatches(rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
