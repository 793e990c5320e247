"""Forward and backward against a float64 NumPy reference and mx.fast.rms_norm."""

import mlx.core as mx
import numpy as np
import pytest
from conftest import DTYPES, TOL, graph_text, gx_scale, random, ref_backward, ref_forward, rel_err, to_numpy

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


def test_non_contiguous_inputs_under_grad_and_no_copy_nodes(device):
    base = random((4, 3, 2 * 64), mx.float32, 25)
    cases = {
        "strided": base[:, :, ::2],
        "transposed": random((3, 4, 64), mx.float32, 26).transpose(1, 0, 2),
        "inner transposed": random((64, 12), mx.float32, 27).T.reshape(4, 3, 64),
        "broadcast rows": mx.broadcast_to(random((64,), mx.float32, 28), (4, 3, 64)),
    }
    w = random((2 * 64,), mx.float32, 29)[::2]  # strided weight
    g = mx.broadcast_to(random((3, 64), mx.float32, 30), (4, 3, 64))  # what .sum() losses give
    for name, x in cases.items():
        mx.eval(x, w, g)
        y = mlx_rmsnorm.rms_norm(x, w, 1e-5, stream=device)
        assert "Contiguous" not in graph_text(y) and "Copy" not in graph_text(y), name
        check(x, w, g, 1e-5, device)
        with mx.stream(device):
            gx, gw = mx.grad(lambda x, w: (mlx_rmsnorm.rms_norm(x, w, 1e-5) * g).sum(), argnums=(0, 1))(x, w)
        ref_gx, ref_gw = ref_backward(x, w, g, 1e-5)
        assert rel_err(gx, ref_gx, gx_scale(x, w, g, 1e-5)) <= TOL[mx.float32], name
        assert rel_err(gw, ref_gw) <= TOL[mx.float32], name


# --- eps = 0 and rows of tiny RMS: every path, one answer ----------------------

TINY = [1e-15, 1e-17]  # RMS of the rows; r^3 overflows fp32 below ~1e-13


def tiny_data(rms, seed):
    x = random((3, 5, 40), mx.float32, seed, rms)
    w = random((40,), mx.float32, seed + 1, 0.3, 1.0)
    g = random((3, 5, 40), mx.float32, seed + 2)
    t = random((3, 5, 40), mx.float32, seed + 3, rms)  # a tangent of x's size
    mx.eval(x, w, g, t)
    return x, w, g, t


@pytest.mark.parametrize("rms", TINY)
def test_eps0_tiny_rows_first_order_paths_agree_with_float64(device, rms):
    x, w, g, t = tiny_data(rms, 50)
    ref_gx, ref_gw = ref_backward(x, w, g, 0.0)
    scale = gx_scale(x, w, g, 0.0)
    with mx.stream(device):
        direct, gw = mlx_rmsnorm.rms_norm_vjp(x, w, g, 0.0)
        via_grad = mx.grad(lambda x: (mlx_rmsnorm.rms_norm(x, w, 0.0) * g).sum())(x)
        vmapped = mx.vmap(mx.grad(lambda x, g: (mlx_rmsnorm.rms_norm(x, w, 0.0) * g).sum()))(x, g)
        vmap_w = mx.vmap(lambda x, w, g: mlx_rmsnorm.rms_norm_vjp(x, w, g, 0.0)[0], in_axes=(0, None, 0))(x, w, g)
        _, (tangent,) = mx.jvp(lambda x: mlx_rmsnorm.rms_norm(x, w, 0.0), [x], [t])
    for name, gx in [("direct", direct), ("grad", via_grad), ("vmap of grad", vmapped), ("vmap", vmap_w)]:
        assert rel_err(gx, ref_gx, scale) <= TOL[mx.float32], name
    assert rel_err(gw, ref_gw) <= TOL[mx.float32]
    # jvp: J t = r w t - w x mean(x t) r^3, in float64
    xd, td, wd = to_numpy(x), to_numpy(t), to_numpy(w)
    r = 1 / np.sqrt(np.mean(xd * xd, axis=-1, keepdims=True))
    ref_jvp = r * wd * td - wd * xd * np.mean(xd * td, axis=-1, keepdims=True) * r**3
    assert rel_err(tangent, ref_jvp, np.max(np.abs(r * wd * td))) <= TOL[mx.float32]


