"""The plugin under MLX's transforms gives what mx.fast.rms_norm gives."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import random

import mlx_rmsnorm

EPS = 1e-5


def close(a, b, tol=2e-5):
    a, b = np.array(a), np.array(b)
    scale = max(np.max(np.abs(b)), 1e-30)
    assert np.max(np.abs(a - b)) / scale <= tol, np.max(np.abs(a - b)) / scale


@pytest.fixture
def data():
    x = random((4, 6, 48), mx.float32, 30)
    w = random((48,), mx.float32, 31, 0.5, 1.0)
    g = random((4, 6, 48), mx.float32, 32)
    return x, w, g


def losses(g):
    def make(fn):
        return lambda x, w: (fn(x, w, EPS) * g).sum()

    return make(mlx_rmsnorm.rms_norm), make(mx.fast.rms_norm)


def test_grad_and_value_and_grad(device, data):
    x, w, g = data
    with mx.stream(device):
        ours, theirs = losses(g)
        for argnums in (0, 1, (0, 1)):
            a = mx.grad(ours, argnums=argnums)(x, w)
            b = mx.grad(theirs, argnums=argnums)(x, w)
            for ai, bi in zip(a if isinstance(a, tuple) else [a], b if isinstance(b, tuple) else [b]):
                close(ai, bi)
        (va, ga), (vb, gb) = (mx.value_and_grad(f)(x, w) for f in (ours, theirs))
        close(va, vb)
        close(ga, gb)


def test_vjp_and_jvp(device, data):
    x, w, g = data
    with mx.stream(device):
        _, (gx_a, gw_a) = mx.vjp(lambda x, w: mlx_rmsnorm.rms_norm(x, w, EPS), [x, w], [g])
        _, (gx_b, gw_b) = mx.vjp(lambda x, w: mx.fast.rms_norm(x, w, EPS), [x, w], [g])
        close(gx_a, gx_b)
        close(gw_a, gw_b)
        tx, tw = random(x.shape, mx.float32, 33), random(w.shape, mx.float32, 34)
        _, (ja,) = mx.jvp(lambda x, w: mlx_rmsnorm.rms_norm(x, w, EPS), [x, w], [tx, tw])
        _, (jb,) = mx.jvp(lambda x, w: mx.fast.rms_norm(x, w, EPS), [x, w], [tx, tw])
        close(ja, jb, 1e-4)


@pytest.mark.parametrize("in_axes", [(0, None), (1, None), (2, None), (0, 0)])
def test_vmap(device, data, in_axes):
    x, w, _ = data
    if in_axes[0] == 2:  # the batch is x's last axis: rows are of length 6
        w = w[:6]
    if in_axes[1] == 0:
        w = mx.stack([w, 2 * w, w + 1, -w])
    with mx.stream(device):
        a = mx.vmap(lambda x, w: mlx_rmsnorm.rms_norm(x, w, EPS), in_axes=in_axes)(x, w)
        b = mx.vmap(lambda x, w: mx.fast.rms_norm(x, w, EPS), in_axes=in_axes)(x, w)
        close(a, b)


def test_vmap_of_grad(device, data):
    x, w, g = data
    with mx.stream(device):
        ours, theirs = losses(g[0])
        a = mx.vmap(mx.grad(ours), in_axes=(0, None))(x, w)
        b = mx.vmap(mx.grad(theirs), in_axes=(0, None))(x, w)
        close(a, b)


@pytest.mark.parametrize("shapeless", [False, True])
def test_compile(device, data, shapeless):
    x, w, g = data
    with mx.stream(device):
        ours, theirs = losses(g)
        f = mx.compile(mx.value_and_grad(ours, argnums=(0, 1)), shapeless=shapeless)
        (va, (gxa, gwa)) = f(x, w)
        (vb, (gxb, gwb)) = mx.value_and_grad(theirs, argnums=(0, 1))(x, w)
        close(va, vb)
        close(gxa, gxb)
        close(gwa, gwb)
        if shapeless:  # a new row count reuses the compiled graph
            x2 = random((3, 6, 48), mx.float32, 35)
            fn = mx.compile(lambda x, w: mlx_rmsnorm.rms_norm(x, w, EPS), shapeless=True)
            fn(x, w)
            close(fn(x2, w), mx.fast.rms_norm(x2, w, EPS))


def test_second_order(device, data):
    x, w, g = data
    with mx.stream(device):
        ours, theirs = losses(g)

        def grad_norm(loss):
            return lambda x, w: sum((t * t).sum() for t in mx.grad(loss, argnums=(0, 1))(x, w))

        a = mx.grad(grad_norm(ours), argnums=(0, 1))(x, w)
        b = mx.grad(grad_norm(theirs), argnums=(0, 1))(x, w)
        for ai, bi in zip(a, b):
            close(ai, bi, 1e-4)


def test_vjp_primitive_is_differentiable(device, data):
    x, w, g = data
    with mx.stream(device):
        def f(x, w):
            gx, gw = mlx_rmsnorm.rms_norm_vjp(x, w, g, EPS)
            return (gx * gx).sum() + (gw * gw).sum()

        def f_ref(x, w):
            _, (gx, gw) = mx.vjp(lambda x, w: mx.fast.rms_norm(x, w, EPS), [x, w], [g])
            return (gx * gx).sum() + (gw * gw).sum()

        for a, b in zip(mx.grad(f, argnums=(0, 1))(x, w), mx.grad(f_ref, argnums=(0, 1))(x, w)):
            close(a, b, 1e-4)


def test_module_dropin(device):
    ours, theirs = mlx_rmsnorm.RMSNorm(64, eps=1e-6), nn.RMSNorm(64, eps=1e-6)
    assert ours.weight.dtype == theirs.weight.dtype == mx.float32
    assert ours.eps == theirs.eps
    theirs.update({"weight": random((64,), mx.float32, 36)})
    ours.load_weights(list(theirs.parameters().items()))  # checkpoints load as they are
    x = random((2, 5, 64), mx.bfloat16, 37)
    with mx.stream(device):
        a, b = ours(x), theirs(x)
        assert a.dtype == b.dtype == mx.float32
        close(a, b, 1e-5)

        def loss(model, x):
            return (model(x) ** 2).sum()

        ga = nn.value_and_grad(ours, loss)(ours, x)[1]["weight"]
        gb = nn.value_and_grad(theirs, loss)(theirs, x)[1]["weight"]
        close(ga, gb, 1e-4)
