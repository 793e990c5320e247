"""Forward and backward against a float64 NumPy reference and mx.fast.rms_norm."""

import mlx.core as mx
import numpy as np
import pytest
from conftest import DTYPES, TOL, gx_scale, random, ref_backward, ref_forward, rel_err

import mlx_rmsnorm

NS = [1, 7, 31, 32, 33, 128, 256, 1000, 2880, 4099, 8192]
LEADING = [(3,), (2, 5), (2, 1, 3)]


def check(x, w, g, eps, device, algorithm="auto"):
    y = mlx_rmsnorm.rms_norm(x, w, eps, stream=device)
    gx, gw = mlx_rmsnorm.rms_norm_vjp(x, w, g, eps, algorithm=algorithm, stream=device)
    mx.eval(y, gx, gw)
    out_type = mx.result_type(x.dtype, w.dtype) if w is not None else x.dtype
    assert y.dtype == out_type and y.shape == x.shape
    assert gx.dtype == x.dtype and gx.shape == x.shape
    assert rel_err(y, ref_forward(x, w, eps)) <= TOL[out_type]
    ref_gx, ref_gw = ref_backward(x, w, g, eps)
    assert rel_err(gx, ref_gx, gx_scale(x, w, g, eps)) <= TOL[x.dtype]
    if w is None:
        assert gw is None
    else:
        assert gw.dtype == w.dtype and gw.shape == w.shape
        assert rel_err(gw, ref_gw) <= TOL[w.dtype]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("n", NS)
def test_every_n(device, dtype, n):
    t = DTYPES[dtype]
    x = random((5, n), t, 1)
    w = random((n,), t, 2, 0.5, 1.0)
    g = random((5, n), t, 3)
    check(x, w, g, 1e-5, device)


@pytest.mark.parametrize("leading", LEADING)
@pytest.mark.parametrize("eps", [1e-6, 1e-5, 1e-2])
def test_leading_dims_and_eps(device, leading, eps):
    shape = leading + (96,)
    x = random(shape, mx.float32, 4, 0.05)  # small rms: eps matters
    w = random((96,), mx.float32, 5)
    g = random(shape, mx.float32, 6)
    check(x, w, g, eps, device)


@pytest.mark.parametrize(
    "x_dtype,w_dtype",
    [("bfloat16", "float32"), ("float16", "float32"), ("float32", "bfloat16"),
     ("float16", "bfloat16"), ("bfloat16", "float16")],
)
def test_mixed_dtypes(device, x_dtype, w_dtype):
    x = random((7, 256), DTYPES[x_dtype], 7)
    w = random((256,), DTYPES[w_dtype], 8, 0.5, 1.0)
    out_type = mx.result_type(x.dtype, w.dtype)
    g = random((7, 256), out_type, 9)
    check(x, w, g, 1e-5, device)


@pytest.mark.parametrize("rows", [0, 1])
@pytest.mark.parametrize("n", [1, 64, 4099])
def test_zero_and_one_row(device, rows, n):
    x = random((rows, n), mx.bfloat16, 10)
    w = random((n,), mx.bfloat16, 11)
    g = random((rows, n), mx.bfloat16, 12)
    check(x, w, g, 1e-5, device)
    if rows == 0:
        _, gw = mlx_rmsnorm.rms_norm_vjp(x, w, g, 1e-5, stream=device)
        assert np.all(np.array(gw.astype(mx.float32)) == 0)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_no_weight(device, dtype):
    x = random((4, 3, 200), DTYPES[dtype], 13)
    g = random((4, 3, 200), DTYPES[dtype], 14)
    check(x, None, g, 1e-5, device)


def test_one_dimensional_x(device):
    x = random((300,), mx.float32, 15)
    w = random((300,), mx.float32, 16)
    g = random((300,), mx.float32, 17)
    check(x, w, g, 1e-5, device)


def test_strided_broadcast_and_sliced_inputs(device):
    base = random((6, 2 * 130), mx.float32, 18)
    x = base[:, ::2]  # strided rows
    xt = random((130, 6), mx.float32, 19).T  # transposed
    xs = random((6 * 130 + 3,), mx.bfloat16, 20)[3:].reshape(6, 130)  # offset
    w = mx.broadcast_to(mx.array(1.5), (130,))  # stride-0 weight
    g = random((6, 130), mx.float32, 21)
    for xi in (x, xt):
        check(xi, w, g, 1e-5, device)
    check(xs, w.astype(mx.bfloat16), g.astype(mx.bfloat16), 1e-5, device)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_matches_builtin(device, dtype):
    t = DTYPES[dtype]
    x = random((9, 512), t, 22)
    w = random((512,), t, 23, 0.5, 1.0)
    g = random((9, 512), t, 24)

    def loss(fn):
        return lambda x, w: (fn(x, w, 1e-5).astype(mx.float32) * g.astype(mx.float32)).sum()

    with mx.stream(device):
        y_ours = mlx_rmsnorm.rms_norm(x, w, 1e-5)
        y_mlx = mx.fast.rms_norm(x, w, 1e-5)
        ours = mx.grad(loss(mlx_rmsnorm.rms_norm), argnums=(0, 1))(x, w)
        theirs = mx.grad(loss(mx.fast.rms_norm), argnums=(0, 1))(x, w)
    assert rel_err(y_ours, np.array(y_mlx.astype(mx.float32), dtype=np.float64)) <= TOL[t]
    for a, b in zip(ours, theirs):
        # the built-in may round its own partials: allow two roundings
        assert rel_err(a, np.array(b.astype(mx.float32), dtype=np.float64)) <= 2 * TOL[t]
