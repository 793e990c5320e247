"""Tiny, randomly initialised mlx-lm models of the architectures that
``patch(fuse=True)`` rewrites (the fuse tests' models). Their configs are the
sweep's (lab.sweep.configs.small_config: GENERIC, then the module's OVERRIDES
row), with FUSE_ROWS on top where the fuse tests need a block the sweep's
filling does not give: one table of tiny configs for the lab and the tests."""

from __future__ import annotations

import importlib

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

import mlx_rmsnorm

from .sweep.configs import GENERIC, small_config

VOCAB = GENERIC["vocab_size"]
# The architectures whose blocks patch(fuse=True) rewrites.
FUSED = ["llama", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
         # LayerNorm blocks (fused into add_layer_norm)
         "gpt2", "gpt_bigcode", "starcoder2", "gpt_neox", "stablelm", "phimoe"]
# On top of the sweep's config: with gpt_neox's default parallel residual
# (mlx-lm's ModelArgs, True) no add feeds a norm and the block would not fuse.
FUSE_ROWS = {"gpt_neox": {"use_parallel_residual": False}}
CONFIGS = {name: (importlib.import_module(f"mlx_lm.models.{name}"),
                  dict(small_config(name), **FUSE_ROWS.get(name, {})))
           for name in FUSED}
# The same with use_parallel_residual=True: no add feeds a norm, the original
# block runs (fallback "parallel residual"); not in CONFIGS.
PARALLEL = {
    "gpt_neox_parallel": (CONFIGS["gpt_neox"][0], dict(CONFIGS["gpt_neox"][1], use_parallel_residual=True)),
    "stablelm_parallel": (CONFIGS["stablelm"][0], dict(CONFIGS["stablelm"][1], use_parallel_residual=True)),
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
    model = module.Model(module.ModelArgs.from_dict(config))
    # Random norm weights (Gemma-style small offsets for Gemma): a norm
    # initialised to ones would hide a wrong scale.
    params = dict(tree_flatten(model.parameters()))
    key = mx.random.key(5)
    keys = mx.random.split(key, max(200, len(params)))
    for i, (k, v) in enumerate(sorted(params.items())):
        if "norm" in k or "ln_" in k:  # LayerNorm biases too: random around 0
            params[k] = 0.1 * mx.random.normal(v.shape, key=keys[i]) + (
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


def peak_mib(model, x, y) -> float:
    """The peak memory of a loss-and-gradients step, MiB above what was held
    before it; a first step untimed: allocations made once (kernel
    compilation, workspaces, graph caches) would count in the peak of the
    first."""
    loss_and_grads(model, x, y)
    mx.clear_cache()
    mx.reset_peak_memory()
    held = mx.get_active_memory()
    loss_and_grads(model, x, y)
    return (mx.get_peak_memory() - held) / 2**20
