"""Every dtype combination mx.fast.rms_norm accepts works with the plugin, with
the built-in's output dtype and the right value; what it refuses, we refuse
with the same class of error."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import GPU_AVAILABLE, graph_text, random, ref_backward, ref_forward, rel_err, to_numpy
from mlx.utils import tree_flatten

import mlx_rmsnorm

X_TYPES = ["float32", "float16", "bfloat16", "float64", "int32", "int8", "uint8", "bool_", "int64", "uint64"]
W_TYPES = [None, "float32", "float16", "bfloat16", "float64", "int32", "int8", "bool_", "uint64", "complex64"]
# Normwise tolerance by the output dtype: float64 is computed in float64 here
# (the built-in normalizes in fp32, so against it float64 gets fp32's).
TOL = {mx.float32: 2e-6, mx.float16: 2e-3, mx.bfloat16: 1.2e-2, mx.float64: 1e-12}
N = 48


def make(name, shape, seed, offset=0.0):
    if name is None:
        return None
    t = getattr(mx, name)
    vals = np.random.default_rng(seed).standard_normal(shape) * 3 + offset
    if name == "bool_":
        return mx.array(vals > 0)
    if name.startswith("uint"):
        vals = np.abs(vals)
    if name.startswith(("int", "uint")):
        vals = np.round(vals)
    # Cast on the CPU stream: float64 exists only there (a GPU-stream op with
    # float64 raises at graph build), and every device then gets the same input.
    a = mx.array(vals.astype(np.float64 if name == "float64" else np.float32)).astype(t, stream=mx.cpu)
    mx.eval(a)  # graphs below then show only what the op adds
    return a


def builtin_outcome(x, w):
    try:
        y = mx.fast.rms_norm(x, w, 1e-5, stream=mx.cpu)
        mx.eval(y)
        return y
    except ValueError as e:
        return e


@pytest.mark.parametrize("w_name", W_TYPES, ids=str)
@pytest.mark.parametrize("x_name", X_TYPES)
def test_forward_every_dtype_pair(x_name, w_name):
    # A CPU-stream test throughout: the float64 references (and float64
    # outputs) cannot touch the GPU, which is the default device there.
    with mx.stream(mx.cpu):
        check_forward_dtype_pair(x_name, w_name)


def check_forward_dtype_pair(x_name, w_name):
    x = make(x_name, (5, N), 1)
    w = make(w_name, (N,), 2, offset=1.0)
    expected = builtin_outcome(x, w)
    if isinstance(expected, ValueError):
        with pytest.raises(ValueError, match="unsupported type"):
            mlx_rmsnorm.rms_norm(x, w, 1e-5, stream=mx.cpu)
        return
    y = mlx_rmsnorm.rms_norm(x, w, 1e-5, stream=mx.cpu)
    assert y.dtype == expected.dtype and y.shape == x.shape
    # the reference from the values the built-in computes with: both inputs
    # cast to the output dtype first
    out = y.dtype
    xd = np.array(x.astype(out).astype(mx.float64))
    wd = np.array(w.astype(out).astype(mx.float64)) if w is not None else 1.0
    ref = xd / np.sqrt(np.mean(xd * xd, axis=-1, keepdims=True) + 1e-5) * wd
    assert rel_err(np.array(y.astype(mx.float64)), ref) <= TOL[out]
    # and against the built-in itself (it rounds x / rstd to fp32 for float64)
    tol_builtin = 2e-6 if out == mx.float64 else 2 * TOL[out]
    assert rel_err(y.astype(mx.float32), to_numpy(expected)) <= tol_builtin


@pytest.mark.parametrize(
    "x_name,w_name",
    [("int32", "float32"), ("bool_", "bfloat16"), ("float32", "int32"), ("float16", "bool_"),
     ("uint64", "int32"), ("float16", "bfloat16")],
)
def test_integer_inputs_cast_once_and_differentiate(device, x_name, w_name):
    with mx.stream(device):
        check_integer_inputs(x_name, w_name)


def check_integer_inputs(x_name, w_name):
    x = make(x_name, (3, 4, N), 3)
    w = make(w_name, (N,), 4, offset=1.0)
    y = mlx_rmsnorm.rms_norm(x, w, 1e-5)
    text = graph_text(y)
    # one cast per input that the kernels cannot read, none for the others
    n_int = sum(not mx.issubdtype(a.dtype, mx.floating) for a in (x, w))
    assert text.count('"AsType"') == n_int
    assert "Contiguous" not in text and "RMSNormPlugin" in text
    # the gradient for the floating input matches the built-in's
    floating = [i for i, a in enumerate((x, w)) if mx.issubdtype(a.dtype, mx.floating)]
    g = random(x.shape, y.dtype, 5)

    def loss(fn):
        return lambda x, w: (fn(x, w, 1e-5).astype(mx.float32) * g.astype(mx.float32)).sum()

    for i in floating:
        a = mx.grad(loss(mlx_rmsnorm.rms_norm), argnums=i)(x, w)
        b = mx.grad(loss(mx.fast.rms_norm), argnums=i)(x, w)
        assert a.dtype == b.dtype
        # computed in the result type, then rounded to the input's dtype: on
        # the GPU the built-in's kernel and ours may round to neighbours there
        tol = 2 * max(TOL[mx.result_type(x, w)], TOL[a.dtype])
        assert rel_err(a, to_numpy(b)) <= tol


def test_rms_norm_vjp_casts_integer_inputs(device):
    with mx.stream(device):
        check_rms_norm_vjp_casts_integer_inputs()


def check_rms_norm_vjp_casts_integer_inputs():
    x = make("int32", (6, N), 6)
    w = make("float16", (N,), 7, offset=1.0)
    g = random((6, N), mx.float16, 8)
    gx, gw = mlx_rmsnorm.rms_norm_vjp(x, w, g, 1e-5)
    assert gx.dtype == mx.float16 and gw.dtype == mx.float16  # x was cast to the result type
    ref_gx, ref_gw = ref_backward(x.astype(mx.float16), w, g, 1e-5)
    assert rel_err(gw, ref_gw) <= TOL[mx.float16]
    assert rel_err(gx, ref_gx) <= 2 * TOL[mx.float16]


@pytest.mark.parametrize("w_name", [None, "float64", "float32", "bfloat16", "int32"], ids=str)
def test_float64_forward_and_backward_in_float64(w_name):
    # float64 runs on the CPU stream only (the GPU case is the test below)
    with mx.stream(mx.cpu):
        check_float64_forward_and_backward(w_name)


def check_float64_forward_and_backward(w_name):
    x = make("float64", (4, 3, N), 9)
    w = make(w_name, (N,), 10, offset=1.0)
    g = make("float64", (4, 3, N), 11)
    y, vjp = mx.vjp(
        lambda x, *w: mlx_rmsnorm.rms_norm(x, w[0] if w else None, 1e-6),
        [x] + ([w] if w is not None else []),
        [g],
    )
    y = y[0]
    assert y.dtype == mx.float64
    xd, gd = np.array(x), np.array(g)
    wd = np.array(w.astype(mx.float64)) if w is not None else None
    r = 1 / np.sqrt(np.mean(xd * xd, axis=-1, keepdims=True) + 1e-6)
    ref_y = xd * r * (wd if wd is not None else 1)
    assert rel_err(np.array(y), ref_y) <= 1e-13
    v = gd * (wd if wd is not None else 1)
    ref_gx = r * v - xd * np.mean(v * xd, axis=-1, keepdims=True) * r**3
    assert vjp[0].dtype == mx.float64
    assert rel_err(np.array(vjp[0]), ref_gx) <= 1e-12
    # direct backward, float64 too
    gx, gw = mlx_rmsnorm.rms_norm_vjp(x, w, g, 1e-6)
    assert rel_err(np.array(gx), ref_gx) <= 1e-12
    if w is not None and mx.issubdtype(w.dtype, mx.floating):
        ref_gw = (gd * xd * r).reshape(-1, N).sum(0)
        assert gw.dtype == w.dtype and vjp[1].dtype == w.dtype
        tol = 1e-12 if w.dtype == mx.float64 else TOL[w.dtype]
        assert rel_err(np.array(gw.astype(mx.float64)), ref_gw) <= tol
        assert rel_err(np.array(vjp[1].astype(mx.float64)), ref_gw) <= tol


def test_float64_model_under_patch_trains_like_builtin():
    # a float64 model trains on the CPU stream only, the built-in's as ours
    with mx.stream(mx.cpu):
        check_float64_model_under_patch()


def check_float64_model_under_patch():
    def build():
        model = nn.Sequential(nn.Linear(16, 32), nn.RMSNorm(32), nn.Linear(32, 4))
        model.update(
            {"layers": [{"weight": random((32, 16), mx.float32, 12), "bias": random((32,), mx.float32, 13)},
                        {"weight": random((32,), mx.float32, 14, 0.3, 1.0)},
                        {"weight": random((4, 32), mx.float32, 15), "bias": random((4,), mx.float32, 16)}]}
        )
        model.set_dtype(mx.float64)
        return model

    x = make("float64", (8, 16), 17)

    def loss(m, x):
        return (m(x) ** 2).mean()

    ref_model, our_model = build(), build()
    ref_loss, ref_grads = nn.value_and_grad(ref_model, loss)(ref_model, x)
    with mlx_rmsnorm.patched():
        assert "RMSNorm" not in graph_text(our_model(x))  # float64: MLX ops, no primitive
        our_loss, our_grads = nn.value_and_grad(our_model, loss)(our_model, x)
    assert our_loss.dtype == mx.float64
    # the built-in normalizes float64 in fp32: agreement to fp32 precision
    assert abs(our_loss.item() - ref_loss.item()) <= 1e-6 * abs(ref_loss.item())
    ours, theirs = dict(tree_flatten(our_grads)), dict(tree_flatten(ref_grads))
    for k in ours:
        assert ours[k].dtype == mx.float64
        assert rel_err(np.array(ours[k]), np.array(theirs[k])) <= 1e-5, k


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_AVAILABLE, reason="needs MLX CUDA + kernels")
@pytest.mark.parametrize("w_name", [None, "float64", "float32", "int32"], ids=str)
def test_float64_on_gpu_stream_fails_as_the_builtin_does(w_name):
    x = make("float64", (4, N), 18)
    w = make(w_name, (N,), 21, offset=1.0)
    g = make("float64", (4, N), 22)
    with pytest.raises(ValueError) as theirs:
        mx.eval(mx.fast.rms_norm(x, w, 1e-5, stream=mx.gpu))
    assert "float64" in str(theirs.value)
    with pytest.raises(ValueError) as ours:
        mx.eval(mlx_rmsnorm.rms_norm(x, w, 1e-5, stream=mx.gpu))
    assert str(ours.value) == str(theirs.value)
    # the backward has no built-in counterpart; it refuses the same way
    with pytest.raises(ValueError) as ours_vjp:
        mx.eval(mlx_rmsnorm.rms_norm_vjp(x, w, g, 1e-5, stream=mx.gpu))
    assert str(ours_vjp.value) == str(theirs.value)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_AVAILABLE, reason="needs MLX CUDA + kernels")
@pytest.mark.parametrize("x_name,w_name", [("int32", "bfloat16"), ("float32", "int8"), ("float16", "bfloat16"),
                                           ("bool_", "float32")])
def test_mixed_and_integer_dtypes_on_gpu(x_name, w_name):
    x = make(x_name, (7, 300), 19)
    w = make(w_name, (300,), 20, offset=1.0)
    y = mlx_rmsnorm.rms_norm(x, w, 1e-5, stream=mx.gpu)
    b = mx.fast.rms_norm(x, w, 1e-5, stream=mx.gpu)
    assert y.dtype == b.dtype
    assert rel_err(y, to_numpy(b)) <= 2 * TOL[y.dtype]
