"""The tiny configs: every model module of the installed ``mlx_lm.models``
(a module with a ``ModelArgs`` dataclass and a ``Model``) built small. The
fields of ``ModelArgs`` take GENERIC's small values, then the module's
OVERRIDES row; a required field neither knows gets a small value by its
type. ``build`` makes the model in float32 with a fixed seed and perturbs
every float parameter a little (so that no two norm weights are equal and a
swapped weight shows).

One table for the lab and the tests: the sweep (lab.sweep.runner) builds
every module from it, and lab.tiny's models of the fused architectures
(the fuse tests') take their configs from ``small_config`` too.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import typing
from typing import Any, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

MAX_PARAMS = 4_000_000  # a model above this was not made small: refused before allocating
PERTURB = 0.1  # relative size of the noise added to every float parameter
SEED = 0

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


def discover() -> list[str]:
    """The module names of mlx_lm.models that may hold a model (all but helpers)."""
    import mlx_lm.models as models

    names = [m.name for m in pkgutil.iter_modules(models.__path__)]
    return sorted(n for n in names if n not in NOT_MODELS)


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
