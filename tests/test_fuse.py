"""patch(fuse=True) on tiny, randomly initialised mlx-lm models: the same
logits and training losses (within rounding) as unpatched, the fused
primitive in the graphs, unpatch() restoring every class, and architectures
without an entry running as under patch(). Skipped without mlx-lm."""

import os
import subprocess
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import graph_text, train_steps
from mlx.utils import tree_flatten

import mlx_rmsnorm
from mlx_rmsnorm import _fuse
from mlx_rmsnorm._autopatch import primitive_counts

pytest.importorskip("mlx_lm.models")
from lab.tiny import (CONFIGS, LAYER_NORM, PARALLEL, VOCAB, fused_node, loss_and_grads,  # noqa: E402
                      loss_fn, make, patched_and_fused, tokens)

def train(name, steps=4):
    model = make(name)
    x, y = tokens()
    losses = train_steps(model, loss_fn, x, y, steps)
    # an unevaluated gradient graph, to look into
    _, grads = nn.value_and_grad(model, loss_fn)(model, x, y)
    return losses, grads


@pytest.fixture(autouse=True)
def _restore():
    _fuse.reset_counts()
    yield
    mlx_rmsnorm.unpatch()


def test_fused_architectures_lists_the_entries():
    assert mlx_rmsnorm.fused_architectures() == sorted(
        ["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
         "gpt2", "gpt_bigcode", "starcoder2", "gpt_neox", "stablelm", "phimoe"])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_same_logits_and_graph_holds_the_fused_primitive(name):
    model = make(name)
    x, _ = tokens()
    want = model(x)
    mx.eval(want)
    mlx_rmsnorm.patch(fuse=True)
    got = model(x)
    # the add that feeds a norm inside each block (the add that feeds the next
    # block's input norm belongs to the model's loop, which is left alone)
    layers = len(model.layers)
    nodes = primitive_counts(got)
    other = "AddRMSNormPlugin" if name in LAYER_NORM else "AddLayerNormPlugin"
    assert nodes[fused_node(name)] == layers and nodes[other] == 0, nodes
    assert _fuse.counts() == {"fused": layers}
    mlx_rmsnorm.unpatch()
    again = model(x)
    assert "AddRMSNormPlugin" not in graph_text(again) and "AddLayerNormPlugin" not in graph_text(again)
    scale = float(mx.abs(want).max())
    assert float(mx.abs(got - want).max()) <= 2e-5 * scale
    assert mx.array_equal(again, want)


@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma3_text", "gemma2", "gpt2", "gpt_neox", "stablelm"])
def test_trains_like_unpatched(name):
    ref, _ = train(name)
    with mlx_rmsnorm.patched(fuse=True):
        ours, grads = train(name)
        (emb,) = [v for k, v in tree_flatten(grads) if k.endswith(("embed_tokens.weight", "wte.weight",
                                                                      "embed_in.weight"))]
        text = graph_text(emb)
    assert fused_node(name) + "VJP" in text
    assert ours[-1] < ours[0]
    for a, b in zip(ref, ours):
        assert abs(a - b) <= 1e-4 * abs(a), (ref, ours)
    assert not mlx_rmsnorm.is_fused()


@pytest.mark.parametrize("name", sorted(LAYER_NORM))
def test_layer_norm_blocks_same_gradients(name):
    # every parameter's gradient, the norms' weights and biases among them
    model = make(name)
    x, y = tokens()
    want_loss, want = loss_and_grads(model, x, y)
    with mlx_rmsnorm.patched(fuse=True):
        got_loss, got = loss_and_grads(model, x, y)
    assert _fuse.counts()["fused"] == len(model.layers)
    assert abs(got_loss.item() - want_loss.item()) <= 1e-5 * abs(want_loss.item())
    assert set(got) == set(want)
    assert any(".bias" in k and ("ln_2" in k or "post_attention_layernorm" in k) for k in want)
    for k in want:
        scale = float(mx.abs(want[k]).max())
        assert float(mx.abs(got[k] - want[k]).max()) <= 1e-4 * scale + 1e-7, k


