"""A model library we did not write: tiny, randomly initialised mlx-lm models
(Llama; Qwen3, which adds QK-norm) train the same with patch() as without,
and the patched graph really runs the plugin. Skipped without mlx-lm."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from conftest import graph_text, train_steps

import mlx_rmsnorm

mlx_lm_models = pytest.importorskip("mlx_lm.models")
from mlx_lm.models import llama, qwen3  # noqa: E402

VOCAB = 97
CONFIGS = {
    # name: (module, config dict as in a checkpoint's config.json, norms per model)
    "llama": (llama, dict(model_type="llama", hidden_size=64, num_hidden_layers=2,
                          intermediate_size=128, num_attention_heads=4,
                          num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=VOCAB), 5),
    "qwen3": (qwen3, dict(model_type="qwen3", hidden_size=64, num_hidden_layers=2,
                          intermediate_size=128, num_attention_heads=4,
                          num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=VOCAB,
                          max_position_embeddings=128, head_dim=16,
                          tie_word_embeddings=True, rope_theta=10000.0), 9),
}


def plugin_calls(out: mx.array) -> tuple[int, int]:
    """(backward nodes, all nodes) of the plugin in the graph of `out`."""
    text = graph_text(out)
    return text.count("RMSNormPluginVJP"), text.count("RMSNormPlugin")


def train(name, steps=5):
    module, config, _ = CONFIGS[name]
    mx.random.seed(0)
    model = module.Model(module.ModelArgs(**config))
    tokens = mx.random.randint(0, VOCAB, (4, 33), key=mx.random.key(1))
    x, y = tokens[:, :-1], tokens[:, 1:]

    def loss_fn(m, x, y):
        return nn.losses.cross_entropy(m(x), y).mean()

    losses = train_steps(model, loss_fn, x, y, steps)
    return losses, model, (x, y), loss_fn


@pytest.mark.parametrize("name", list(CONFIGS))
def test_patched_mlx_lm_model_trains_like_builtin(name):
    ref, _, _, _ = train(name)
    with mlx_rmsnorm.patched():
        ours, model, (x, y), loss_fn = train(name)
        # the forward and the backward of every RMSNorm in the model are ours
        _, grads = nn.value_and_grad(model, loss_fn)(model, x, y)
        n_vjp, n_all = plugin_calls(grads["model"]["embed_tokens"]["weight"])
        assert n_all - n_vjp >= CONFIGS[name][2] and n_vjp >= CONFIGS[name][2]
    assert ours[-1] < ours[0]  # it learns
    for a, b in zip(ref, ours):
        assert abs(a - b) <= 1e-4 * abs(a), (ref, ours)
