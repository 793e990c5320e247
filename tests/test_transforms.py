"""The plugin under MLX's transforms gives what mx.fast.rms_norm gives."""

import re

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import graph_text, random, ref_forward
from mlx.utils import tree_flatten, tree_map

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


# --- no gw work when the weight gets no gradient -------------------------------


def vjp_node_outputs(out):
    """Number of outputs of each RMSNormPluginVJP node in the graph of `out`
    (one: gx only; two: gx and gw); an int for a graph with a single node."""
    text = graph_text(out)
    ids = re.findall(r'\{ (\d+) \[label ="RMSNormPluginVJP"', text)
    assert ids, text
    counts = [len(re.findall(rf"^{i} -> ", text, flags=re.M)) for i in ids]
    return counts[0] if len(counts) == 1 else counts


def test_grad_wrt_x_only_builds_no_gw(device, data):
    x, w, g = data
    mx.eval(x, w, g)
    with mx.stream(device), mlx_rmsnorm.patched():
        loss = lambda x, w: (mx.fast.rms_norm(x, w, EPS) * g).sum()  # noqa: E731
        gx = mx.grad(loss, argnums=0)(x, w)
        assert vjp_node_outputs(gx) == 1
        gx_both, gw = mx.grad(loss, argnums=(0, 1))(x, w)
        assert vjp_node_outputs(gw) == 2
        close(gx, gx_both, 0)  # the same kernel, the same bits
    ref = mx.grad(lambda x, w: (mx.fast.rms_norm(x, w, EPS) * g).sum())(x, w)
    close(gx, ref)


def test_rms_norm_vjp_need_gw_false(device, data):
    x, w, g = data
    with mx.stream(device):
        gx, gw = mlx_rmsnorm.rms_norm_vjp(x, w, g, EPS, need_gw=False)
        assert gw is None
        assert vjp_node_outputs(gx) == 1
        full, _ = mlx_rmsnorm.rms_norm_vjp(x, w, g, EPS)
        close(gx, full, 0)
        # every transform of the gx-only node: vmap, jvp, second order
        a = mx.vmap(lambda x, g: mlx_rmsnorm.rms_norm_vjp(x, w, g, EPS, need_gw=False)[0])(x, g)
        close(a, full)
        _, (ja,) = mx.jvp(lambda x: mlx_rmsnorm.rms_norm_vjp(x, w, g, EPS, need_gw=False)[0], [x], [g])
        _, (jb,) = mx.jvp(lambda x: mlx_rmsnorm.rms_norm_vjp(x, w, g, EPS)[0], [x], [g])
        close(ja, jb, 1e-5)
        ha = mx.grad(lambda x: (mlx_rmsnorm.rms_norm_vjp(x, w, g, EPS, need_gw=False)[0] ** 2).sum())(x)
        hb = mx.grad(lambda x: (mlx_rmsnorm.rms_norm_vjp(x, w, g, EPS)[0] ** 2).sum())(x)
        close(ha, hb, 1e-5)


def test_frozen_norms_train_like_the_builtin(device):
    def build():
        model = nn.Sequential(nn.Linear(24, 48), nn.RMSNorm(48), nn.Linear(48, 48), nn.RMSNorm(48),
                              nn.Linear(48, 8))
        params = [
            {"weight": random((48, 24), mx.float32, 40), "bias": random((48,), mx.float32, 41)},
            {"weight": random((48,), mx.float32, 42, 0.3, 1.0)},
            {"weight": random((48, 48), mx.float32, 43, 0.2), "bias": random((48,), mx.float32, 44)},
            {"weight": random((48,), mx.float32, 45, 0.3, 1.0)},
            {"weight": random((8, 48), mx.float32, 46), "bias": random((8,), mx.float32, 47)},
        ]
        model.update({"layers": params})
        model.layers[1].freeze()
        model.layers[3].freeze()
        return model

    x = random((16, 24), mx.float32, 48)
    y = random((16, 8), mx.float32, 49)

    def loss(m, x, y):
        return ((m(x) - y) ** 2).mean()

    def train(patched):
        model = build()
        step = nn.value_and_grad(model, loss)
        losses = []
        for _ in range(5):
            if patched:
                with mlx_rmsnorm.patched():
                    value, grads = step(model, x, y)
            else:
                value, grads = step(model, x, y)
            assert "weight" not in grads["layers"][1] and "weight" not in grads["layers"][3]
            model.update(tree_map(lambda p, g: p - 0.1 * g, model.trainable_parameters(), grads))
            mx.eval(model.parameters())
            losses.append(value.item())
        return losses, model

    with mx.stream(device):
        ref_losses, ref_model = train(False)
        our_losses, our_model = train(True)
        with mlx_rmsnorm.patched():
            grads = nn.value_and_grad(our_model, loss)(our_model, x, y)[1]
            assert vjp_node_outputs(grads["layers"][0]["weight"]) == [1, 1]  # no gw anywhere
    assert np.allclose(our_losses, ref_losses, rtol=1e-5)
    assert our_losses[-1] < our_losses[0]
    for (k, a), (_, b) in zip(tree_flatten(our_model.parameters()), tree_flatten(ref_model.parameters())):
        close(a, b, 1e-5)