@pytest.mark.parametrize("name", sorted(PARALLEL))
def test_parallel_residual_runs_the_original(name):
    model = make(name)
    x, _ = tokens()
    want, got = patched_and_fused(model, x)
    assert "AddLayerNormPlugin" not in graph_text(got)
    assert mx.array_equal(got, want)  # the same code as under patch()
    assert _fuse.counts() == {"fallback:parallel residual": len(model.layers)}


def test_parallel_residual_is_decided_per_call():
    # gpt_neox's block reads use_parallel_residual at each call: one layer
    # switched to the parallel branch runs it, the other still fuses
    model = make("gpt_neox")
    model.layers[0].use_parallel_residual = True
    x, _ = tokens()
    want = model(x)
    mx.eval(want)
    with mlx_rmsnorm.patched(fuse=True):
        got = model(x)
        assert primitive_counts(got)["AddLayerNormPlugin"] == 1
    assert _fuse.counts() == {"fused": 1, "fallback:parallel residual": 1}
    assert float(mx.abs(got - want).max()) <= 2e-5 * float(mx.abs(want).max())


@pytest.mark.parametrize("kind", ["no bias", "no affine"])
def test_layer_norm_without_weight_or_bias_fuses(kind):
    # nn.LayerNorm(bias=False) / (affine=False): the fused op gets the
    # parameters the norm has, as nn.LayerNorm passes them
    model = make("gpt2")
    for layer in model.layers:
        old = layer.ln_2
        new = nn.LayerNorm(old.dims, eps=old.eps, bias=False, affine=kind == "no bias")
        if kind == "no bias":
            new.weight = old.weight
        layer.ln_2 = new
    x, y = tokens()
    want_loss, want = loss_and_grads(model, x, y)
    want_logits = model(x)
    mx.eval(want_logits)
    with mlx_rmsnorm.patched(fuse=True):
        got_logits = model(x)
        assert primitive_counts(got_logits)["AddLayerNormPlugin"] == 2
        got_loss, got = loss_and_grads(model, x, y)
    assert float(mx.abs(got_logits - want_logits).max()) <= 2e-5 * float(mx.abs(want_logits).max())
    assert set(got) == set(want)
    for k in want:
        assert float(mx.abs(got[k] - want[k]).max()) <= 1e-4 * float(mx.abs(want[k]).max()) + 1e-7, k


def test_bfloat16_model_logits_within_rounding():
    # bf16 activations: the plugin's norms and the fused add differ from the
    # built-in path by roundings only. (Gemma's 1 + w is formed as mlx-lm
    # forms it, in bf16, fused or not: no longer in fp32 under fuse.)
    model = make("gemma3_text", mx.bfloat16)
    x, _ = tokens()
    want = model(x).astype(mx.float32)
    with mlx_rmsnorm.patched(fuse=True):
        got = model(x).astype(mx.float32)
    rel = float(mx.abs(got - want).max() / mx.abs(want).max())
    assert rel <= 5e-2, rel


def test_unpatch_restores_every_class():
    swapped = {spec.key for spec in _fuse.ARCHITECTURES.values()}
    import importlib

    before = {k: importlib.import_module(k[0]).__dict__[k[1]].__dict__[k[2]] for k in swapped}
    mlx_rmsnorm.patch(fuse=True)
    assert mlx_rmsnorm.is_fused() and mlx_rmsnorm.is_patched()
    for k, orig in before.items():
        assert importlib.import_module(k[0]).__dict__[k[1]].__dict__[k[2]] is not orig
    mlx_rmsnorm.patch()  # without fuse: the rewrite stays
    assert mlx_rmsnorm.is_fused()
    mlx_rmsnorm.unpatch()
    assert not mlx_rmsnorm.is_fused() and not mlx_rmsnorm.is_patched()
    for k, orig in before.items():
        assert importlib.import_module(k[0]).__dict__[k[1]].__dict__[k[2]] is orig


