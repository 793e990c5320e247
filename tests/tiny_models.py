"""Tiny, randomly initialised mlx-lm models of the architectures that
``patch(fuse=True)`` rewrites (shared by the fuse tests)."""

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import gemma, gemma2, gemma3_text, llama, qwen3, qwen3_moe

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
}


def make(name, dtype=mx.float32):
    module, config = CONFIGS[name]
    mx.random.seed(0)
    model = module.Model(module.ModelArgs(**config))
    # Random norm weights (Gemma-style small offsets for Gemma): a norm
    # initialised to ones would hide a wrong scale.
    params = dict(tree_flatten(model.parameters()))
    key = mx.random.key(5)
    for i, (k, v) in enumerate(sorted(params.items())):
        if "norm" in k:
            params[k] = 0.1 * mx.random.normal(v.shape, key=mx.random.split(key, 200)[i]) + (
                0.0 if name.startswith("gemma") else 1.0)
    model.load_weights(list(params.items()))
    if dtype != mx.float32:
        model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def tokens():
    t = mx.random.randint(0, VOCAB, (3, 17), key=mx.random.key(1))
    return t[:, :-1], t[:, 1:]


