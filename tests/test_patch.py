"""patch() reroutes mx.fast.rms_norm (and nn.RMSNorm) and unpatch() restores it."""

import mlx.core as mx
import mlx.nn as nn
from conftest import graph_text
from mlx.utils import tree_flatten

import mlx_rmsnorm


def test_patch_routes_nn_rmsnorm_and_unpatch_restores():
    builtin = mx.fast.rms_norm
    layer = nn.RMSNorm(32)
    x = mx.ones((2, 32))
    assert "RMSNormPlugin" not in graph_text(layer(x))
    try:
        mlx_rmsnorm.patch()
        mlx_rmsnorm.patch()  # idempotent
        assert mlx_rmsnorm.is_patched()
        assert "RMSNormPlugin" in graph_text(layer(x))
        # and the backward of a model built on nn.RMSNorm runs our VJP
        grads = mx.grad(lambda x: layer(x).sum())(x)
        assert "RMSNormPluginVJP" in graph_text(grads)
    finally:
        mlx_rmsnorm.unpatch()
    mlx_rmsnorm.unpatch()  # idempotent
    assert mx.fast.rms_norm is builtin and not mlx_rmsnorm.is_patched()
    assert "RMSNormPlugin" not in graph_text(layer(x))


def test_context_manager_restores_previous_state():
    with mlx_rmsnorm.patched():
        assert mlx_rmsnorm.is_patched()
    assert not mlx_rmsnorm.is_patched()
    mlx_rmsnorm.patch()
    try:
        with mlx_rmsnorm.patched():
            pass
        assert mlx_rmsnorm.is_patched()  # it was patched before: stays so
    finally:
        mlx_rmsnorm.unpatch()


def test_patched_model_matches_builtin():
    model = nn.Sequential(nn.Linear(16, 32), nn.RMSNorm(32), nn.Linear(32, 4))
    mx.eval(model.parameters())
    x = mx.random.normal((8, 16), key=mx.random.key(0))

    def loss(m, x):
        return (m(x) ** 2).mean()

    ref_loss, ref_grads = nn.value_and_grad(model, loss)(model, x)
    with mlx_rmsnorm.patched():
        our_loss, our_grads = nn.value_and_grad(model, loss)(model, x)
    assert abs(our_loss.item() - ref_loss.item()) <= 1e-5 * abs(ref_loss.item())
    ours, theirs = dict(tree_flatten(our_grads)), dict(tree_flatten(ref_grads))
    assert ours.keys() == theirs.keys() and len(ours) == 5
    for k in ours:
        assert mx.allclose(ours[k], theirs[k], rtol=1e-4, atol=1e-6).item(), k