@pytest.mark.parametrize("rms", TINY)
def test_eps0_tiny_rows_second_order_is_scale_invariant(device, rms):
    """With eps = 0, y(a x) = y(x): the gradient scales as 1/a and the
    Hessian-vector products as 1/a^2. The same rows at RMS ~1 (well inside
    fp32, checked against the built-in elsewhere) give the reference."""
    x1, w, g, _ = tiny_data(1.0, 60)
    u = random((40,), mx.float32, 64)  # sum(gx * x) over a row is 0: weigh the columns
    a = mx.array(rms, mx.float32)
    xa = x1 * a

    def h_of(gx, gw, x):
        return (gx * x * u).sum() + (gw * gw).sum()  # gx * x keeps the scale out

    def second(x):
        def h(x, w):
            gx, gw = mx.grad(lambda x, w: (mlx_rmsnorm.rms_norm(x, w, 0.0) * g).sum(), argnums=(0, 1))(x, w)
            return h_of(gx, gw, x)

        return mx.grad(h, argnums=(0, 1))(x, w)

    with mx.stream(device):
        (hx1, hw1), (hxa, hwa) = second(x1), second(xa)
    # float64 of the same function (MLX ops in float64, CPU) at the tiny scale
    with mx.stream(mx.cpu):
        hx64, hw64 = mx.grad(
            lambda x, w: h_of(
                *mx.grad(lambda x, w: (mlx_rmsnorm.rms_norm(x, w, 0.0) * g.astype(mx.float64)).sum(),
                         argnums=(0, 1))(x, w), x),
            argnums=(0, 1),
        )(xa.astype(mx.float64), w.astype(mx.float64))
    mx.eval(hx1, hw1, hxa, hwa)
    for v in (hxa, hwa):
        assert np.all(np.isfinite(np.array(v)))
    # hx: the derivative of an O(1) function of x/a: scales as 1/a
    assert rel_err(np.array(hxa) * rms, to_numpy(hx1)) <= 1e-4
    assert rel_err(hwa, to_numpy(hw1)) <= 1e-4
    assert rel_err(np.array(hxa), np.array(hx64)) <= 1e-4
    assert rel_err(np.array(hwa), np.array(hw64)) <= 1e-4


def ref_hvp(x, w, g, t):
    """float64 d(gx, gw) in the direction t of x, with eps = 0:
    gx = r v - x r^3 m (v = g w, m = mean(v x)), gw = sum over rows g x r;
    dr = -r^3 mean(x t), dm = mean(v t)."""
    xd, wd, gd, td = to_numpy(x), to_numpy(w), to_numpy(g), to_numpy(t)
    r = 1 / np.sqrt(np.mean(xd * xd, axis=-1, keepdims=True))
    v = gd * wd
    m = np.mean(v * xd, axis=-1, keepdims=True)
    dr = -(r**3) * np.mean(xd * td, axis=-1, keepdims=True)
    dm = np.mean(v * td, axis=-1, keepdims=True)
    dgx = dr * v - td * r**3 * m - xd * (3 * r**2 * dr * m + r**3 * dm)
    dgw = (gd * (td * r + xd * dr)).reshape(-1, x.shape[-1]).sum(axis=0)
    return dgx, dgw


@pytest.mark.parametrize("t_scale", ["rms", "one"])
@pytest.mark.parametrize("rms", [1.0, 1e-13, 1e-15, 1e-17])
def test_eps0_tiny_rows_jvp_of_vjp_is_finite_and_right(device, rms, t_scale):
    """Forward over reverse (mx.jvp of our mx.vjp) against float64, and equal
    to reverse over forward (mx.vjp of mx.jvp) and reverse over reverse
    (mx.grad of <gx, t>): all three are the Hessian of <g, y> times t. With a
    tangent of size 1 (not x's), ((m r) r) r's tangent overflowed fp32 from
    RMS ~1e-13 although the result is ~r^2, far from overflow."""
    x, w, g, t = tiny_data(rms, 70)
    if t_scale == "one":
        t = random(x.shape, mx.float32, 74)
    ref_dgx, ref_dgw = ref_hvp(x, w, g, t)

    def vjp_x_w(x):
        _, (gx, gw) = mx.vjp(lambda x, w: mlx_rmsnorm.rms_norm(x, w, 0.0), [x, w], [g])
        return gx, gw

    with mx.stream(device):
        _, (fwd_rev_gx, fwd_rev_gw) = mx.jvp(vjp_x_w, [x], [t])
        _, (rev_fwd,) = mx.vjp(
            lambda x: mx.jvp(lambda x: mlx_rmsnorm.rms_norm(x, w, 0.0), [x], [t])[1][0], [x], [g])
        rev_rev = mx.grad(lambda x: (vjp_x_w(x)[0] * t).sum())(x)
    for name, dgx in [("jvp(vjp)", fwd_rev_gx), ("vjp(jvp)", rev_fwd), ("grad(grad)", rev_rev)]:
        assert rel_err(dgx, ref_dgx) <= 1e-4, name  # rel_err also asserts finiteness
    assert rel_err(fwd_rev_gw, ref_dgw) <= 1e-4
