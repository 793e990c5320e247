"""Tiny, randomly initialised mlx-lm models of the architectures that
``patch(fuse=True)`` rewrites (shared by the fuse tests)."""

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import (gemma, gemma2, gemma3_text, gpt2, gpt_bigcode, gpt_neox, llama, phimoe, qwen3,
                            qwen3_moe, stablelm, starcoder2)

import mlx_rmsnorm

VOCAB = 97
COMMON = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=VOCAB)
CONFIGS = {
    "llama": (llama, dict(COMMON, model_type="llama", rms_norm_eps=1e-5)),
    "qwen3": (qwen3, dict(COMMON, model_type="qwen3", rms_norm_eps=1e-6, max_position_embeddings=128,
                          head_dim=16, tie_word_embeddings=True, rope_theta=10000.0)),
    "qwen3_moe": (qwen3_moe, dict(COMMON, model_type="qwen3_moe", rms_norm_eps=1e-6, head_dim=16,
                                  max_position_embeddings=128, tie_word_embeddings=False,
                                  rope_theta=10000.0, num_experts=4, num_experts_per_tok=2,
                                  decoder_sparse_step=1, mlp_only_layers=[],
                                  moe_intermediate_size=32, norm_topk_prob=True)),
    "gemma": (gemma, dict(COMMON, model_type="gemma", rms_norm_eps=1e-6, head_dim=16)),
    "gemma2": (gemma2, dict(COMMON, model_type="gemma2", rms_norm_eps=1e-6, head_dim=16)),
    "gemma3_text": (gemma3_text, dict(COMMON, model_type="gemma3_text", rms_norm_eps=1e-6,
                                      head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                                      sliding_window_pattern=2)),
    # LayerNorm blocks (fused into add_layer_norm)
    "gpt2": (gpt2, dict(model_type="gpt2", n_ctx=128, n_embd=64, n_head=4, n_layer=2, n_positions=128,
                        layer_norm_epsilon=1e-5, vocab_size=VOCAB)),
    "gpt_bigcode": (gpt_bigcode, dict(model_type="gpt_bigcode", n_embd=64, n_layer=2, n_inner=128, n_head=4,
                                      n_positions=128, layer_norm_epsilon=1e-5, vocab_size=VOCAB)),
    "starcoder2": (starcoder2, dict(COMMON, model_type="starcoder2", norm_epsilon=1e-5, rope_theta=10000.0)),
    "gpt_neox": (gpt_neox, dict(model_type="gpt_neox", max_position_embeddings=128, hidden_size=64,
                                num_attention_heads=4, num_hidden_layers=2, layer_norm_eps=1e-5,
                                vocab_size=VOCAB, rotary_emb_base=10000, rotary_pct=0.25,
                                use_parallel_residual=False)),
    "stablelm": (stablelm, dict(COMMON, model_type="stablelm", rope_theta=10000.0, use_qkv_bias=False,
                                partial_rotary_factor=0.25, layer_norm_eps=1e-5,
                                use_parallel_residual=False)),
    "phimoe": (phimoe, dict(COMMON, model_type="phimoe", max_position_embeddings=128,
                            original_max_position_embeddings=64, num_local_experts=4,
                            num_experts_per_tok=2, rope_scaling=dict(short_factor=[1.0] * 8,
                            long_factor=[1.0] * 8, short_mscale=1.0, long_mscale=1.0))),
}
# The same with use_parallel_residual=True: no add feeds a norm, the original
# block runs (fallback "parallel residual"); not in CONFIGS.
PARALLEL = {
    "gpt_neox_parallel": (gpt_neox, dict(CONFIGS["gpt_neox"][1], use_parallel_residual=True)),
    "stablelm_parallel": (stablelm, dict(CONFIGS["stablelm"][1], use_parallel_residual=True)),
}
LAYER_NORM = {"gpt2", "gpt_bigcode", "starcoder2", "gpt_neox", "stablelm", "phimoe"}
# The norm each block fuses, and the one it leaves to the model's loop
# (attribute names on the block).
NORMS = {name: ("ln_2", "ln_1") if name in ("gpt2", "gpt_bigcode") else
         ("pre_feedforward_layernorm", "input_layernorm") if name in ("gemma2", "gemma3_text") else
         ("post_attention_layernorm", "input_layernorm") for name in CONFIGS}


def fused_node(name):
    """The fused primitive a block of `name` runs."""
    return "AddLayerNormPlugin" if name in LAYER_NORM else "AddRMSNormPlugin"


def embed(model):
    """The token embedding of a tiny model (named per architecture)."""
    inner = getattr(model, "model", None) or model.transformer
    for attr in ("embed_tokens", "wte", "embed_in"):
        if attr in inner:
            return inner[attr]
    raise AttributeError("no token embedding")


def make(name, dtype=mx.float32):
    module, config = CONFIGS[name] if name in CONFIGS else PARALLEL[name]
    mx.random.seed(0)
    model = module.Model(module.ModelArgs(**config))
    # Random norm weights (Gemma-style small offsets for Gemma): a norm
    # initialised to ones would hide a wrong scale.
    params = dict(tree_flatten(model.parameters()))
    key = mx.random.key(5)
    for i, (k, v) in enumerate(sorted(params.items())):
        if "norm" in k or "ln_" in k:  # LayerNorm biases too: random around 0
            params[k] = 0.1 * mx.random.normal(v.shape, key=mx.random.split(key, 200)[i]) + (
                0.0 if name.startswith("gemma") or k.endswith(".bias") else 1.0)
    model.load_weights(list(params.items()))
    if dtype != mx.float32:
        model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def tokens():
    t = mx.random.randint(0, VOCAB, (3, 17), key=mx.random.key(1))
    return t[:, :-1], t[:, 1:]


def loss_fn(m, x, y):
    """The cross-entropy loss of next-token prediction."""
    return nn.losses.cross_entropy(m(x), y).mean()


def loss_and_grads(model, x, y):
    """loss_fn and every parameter's gradient (flattened names), evaluated."""
    loss, grads = nn.value_and_grad(model, loss_fn)(model, x, y)
    mx.eval(loss, grads)
    return loss, dict(tree_flatten(grads))


def patched_and_fused(model, x):
    """(want, got): model(x) under patch(), evaluated, and under
    patch(fuse=True), as built (the graph holds what ran)."""
    with mlx_rmsnorm.patched():
        want = model(x)
        mx.eval(want)
    with mlx_rmsnorm.patched(fuse=True):
        got = model(x)
    return want, got