# --- mx.compile(..., shapeless=True) under patch(): the graphs that leave our
# two primitives (float64, vmap with the weight mapped, second order) are MLX
# ops whose nodes all infer their output shapes ---------------------------------

F64_WEIGHT = random((24,), mx.float32, 83, 0.5, 1.0).astype(mx.float64, stream=mx.cpu)  # float64 lives on the CPU


def _f64_x(rows):
    return (random((rows, 3, 24), mx.float32, 80 + rows).astype(mx.float64),)


def _f64_layer():
    layer = nn.RMSNorm(24, eps=EPS)
    layer.set_dtype(mx.float64)
    layer.update({"weight": F64_WEIGHT})
    return layer


def _data(rows):
    return (random((rows, 24), mx.float32, 84 + rows), random((24,), mx.float32, 85, 0.5, 1.0),
            random((rows, 24), mx.float32, 86 + rows))


def _batched(rows):
    """A batch of 3 (x, weight) pairs: the weight is mapped too. The rows
    change, not the batch: a new vmapped batch size fails the built-in's
    shapeless graph as well ([broadcast_shapes], MLX 0.32.4)."""
    return (random((3, rows, 24), mx.float32, 87 + rows), random((3, 24), mx.float32, 88, 0.5, 1.0))


def _grad_of_grad(x, w, g):
    def outer(x, w):
        gx, gw = mx.grad(lambda x, w: (mx.fast.rms_norm(x, w, EPS) * g).sum(), argnums=(0, 1))(x, w)
        return (gx * gx).sum() + (gw * gw).sum()

    return mx.grad(outer, argnums=(0, 1))(x, w)


# name: (float64 weight of the float64 reference or None, inputs(rows), fn);
# fn looks mx.fast.rms_norm up at call time: the plugin under patched().
SHAPELESS = {
    "float64": (None, _f64_x, lambda x: mx.fast.rms_norm(x, None, EPS)),
    "nn.RMSNorm float64": (F64_WEIGHT, _f64_x, lambda x: _f64_layer()(x)),
    "grad of grad": (None, _data, _grad_of_grad),
    "vmap, weight mapped": (None, _batched, mx.vmap(lambda x, w: mx.fast.rms_norm(x, w, EPS))),
}


def _as_list(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


@pytest.mark.parametrize("case", list(SHAPELESS))
def test_shapeless_compile_under_patch(device, case):
    weight64, inputs, fn = SHAPELESS[case]
    is_f64 = case.endswith("float64")
    if is_f64 and device != mx.cpu:
        pytest.skip("float64 runs on the CPU stream only (the built-in's too)")
    compiled = mx.compile(fn, shapeless=True)
    with mx.stream(device):
        for rows in (4, 7):  # the second row count reuses the shapeless graph
            args = inputs(rows)
            with mlx_rmsnorm.patched():
                ours = _as_list(compiled(*args))
            theirs = _as_list(fn(*args))  # unpatched: the built-in
            for a, b in zip(ours, theirs, strict=True):
                assert a.shape == b.shape and a.dtype == b.dtype
                close(a, b, 1e-4 if case == "grad of grad" else 2e-6)
            if is_f64:
                # ours normalizes in float64 (the built-in in fp32 and casts);
                # eps reaches both ops as a float32 (1e-5 + 2.5e-13), hence
                # not 1e-15
                ref = ref_forward(args[0], weight64, EPS)
                assert np.max(np.abs(np.array(ours[0]) - ref)) <= 1e-11 * np.max(np.abs(ref))