def test_patched_blocks_nest():
    with mlx_rmsnorm.patched():
        assert not mlx_rmsnorm.is_fused()
        with mlx_rmsnorm.patched(fuse=True):
            assert mlx_rmsnorm.is_fused()
        assert not mlx_rmsnorm.is_fused() and mlx_rmsnorm.is_patched()
    assert not mlx_rmsnorm.is_patched()


def test_unsupported_architecture_runs_as_under_patch():
    from mlx_lm.models import phi3

    args = phi3.ModelArgs(model_type="phi3", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                          num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                          vocab_size=VOCAB)
    mx.random.seed(0)
    model = phi3.Model(args)
    x, _ = tokens()
    want, got = patched_and_fused(model, x)
    assert "AddRMSNormPlugin" not in graph_text(got)
    assert "RMSNormPlugin" in graph_text(got)
    assert mx.array_equal(got, want)


def test_environment_and_cli_fuse(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import mlx_rmsnorm; print('FUSED', mlx_rmsnorm.is_fused(), mlx_rmsnorm.is_patched())\n")
    env = dict(os.environ, MLX_RMSNORM_PATCH="fuse")
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert "FUSED True True" in out.stdout, out.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_RMSNORM")}
    out = subprocess.run([sys.executable, "-m", "mlx_rmsnorm", "--fuse", str(script)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert "FUSED True True" in out.stdout, out.stderr
    env["MLX_RMSNORM_PATCH"] = "1"
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert "FUSED False True" in out.stdout, out.stderr


def test_checkpoints_are_unchanged(tmp_path):
    model = make("gemma3_text")
    names = sorted(k for k, _ in tree_flatten(model.parameters()))
    mlx_rmsnorm.patch(fuse=True)
    assert sorted(k for k, _ in tree_flatten(model.parameters())) == names
    path = str(tmp_path / "w.safetensors")
    model.save_weights(path)
    fresh = make("gemma3_text")
    fresh.load_weights(path)
    x, _ = tokens()
    assert mx.array_equal(fresh(x), model(x))
    assert np.isfinite(np.array(model(x))).all()


@pytest.mark.parametrize("name", ["llama", "gemma3_text", "gpt2", "stablelm"])
def test_decode_with_kv_cache_matches(name):
    from mlx_lm.models.cache import make_prompt_cache

    model = make(name)
    x, _ = tokens()

    def generate():
        cache = make_prompt_cache(model)
        logits = model(x[:1], cache=cache)
        out = [logits[:, -1]]
        for _ in range(4):
            y = mx.argmax(logits[:, -1], axis=-1)
            logits = model(y[:, None], cache=cache)
            out.append(logits[:, -1])
        return mx.stack(out)

    want = generate()
    with mlx_rmsnorm.patched(fuse=True):
        got = generate()
    assert float(mx.abs(got - want).max()) <= 2e-5 * float(mx.abs(want).max())


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_train_step_has_the_fuse_contender(tmp_path):
    out = tmp_path / "train.json"
    script = os.path.join(ROOT, "examples", "bench_train_step.py")
    proc = subprocess.run([sys.executable, script, "--quick", "--model", "qwen3-0.6b", "--norms", "trained",
                           "--decode", "3", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "plugin / fuse" in proc.stdout
    import json

    decode, train = json.loads(out.read_text())["results"]
    assert set(decode["ms_per_token"]) == {"mx.fast", "mlx_rmsnorm", "fuse"}
    assert len(train["round_ms"]["fuse"]) == 2 and len(train["fuse_vs_plugin"]) == 2
    fwd, bwd = train["plugin_nodes"]["fuse"]
    assert fwd >= 9 and bwd >= 9  # every norm, 2 of them fused (one a layer, 2 layers)


def test_bench_fused_quick(tmp_path):
    from mlx_rmsnorm import bench

    assert bench.main(["--fused", "--quick", "--out", str(tmp_path)]) == 0
    import csv

    with open(tmp_path / "bench_bfloat16_fused.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["direction"], r["impl"]) for r in rows} == {
        (d, i) for d in ("fwd", "bwd") for i in bench.FUSED_IMPLS}
    assert all(float(r["us"]) > 0 and float(r["ceiling_us"]) > 0 for r in rows)
