"""The RMSNorm family's contract: rms_norm / rms_norm_vjp, add_rms_norm /
add_rms_norm_vjp (the residual add) and `offset=` (Gemma's 1 + w), each test
written once and parametrized over the switches (add, offset), against the
float64 NumPy references of norm_refs.py and against mx.fast.rms_norm (or
MLX's composition h = x + r; mx.fast.rms_norm(h, w + offset)): values and
gradients, dtypes, transforms, export, determinism, errors, patch()'s routed
functions and the transform contract of norm_contract.py.

Every test with the `device` fixture runs on the CPU stream and, where MLX has
CUDA and the plugin its kernels, on the GPU (`gpu` marker). The GPU launch
plans of the kernels are test_gpu.py's."""

import os
import re

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import assert_normwise_close, lit
from conftest import (DEVICES, DTYPES, GPU_AVAILABLE, ONE_ROUNDING, TOL, graph_text, of_dtype, random, rel_err,
                      to_numpy)
from mlx.utils import tree_flatten, tree_map
from norm_contract import BUILTIN_RMS_NORM, family_contract_tests
from norm_refs import (add_h, add_rms_backward, gw_scale, gx_scale, rms_backward, rms_forward,
                       rms_offset_forward)

import mlx_rmsnorm
from mlx_rmsnorm import _ext

EPS = 1e-5
# the NumPy references of rows of no elements
pytestmark = pytest.mark.filterwarnings("ignore:Mean of empty slice:RuntimeWarning")

ADD = [pytest.param(False, id="rms"), pytest.param(True, id="add")]
OFFSET = [pytest.param(0.0, id="w"), pytest.param(1.0, id="1+w")]


# --- the op under its switches, and the float64 check ---------------------------


def run(x, r, w, gy, gh, eps, device, offset=0.0):
    """(y, h, gx, gr, gw) of the op: add_rms_norm through mx.vjp with both
    cotangents when r is given (h and gr None otherwise); rms_norm and its
    backward op rms_norm_vjp without it (mx.vjp of rms_norm with an offset,
    which rms_norm_vjp does not take)."""
    if r is None and not offset:
        y = mlx_rmsnorm.rms_norm(x, w, eps, stream=device)
        gx, gw = mlx_rmsnorm.rms_norm_vjp(x, w, gy, eps, stream=device)
        mx.eval(y, gx, gw)
        return y, None, gx, None, gw
    add = r is not None
    primals = [x] + ([r] if add else []) + ([w] if w is not None else [])

    def f(*a):
        wt = a[-1] if w is not None else None
        if add:
            return list(mlx_rmsnorm.add_rms_norm(a[0], a[1], wt, eps, offset=offset, stream=device))
        return [mlx_rmsnorm.rms_norm(a[0], wt, eps, offset=offset, stream=device)]

    outs, grads = mx.vjp(f, primals, [gy, gh] if add else [gy])
    mx.eval(outs, grads)
    gw = grads[-1] if w is not None else None
    return outs[0], (outs[1] if add else None), grads[0], (grads[1] if add else None), gw


def check(x, w, eps, device, r=None, offset=0.0, gy=None, seed=50):
    """The op against float64: dtypes and shapes, h exact (one rounding, as
    unfused), y, and every gradient; gx relative to the size of the terms it
    is the difference of (see gx_scale), plus g_h's with the add."""
    add = r is not None
    h_dtype = mx.result_type(x.dtype, r.dtype) if add else x.dtype
    y_dtype = mx.result_type(h_dtype, w.dtype) if w is not None else h_dtype
    if gy is None:
        gy = random(x.shape, y_dtype, seed)
    gh = random(x.shape, h_dtype, seed + 1) if add else None
    y, h, gx, gr, gw = run(x, r, w, gy, gh, eps, device, offset)
    assert y.dtype == y_dtype and y.shape == x.shape
    assert gx.dtype == x.dtype and gx.shape == x.shape
    if add:
        hd = add_h(x, r, h_dtype)
        assert h.dtype == h_dtype and h.shape == x.shape
        assert np.array_equal(to_numpy(h), hd)  # the add is one rounding, as unfused
    else:
        hd = to_numpy(x)
    assert rel_err(y, rms_offset_forward(hd, w, eps, offset)) <= TOL[y_dtype]
    ref_gx, ref_gw, scale = add_rms_backward(hd, w, gy, gh if add else np.zeros(hd.shape), eps, offset)
    assert rel_err(gx, ref_gx, scale) <= TOL[x.dtype]
    if add:
        # each input's gradient comes in its own dtype (a mixed pair was cast to h's)
        assert gr.dtype == r.dtype
        assert rel_err(gr, ref_gx, scale) <= TOL[r.dtype]
        if x.dtype == r.dtype:
            assert np.array_equal(np.array(gx.astype(mx.float32)), np.array(gr.astype(mx.float32)))
    if w is None:
        assert gw is None
    else:
        assert gw.dtype == w.dtype and gw.shape == w.shape
        assert rel_err(gw, ref_gw) <= TOL[w.dtype]
    return y, h, gx, gw


def inputs(shape, dtype, seed, add, w_dtype=None, r_dtype=None, scale=1.0):
    """x, the residual (None without the add) and a weight near 1."""
    x = random(shape, dtype, seed, scale)
    r = random(shape, r_dtype or dtype, seed + 1, scale) if add else None
    w = random(shape[-1:], w_dtype or dtype, seed + 2, 0.5, 1.0)
    return x, r, w


# --- values and gradients against float64 ----------------------------------------

NS = [1, 7, 31, 32, 33, 128, 256, 1000, 2880, 4099, 8192]


@pytest.mark.parametrize("add", ADD)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("n", NS)
def test_every_n(device, dtype, n, add):
    x, r, w = inputs((5, n), DTYPES[dtype], 1, add)
    check(x, w, EPS, device, r=r)


@pytest.mark.parametrize("add", ADD)
@pytest.mark.parametrize("leading", [(3,), (2, 5), (2, 1, 3)])
@pytest.mark.parametrize("eps", [1e-6, 1e-5, 1e-2])
def test_leading_dims_and_eps(device, leading, eps, add):
    shape = leading + (96,)
    x, r, _ = inputs(shape, mx.float32, 4, add, scale=0.05)  # small rms: eps matters
    w = random((96,), mx.float32, 5)
    check(x, w, eps, device, r=r)


@pytest.mark.parametrize(
    "x_dtype,r_dtype,w_dtype",
    # (x, w) of rms_norm, then (x, residual, w) of add_rms_norm
    [("bfloat16", None, "float32"), ("float16", None, "float32"), ("float32", None, "bfloat16"),
     ("float16", None, "bfloat16"), ("bfloat16", None, "float16"),
     ("bfloat16", "bfloat16", "float32"), ("bfloat16", "float32", "bfloat16"),
     ("float16", "float16", "float32"), ("float32", "bfloat16", "float32")],
)
def test_mixed_dtypes(device, x_dtype, r_dtype, w_dtype):
    add = r_dtype is not None
    x, r, w = inputs((7, 256), DTYPES[x_dtype], 7, add, w_dtype=DTYPES[w_dtype],
                     r_dtype=DTYPES[r_dtype] if add else None)
    check(x, w, EPS, device, r=r)


@pytest.mark.parametrize("add", ADD)
@pytest.mark.parametrize("rows", [0, 1])
@pytest.mark.parametrize("n", [1, 64, 4099])
def test_zero_and_one_row(device, rows, n, add):
    x, r, w = inputs((rows, n), mx.bfloat16, 10, add)
    _, _, _, gw = check(x, w, EPS, device, r=r)
    if rows == 0:
        assert np.all(np.array(gw.astype(mx.float32)) == 0)


@pytest.mark.parametrize("add", ADD)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", [(4, 3, 200), (3, 4, 96)], ids=str)
def test_no_weight(device, dtype, shape, add):
    x, r, _ = inputs(shape, DTYPES[dtype], 13, add)
    check(x, None, EPS, device, r=r)


@pytest.mark.parametrize("add", ADD)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", [(6, 200), (3, 4, 96)], ids=str)
def test_offset(device, dtype, shape, add):
    # Gemma's stored weights are offsets from 1: small
    t = DTYPES[dtype]
    x, r, _ = inputs(shape, t, 46, add)
    check(x, random(shape[-1:], t, 47, 0.3), EPS, device, r=r, offset=1.0)


@pytest.mark.parametrize("add", ADD)
def test_one_dimensional_x(device, add):
    x, r, _ = inputs((300,), mx.float32, 15, add)
    check(x, random((300,), mx.float32, 16), EPS, device, r=r)


def test_strided_broadcast_and_sliced_inputs(device):
    base = random((6, 2 * 130), mx.float32, 18)
    x = base[:, ::2]  # strided rows
    xt = random((130, 6), mx.float32, 19).T  # transposed
    xs = random((6 * 130 + 3,), mx.bfloat16, 20)[3:].reshape(6, 130)  # offset
    w = mx.broadcast_to(mx.array(1.5), (130,))  # stride-0 weight
    g = random((6, 130), mx.float32, 21)
    for xi in (x, xt):
        check(xi, w, EPS, device, gy=g)
    check(xs, w.astype(mx.bfloat16), EPS, device, gy=g.astype(mx.bfloat16))


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
        y = mlx_rmsnorm.rms_norm(x, w, EPS, stream=device)
        assert "Contiguous" not in graph_text(y) and "Copy" not in graph_text(y), name
        check(x, w, EPS, device, gy=g)
        with mx.stream(device):
            gx, gw = mx.grad(lambda x, w: (mlx_rmsnorm.rms_norm(x, w, EPS) * g).sum(), argnums=(0, 1))(x, w)
        ref_gx, ref_gw = rms_backward(x, w, g, EPS)
        assert rel_err(gx, ref_gx, gx_scale(x, w, g, EPS)) <= TOL[mx.float32], name
        assert rel_err(gw, ref_gw) <= TOL[mx.float32], name


# The fused add's own paths: several persistent units and their gw partials,
# the long rows' plans, views off 16-byte alignment, strided inputs.


@pytest.mark.parametrize("n", [64, 1024, 4096, 5000])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_add_many_rows(device, dtype, n):
    t = DTYPES[dtype]
    check(random((600, n), t, 10), random((n,), t, 12, 0.5, 1.0), EPS, device, r=random((600, n), t, 11))


@pytest.mark.parametrize(
    "shape,x_dtype,w_dtype",
    [((3, 16384), "bfloat16", "bfloat16"),  # the last persistent row (bulk copies)
     ((3, 16384), "bfloat16", "float32"),  # fp32 g: the stages no longer fit, split plan
     ((2, 40000), "bfloat16", "bfloat16"),  # past one SM: cluster rows from sm_90, else looped / split
     ((2, 1000), "float16", "float16"),
     ((9, 136), "bfloat16", "bfloat16")],
)
def test_add_long_and_planless_rows(device, shape, x_dtype, w_dtype):
    x, r = random(shape, DTYPES[x_dtype], 60), random(shape, DTYPES[x_dtype], 61)
    check(x, random(shape[-1:], DTYPES[w_dtype], 62, 0.5, 1.0), EPS, device, r=r, offset=0.5)


def test_add_misaligned_views(device):
    # views starting one element in: not 16-byte aligned
    base = random((4, 1025), mx.bfloat16, 63)
    x, r = base[:, 1:], random((4, 1025), mx.bfloat16, 64)[:, 1:]
    check(x, random((1024,), mx.bfloat16, 65, 0.5, 1.0), EPS, device, r=r)


def test_add_strided_inputs(device):
    base = random((16, 8, 130), mx.float32, 18)
    x = base.transpose(1, 0, 2)[:, :, 1:129]  # transposed and sliced
    r = random((8, 16, 256), mx.float32, 19)[:, :, ::2]  # strided last axis
    w = random((256,), mx.float32, 20, 0.5, 1.0)[::2]
    y, h, gx, gw = check(x, w, EPS, device, r=r)
    yc, hc, gxc, gwc = check(mx.array(np.array(x)), mx.array(np.array(w)), EPS, device, r=mx.array(np.array(r)))
    assert np.array_equal(np.array(y), np.array(yc)) and np.array_equal(np.array(gx), np.array(gxc))


# --- against the built-in (the composition, with the add) -----------------------------


def unfused(x, r, w, eps, offset=0.0):
    """MLX's composition: [y] of mx.fast.rms_norm(x, w + offset), or [y, h]
    of h = x + r first."""
    h = x if r is None else x + r
    if w is None:
        y = BUILTIN_RMS_NORM(h, None, eps)
    else:
        scale = w.astype(mx.float32) + offset if offset else w
        y = BUILTIN_RMS_NORM(h, scale, eps).astype(mx.result_type(h.dtype, w.dtype))
    return [y] if r is None else [y, h]


def ours(x, r, w, eps, offset=0.0):
    if r is None:
        return [mlx_rmsnorm.rms_norm(x, w, eps, offset=offset)]
    return list(mlx_rmsnorm.add_rms_norm(x, r, w, eps, offset=offset))


@pytest.mark.parametrize("add", ADD)
@pytest.mark.parametrize("offset", OFFSET)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", [(9, 512), (2, 9, 384)], ids=str)
def test_against_the_builtin(device, dtype, offset, add, shape):
    t = DTYPES[dtype]
    n = shape[-1]
    x = random(shape, t, 13)
    r = random(shape, t, 14) if add else None
    w = random((n,), t, 15, 0.5, 0.0 if offset else 1.0)
    cots = [random(shape, t, 16)] + ([random(shape, t, 17)] if add else [])
    primals = [x] + ([r] if add else []) + [w]

    def split(a):
        return a[0], (a[1] if add else None), a[-1]

    with mx.stream(device):
        outs_f, grads_f = mx.vjp(lambda *a: ours(*split(a), EPS, offset), primals, cots)
        outs_p, grads_p = mx.vjp(lambda *a: unfused(*split(a), EPS, offset), primals, cots)
        mx.eval(outs_f, grads_f, outs_p, grads_p)
    if add:
        assert np.array_equal(to_numpy(outs_f[1]), to_numpy(outs_p[1]))  # h
    assert outs_f[0].dtype == outs_p[0].dtype
    assert rel_err(outs_f[0], to_numpy(outs_p[0])) <= TOL[t]
    for a, b in zip(grads_f, grads_p, strict=True):  # x, (residual,) weight
        # the built-in may round its own partials: allow two roundings
        assert a.dtype == b.dtype
        assert rel_err(a, to_numpy(b)) <= 2 * TOL[t]


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
    ref_gx, ref_gw = rms_backward(x, w, g, 0.0)
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


# --- Gemma's accuracy with offset= -----------------------------------------------


def gemma_errors(shape=(64, 2048), seed=60):
    """Max |error| of bf16 Gemma norm outputs against float64 of the same bf16
    inputs, in units of one bf16 rounding of the output (ulp/2 at |ref|):
    ours (offset in fp32) and the built-in path (1.0 + w rounded to bf16)."""
    x = random(shape, mx.bfloat16, seed, 2.0)
    # Gemma's stored weights are offsets from 1: small, many of them below
    # bf16's resolution of 1 + w.
    w = random(shape[-1:], mx.bfloat16, seed + 1, 0.05)
    ours = mlx_rmsnorm.rms_norm(x, w, 1e-6, offset=1.0, stream=mx.cpu)
    builtin = mx.fast.rms_norm(x, 1.0 + w, 1e-6, stream=mx.cpu)
    xd = to_numpy(x)
    ref = xd / np.sqrt(np.mean(xd * xd, axis=-1, keepdims=True) + 1e-6) * (to_numpy(w) + 1.0)
    half_ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(ref), 1e-30))) - 8)
    err = lambda out: float(np.max(np.abs(to_numpy(out) - ref) / half_ulp))  # noqa: E731
    rel = lambda out: float(np.max(np.abs(to_numpy(out) - ref)) / np.max(np.abs(ref)))  # noqa: E731
    return err(ours), err(builtin), rel(ours), rel(builtin)


def test_gemma_offset_is_within_one_rounding_and_closer_than_the_builtin():
    ours, builtin, ours_rel, builtin_rel = gemma_errors()
    print(f"gemma bf16 norm vs float64: ours {ours:.2f} half-ulps (max rel {ours_rel:.2e}), "
          f"built-in with bf16 1+w {builtin:.2f} half-ulps (max rel {builtin_rel:.2e})")
    # one bf16 rounding of the output, plus fp32 accumulation
    assert ours <= 1.05
    assert builtin > ours and builtin_rel > ours_rel


# --- transforms: ours against the built-in (or its composition) -------------------


class Variant:
    """One setting of the switches: the op as a function of its primals
    ([x, w] or [x, residual, w]) returning a list of outputs, ours and MLX's
    composition; `make` gives primals and cotangents of a shape."""

    def __init__(self, add, offset):
        self.add, self.offset = add, offset
        self.id = ("add" if add else "rms") + ("-1+w" if offset else "")

    def ours(self, *a):
        return ours(a[0], a[1] if self.add else None, a[-1], EPS, self.offset)

    def plain(self, *a):
        return unfused(a[0], a[1] if self.add else None, a[-1], EPS, self.offset)

    def make(self, shape, seed=30, rows=None):
        if rows is not None:
            shape = (rows,) + shape[1:]
        x = random(shape, mx.float32, seed)
        r = [random(shape, mx.float32, seed + 1)] if self.add else []
        w = random(shape[-1:], mx.float32, seed + 2, 0.5, 0.0 if self.offset else 1.0)
        cots = [random(shape, mx.float32, seed + 3)] + ([random(shape, mx.float32, seed + 4)] if self.add else [])
        return [x, *r, w], cots

    def loss(self, fn, cots):
        return lambda *a: sum((o * c).sum() for o, c in zip(fn(*a), cots))


VARIANTS = [Variant(add, offset) for add in (False, True) for offset in (0.0, 1.0)]
VARIANT_PARAMS = [pytest.param(v, id=v.id) for v in VARIANTS]
SHAPE = (4, 6, 48)


def close(a, b, tol=2e-5):
    a, b = np.array(a), np.array(b)
    scale = max(np.max(np.abs(b)), 1e-30)
    assert np.max(np.abs(a - b)) / scale <= tol, np.max(np.abs(a - b)) / scale


def _as_list(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


@pytest.mark.parametrize("v", VARIANT_PARAMS)
def test_grad_value_and_grad_and_compile(device, v):
    primals, cots = v.make(SHAPE)
    mine, theirs = v.loss(v.ours, cots), v.loss(v.plain, cots)
    every = tuple(range(len(primals)))
    with mx.stream(device):
        for argnums in [*every, every]:
            want = _as_list(mx.grad(theirs, argnums=argnums)(*primals))
            for fn in (mx.grad(mine, argnums=argnums), mx.compile(mx.grad(mine, argnums=argnums)),
                       mx.compile(mx.grad(mine, argnums=argnums), shapeless=True)):
                for a, b in zip(_as_list(fn(*primals)), want, strict=True):
                    close(a, b)
        (va, ga), (vb, gb) = (mx.value_and_grad(f)(*primals) for f in (mine, theirs))
        close(va, vb)
        close(ga, gb)
        for shapeless in (False, True):
            f = mx.compile(mx.value_and_grad(mine, argnums=every), shapeless=shapeless)
            (va, gas) = f(*primals)
            (vb, gbs) = mx.value_and_grad(theirs, argnums=every)(*primals)
            close(va, vb)
            for a, b in zip(gas, gbs, strict=True):
                close(a, b)
        # a new row count reuses the shapeless graph
        fn = mx.compile(v.ours, shapeless=True)
        fn(*primals)
        again, _ = v.make(SHAPE, seed=35, rows=3)
        for a, b in zip(fn(*again), v.plain(*again), strict=True):
            close(a, b)


@pytest.mark.parametrize("v", VARIANT_PARAMS)
def test_vjp_and_jvp(device, v):
    primals, cots = v.make(SHAPE)
    tans = [random(a.shape, mx.float32, 40 + i) for i, a in enumerate(primals)]
    with mx.stream(device):
        for a, b in zip(mx.vjp(v.ours, primals, cots)[1], mx.vjp(v.plain, primals, cots)[1], strict=True):
            close(a, b)
        _, got = mx.jvp(v.ours, primals, tans)
        _, want = mx.jvp(v.plain, primals, tans)
    for a, b in zip(got, want, strict=True):
        # (rms_norm's jvp has been held to 1e-4 against the built-in's)
        close(a, b, 2e-5 if v.add else 1e-4)


# (add, in_axes, shapes of x, residual and weight)
VMAP_CASES = [
    (False, (0, None), (4, 6, 48), None, (48,)),
    (False, (1, None), (4, 6, 48), None, (48,)),
    (False, (2, None), (4, 6, 48), None, (6,)),  # the batch is x's last axis: rows of 6
    (False, (0, 0), (4, 6, 48), None, (4, 48)),
    (True, (0, 0, None), (3, 5, 32), (3, 5, 32), (32,)),
    (True, (1, None, None), (5, 3, 32), (5, 32), (32,)),
    (True, (None, 2, None), (5, 32), (5, 32, 3), (32,)),
    (True, (0, 0, 0), (3, 5, 32), (3, 5, 32), (3, 32)),
]


@pytest.mark.parametrize("add,in_axes,x_shape,r_shape,w_shape", VMAP_CASES,
                         ids=[("add" if c[0] else "rms") + str(c[1]) for c in VMAP_CASES])
def test_vmap(device, add, in_axes, x_shape, r_shape, w_shape):
    v = Variant(add, 0.0)
    args = [random(x_shape, mx.float32, 43)] + ([random(r_shape, mx.float32, 44)] if add else []) \
        + [random(w_shape, mx.float32, 45, 0.5, 1.0)]
    with mx.stream(device):
        got = mx.vmap(v.ours, in_axes=in_axes)(*args)
        want = mx.vmap(v.plain, in_axes=in_axes)(*args)
    for a, b in zip(got, want, strict=True):
        close(a, b)


@pytest.mark.parametrize("v", VARIANT_PARAMS)
def test_vmap_of_grad(device, v):
    primals, cots = v.make(SHAPE)
    cots = [c[0] for c in cots]
    mine, theirs = v.loss(v.ours, cots), v.loss(v.plain, cots)
    axes = (0,) * (len(primals) - 1) + (None,)
    with mx.stream(device):
        a = mx.vmap(mx.grad(mine), in_axes=axes)(*primals)
        b = mx.vmap(mx.grad(theirs), in_axes=axes)(*primals)
    close(a, b)


@pytest.mark.parametrize("v", VARIANT_PARAMS)
def test_second_order(device, v):
    primals, cots = v.make(SHAPE)
    mine, theirs = v.loss(v.ours, cots), v.loss(v.plain, cots)
    every = tuple(range(len(primals)))

    def grad_norm(loss):
        return lambda *a: sum((t * t).sum() for t in mx.grad(loss, argnums=every)(*a))

    with mx.stream(device):
        a = mx.grad(grad_norm(mine), argnums=every)(*primals)
        b = mx.grad(grad_norm(theirs), argnums=every)(*primals)
        # and d/dx of |d/dx|^2 alone
        c = mx.grad(lambda x: (mx.grad(mine)(x, *primals[1:]) ** 2).sum())(primals[0])
        d = mx.grad(lambda x: (mx.grad(theirs)(x, *primals[1:]) ** 2).sum())(primals[0])
    for ai, bi in zip([*a, c], [*b, d], strict=True):
        close(ai, bi, 1e-4)


def test_vjp_primitive_is_differentiable(device):
    (x, w), (g,) = Variant(False, 0.0).make(SHAPE)
    with mx.stream(device):
        def f(x, w):
            gx, gw = mlx_rmsnorm.rms_norm_vjp(x, w, g, EPS)
            return (gx * gx).sum() + (gw * gw).sum()

        def f_ref(x, w):
            _, (gx, gw) = mx.vjp(lambda x, w: BUILTIN_RMS_NORM(x, w, EPS), [x, w], [g])
            return (gx * gx).sum() + (gw * gw).sum()

        for a, b in zip(mx.grad(f, argnums=(0, 1))(x, w), mx.grad(f_ref, argnums=(0, 1))(x, w)):
            close(a, b, 1e-4)


def test_module_dropin(device):
    ours_, theirs = mlx_rmsnorm.RMSNorm(64, eps=1e-6), nn.RMSNorm(64, eps=1e-6)
    assert ours_.weight.dtype == theirs.weight.dtype == mx.float32
    assert ours_.eps == theirs.eps
    theirs.update({"weight": random((64,), mx.float32, 36)})
    ours_.load_weights(list(theirs.parameters().items()))  # checkpoints load as they are
    x = random((2, 5, 64), mx.bfloat16, 37)
    with mx.stream(device):
        a, b = ours_(x), theirs(x)
        assert a.dtype == b.dtype == mx.float32
        close(a, b, 1e-5)

        def loss(model, x):
            return (model(x) ** 2).sum()

        ga = nn.value_and_grad(ours_, loss)(ours_, x)[1]["weight"]
        gb = nn.value_and_grad(theirs, loss)(theirs, x)[1]["weight"]
        close(ga, gb, 1e-4)


# --- no gw work when the weight gets no gradient -------------------------------


def vjp_node_outputs(out, label="RMSNormPluginVJP"):
    """Number of outputs of each `label` node in the graph of `out` (one: gx
    only; two: gx and gw); an int for a graph with a single node."""
    text = graph_text(out)
    ids = re.findall(rf'\{{ (\d+) \[label ="{label}"', text)
    assert ids, text
    counts = [len(re.findall(rf"^{i} -> ", text, flags=re.M)) for i in ids]
    return counts[0] if len(counts) == 1 else counts


@pytest.mark.parametrize("add", ADD)
def test_grad_wrt_x_only_builds_no_gw(device, add):
    v = Variant(add, 0.0)
    primals, cots = v.make(SHAPE)
    mx.eval(primals, cots)
    label = "AddRMSNormPluginVJP" if add else "RMSNormPluginVJP"
    wi = len(primals) - 1
    # rms_norm through mx.fast.rms_norm: what patch() routes to the plugin
    fn = v.ours if add else (lambda x, w: [mx.fast.rms_norm(x, w, EPS)])
    with mx.stream(device), mlx_rmsnorm.patched():
        loss = v.loss(fn, cots)
        gx = mx.grad(loss, argnums=0)(*primals)
        assert vjp_node_outputs(gx, label) == 1
        gx_both, gw = mx.grad(loss, argnums=(0, wi))(*primals)
        assert vjp_node_outputs(gw, label) == 2
        close(gx, gx_both, 0)  # the same kernel, the same bits
        # mx.vjp with respect to x alone: gx, of x's shape
        (vjp,) = mx.vjp(lambda x: fn(x, *primals[1:]), [primals[0]], cots)[1]
        assert vjp.shape == primals[0].shape
    ref = mx.grad(v.loss(v.plain, cots))(*primals)
    close(gx, ref)


def test_rms_norm_vjp_need_gw_false(device):
    (x, w), (g,) = Variant(False, 0.0).make(SHAPE)
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


@pytest.mark.parametrize("case", list(SHAPELESS))
def test_shapeless_compile_under_patch(device, case):
    weight64, make_inputs, fn = SHAPELESS[case]
    is_f64 = case.endswith("float64")
    if is_f64 and device != mx.cpu:
        pytest.skip("float64 runs on the CPU stream only (the built-in's too)")
    compiled = mx.compile(fn, shapeless=True)
    with mx.stream(device):
        for rows in (4, 7):  # the second row count reuses the shapeless graph
            args = make_inputs(rows)
            with mlx_rmsnorm.patched():
                mine = _as_list(compiled(*args))
            theirs = _as_list(fn(*args))  # unpatched: the built-in
            for a, b in zip(mine, theirs, strict=True):
                assert a.shape == b.shape and a.dtype == b.dtype
                close(a, b, 1e-4 if case == "grad of grad" else 2e-6)
            if is_f64:
                # ours normalizes in float64 (the built-in in fp32 and casts);
                # eps reaches both ops as a float32 (1e-5 + 2.5e-13), hence
                # not 1e-15
                ref = rms_forward(args[0], weight64, EPS)
                assert np.max(np.abs(np.array(mine[0]) - ref)) <= 1e-11 * np.max(np.abs(ref))


# --- the transform contract: empty arrays and values, against float64 by complex
# steps (norm_contract.py) -----------------------------------------------------------

test_under_every_transform, test_add_broadcasts_like_x_plus_residual = family_contract_tests(
    ["rms_norm", "add_rms_norm", "rms_norm_vjp", "add_rms_norm_vjp"], "add_rms_norm")


def test_add_broadcast_h_is_the_full_shape():
    x, r = mx.ones((3, 8)), mx.arange(8, dtype=mx.float32)
    y, h = _ext.add_rms_norm(r, x, None, EPS)
    assert h.shape == y.shape == (3, 8)
    np.testing.assert_array_equal(np.array(h), np.array(x + r))


# --- export: the file holds MLX ops (the built-in's), and runs as the op ----------


@pytest.mark.parametrize("v", VARIANT_PARAMS)
def test_export_writes_mlx_ops(device, tmp_path, v):
    primals, _ = v.make(SHAPE)
    path = str(tmp_path / "f.mlxfn")
    with mx.stream(device):
        mx.export_function(path, v.ours, *primals)
        with open(path, "rb") as fh:
            assert b"Plugin" not in fh.read()
        for a, b in zip(mx.import_function(path)(*primals), v.ours(*primals), strict=True):
            close(a, b)


@pytest.mark.parametrize("v", VARIANT_PARAMS)
def test_shapeless_export(device, tmp_path, v):
    primals, _ = v.make((2, 40), seed=12)
    path = str(tmp_path / "shapeless.mlxfn")
    with mx.stream(device):
        mx.export_function(path, v.ours, *primals, shapeless=True)
        with open(path, "rb") as fh:
            assert b"Plugin" not in fh.read()
        again, _ = v.make((7, 40), seed=14)
        for a, b in zip(mx.import_function(path)(*again), v.plain(*again), strict=True):
            assert rel_err(a, to_numpy(b)) <= 1e-6


def test_direct_calls_and_exporter_with_several_traces(tmp_path):
    w = random((24,), mx.bfloat16, 8, 0.3, 1.0)
    layer = mlx_rmsnorm.RMSNorm(24)

    def f(x, g):
        y = mlx_rmsnorm.rms_norm(x, w, EPS)
        gx, gw = mlx_rmsnorm.rms_norm_vjp(x, w, g, EPS)
        gx_only, none = mlx_rmsnorm.rms_norm_vjp(x, w, g, EPS, need_gw=False)
        assert none is None
        return y, gx, gw, gx_only, layer(x)

    path = str(tmp_path / "direct.mlxfn")
    xs = [random((3, 24), mx.bfloat16, 9), random((2, 5, 24), mx.bfloat16, 10)]
    gs = [random(x.shape, mx.bfloat16, 11) for x in xs]
    with mx.exporter(path, f) as exporter:
        for x, g in zip(xs, gs):
            exporter(x, g)
    with open(path, "rb") as fh:
        assert b"RMSNormPlugin" not in fh.read()
    imported = mx.import_function(path)
    for x, g in zip(xs, gs):
        for a, b in zip(imported(x, g), f(x, g)):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert rel_err(a, to_numpy(b)) <= 2e-2  # bf16: the built-in's vs our roundings


# --- determinism: the same inputs give the same bits (no atomics anywhere) ---------


@pytest.mark.parametrize("add", ADD)
@pytest.mark.parametrize("shape", [(64, 128), (33, 1000), (5, 4099), (3, 4096), (300, 256), (64, 2880)], ids=str)
def test_repeated_calls_are_bitwise_identical(device, shape, add):
    x, r, w = inputs(shape, mx.bfloat16, 40, add)
    gy, gh = random(shape, mx.bfloat16, 43), random(shape, mx.bfloat16, 44)
    first = None
    for _ in range(5):
        outs = [a for a in run(x, r, w, gy, gh if add else None, EPS, device) if a is not None]
        bits = [np.array(a.view(mx.uint16)) for a in outs]
        if first is None:
            first = bits
        for a, b in zip(bits, first, strict=True):
            assert np.array_equal(a, b)


# --- dtypes: every combination mx.fast.rms_norm accepts works, with the built-in's
# output dtype and the right value; what it refuses, we refuse with the same class
# of error ------------------------------------------------------------------------

X_TYPES = ["float32", "float16", "bfloat16", "float64", "int32", "int8", "uint8", "bool_", "int64", "uint64"]
W_TYPES = [None, "float32", "float16", "bfloat16", "float64", "int32", "int8", "bool_", "uint64", "complex64"]
# Normwise tolerance by the output dtype: float64 is computed in float64 here
# (the built-in normalizes in fp32, so against it float64 gets fp32's).
DTYPE_TOL = {mx.float32: 2e-6, mx.float16: 2e-3, mx.bfloat16: 1.2e-2, mx.float64: 1e-12}
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
    assert rel_err(np.array(y.astype(mx.float64)), ref) <= DTYPE_TOL[out]
    # and against the built-in itself (it rounds x / rstd to fp32 for float64)
    tol_builtin = 2e-6 if out == mx.float64 else 2 * DTYPE_TOL[out]
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
        tol = 2 * max(DTYPE_TOL[mx.result_type(x, w)], DTYPE_TOL[a.dtype])
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
    ref_gx, ref_gw = rms_backward(x.astype(mx.float16), w, g, 1e-5)
    assert rel_err(gw, ref_gw) <= DTYPE_TOL[mx.float16]
    assert rel_err(gx, ref_gx) <= 2 * DTYPE_TOL[mx.float16]


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
        tol = 1e-12 if w.dtype == mx.float64 else DTYPE_TOL[w.dtype]
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
    assert rel_err(y, to_numpy(b)) <= 2 * DTYPE_TOL[y.dtype]


def test_add_float64_runs_the_reference():
    # float64 exists on the CPU stream only (a GPU-stream cast raises at graph
    # build; the device run caught this test building it on the default GPU)
    x = random((4, 33), mx.float32, 21).astype(mx.float64, stream=mx.cpu)
    r = random((4, 33), mx.float32, 22).astype(mx.float64, stream=mx.cpu)
    w = random((33,), mx.float32, 23).astype(mx.float64, stream=mx.cpu)
    y, h = mlx_rmsnorm.add_rms_norm(x, r, w, EPS, offset=1.0, stream=mx.cpu)
    hd = np.array(x) + np.array(r)
    ref = hd / np.sqrt(np.mean(hd * hd, axis=-1, keepdims=True) + EPS) * (np.array(w) + 1.0)
    assert y.dtype == h.dtype == mx.float64
    assert np.max(np.abs(np.array(y) - ref)) <= 1e-12 * np.max(np.abs(ref))


@pytest.mark.parametrize(
    "x_dtype,r_dtype,w_dtype",
    [("int32", "int32", "float32"), ("int8", "bool_", "bfloat16"), ("bool_", "bool_", "float16"),
     ("int32", "float32", None), ("float16", "float64", "float32"), ("bfloat16", "bfloat16", "float64")],
)
def test_add_every_dtype_rms_norm_accepts(x_dtype, r_dtype, w_dtype):
    # as the composition x + residual, then rms_norm: integer and bool inputs
    # are added by MLX and cast by the norm; float64 runs in float64 (CPU)
    rng = np.random.default_rng(70)
    x, r = of_dtype(rng, x_dtype, (3, 40)), of_dtype(rng, r_dtype, (3, 40))
    w = of_dtype(rng, w_dtype, (40,)) if w_dtype else None
    with mx.stream(mx.cpu):
        y, h = mlx_rmsnorm.add_rms_norm(x, r, w, EPS, stream=mx.cpu)
        want_h = x + r
        want_y = mlx_rmsnorm.rms_norm(want_h, w, EPS, stream=mx.cpu)
        mx.eval(y, h, want_y, want_h)
    assert h.dtype == want_h.dtype and y.dtype == want_y.dtype
    assert mx.array_equal(h, want_h).item()
    hd = np.array(want_h.astype(mx.float64, stream=mx.cpu), dtype=np.float64)
    ref = hd / np.sqrt(np.mean(hd * hd, axis=-1, keepdims=True) + EPS)
    if w is not None:
        ref = ref * np.array(w.astype(mx.float64, stream=mx.cpu), dtype=np.float64)
    assert_normwise_close(y, ref)


# --- errors: misuse raises a clear Python exception that names the op and the
# argument by the name the user gave it ----------------------------------------------

_x = mx.ones((3, 8))
_w = mx.ones((8,))
_x4 = mx.ones((4, 8))


@pytest.mark.parametrize(
    "call,says,never",
    [
        # rms_norm / rms_norm_vjp
        (lambda: mlx_rmsnorm.rms_norm(mx.array(1.0), None, EPS), "at least 1 dimension", None),
        (lambda: _ext.rms_norm(mx.array(1.0), None, EPS), lit("[rms_norm] x must have at least 1 dimension"),
         None),
        (lambda: mlx_rmsnorm.rms_norm(_x4, mx.ones((3,)), EPS), "x has 8 and weight has 3", None),
        (lambda: mlx_rmsnorm.rms_norm(_x4, mx.ones((1, 8)), EPS), "1 dimension but has 2", None),
        (lambda: mlx_rmsnorm.rms_norm(_x4.astype(mx.int32), None, EPS), "unsupported type int32", None),
        (lambda: mlx_rmsnorm.rms_norm(_x4.astype(mx.int8), _w.astype(mx.int8), EPS), "unsupported type int8", None),
        (lambda: mlx_rmsnorm.rms_norm(_x4.astype(mx.complex64), None, EPS), "unsupported type complex64", None),
        (lambda: mlx_rmsnorm.rms_norm(mx.zeros((2, 8)), None, EPS, offset=1.0), "offset", None),
        (lambda: mlx_rmsnorm.rms_norm_vjp(_x4, _w, mx.ones((4, 7)), EPS), "g must have the shape of x", None),
        (lambda: mlx_rmsnorm.rms_norm_vjp(_x4, mx.ones((9,)), _x4, EPS), "x has 8 and weight has 9", None),
        (lambda: mlx_rmsnorm.rms_norm_vjp(_x4, _w, _x4.astype(mx.int32), EPS), "floating array but has dtype int32",
         None),
        (lambda: mlx_rmsnorm.rms_norm_vjp(_x4, _w, _x4, EPS, algorithm="fast"), "algorithm must be one of", None),
        (lambda: _ext.rms_norm_vjp(mx.array(1.0), None, mx.array(1.0), EPS),
         lit("[rms_norm_vjp] x must have at least 1 dimension"), None),
        # add_rms_norm / add_rms_norm_vjp
        (lambda: mlx_rmsnorm.add_rms_norm(mx.zeros((2, 8)), mx.zeros((2, 4)), None, EPS), "residual", None),
        (lambda: mlx_rmsnorm.add_rms_norm(mx.zeros((2, 8)), mx.zeros((2, 8)), mx.zeros((4,)), EPS), "weight", None),
        (lambda: mlx_rmsnorm.add_rms_norm(mx.zeros((2, 8)), mx.zeros((2, 8)), None, EPS, offset=1.0), "offset",
         None),
        (lambda: mlx_rmsnorm.add_rms_norm(mx.zeros((2, 8), mx.int32), mx.zeros((2, 8), mx.int32), None, EPS),
         "floating", None),
        (lambda: _ext.add_rms_norm(_x.astype(mx.int32), _x.astype(mx.int32), None, EPS),
         lit("[add_rms_norm] Received unsupported type int32"), "weight"),
        (lambda: _ext.add_rms_norm(_x, mx.ones((2, 8)), None, EPS),
         lit("[add_rms_norm] x of shape (3, 8) and residual of shape (2, 8) do not broadcast"), None),
        (lambda: _ext.add_rms_norm(_x, _x, mx.ones((3,)), EPS),
         lit("[add_rms_norm] weight must be 1-D of the size of the last dimension of x + residual (8)"), None),
        (lambda: _ext.add_rms_norm(mx.array(1.0), mx.array(2.0), None, EPS),
         lit("[add_rms_norm] x + residual must have at least 1 dimension"), None),
        (lambda: _ext.add_rms_norm_vjp(_x, mx.ones((4,)), _x, _x, EPS),
         lit("[add_rms_norm_vjp] weight must have the same size as the last dimension of h, but h has 8"), " x"),
        (lambda: _ext.add_rms_norm_vjp(mx.array(1.0), None, mx.array(1.0), mx.array(1.0), EPS),
         lit("[add_rms_norm_vjp] h must have at least 1 dimension"), None),
        (lambda: _ext.add_rms_norm_vjp(_x, _w, _x, _x[:2], EPS),
         lit("[add_rms_norm_vjp] g_h must have the shape of h (3, 8) but has shape (2, 8)"), "g_y"),
        (lambda: _ext.add_rms_norm_vjp(_x, _w, _x.astype(mx.int32), _x, EPS),
         lit("[add_rms_norm_vjp] g_y must be a floating array but has dtype int32"), "g_h"),
        (lambda: _ext.add_rms_norm_vjp(_x.astype(mx.int32), None, _x, _x, EPS),
         lit("[add_rms_norm_vjp] Received unsupported type int32 (the result type of h int32)"), "weight"),
    ],
)
def test_errors_name_the_op_and_the_argument(call, says, never):
    with pytest.raises(ValueError) as e:
        call()
    assert re.search(says, str(e.value)), str(e.value)
    if never is not None:
        assert never not in str(e.value)


def test_wrong_argument_types_raise_type_error():
    with pytest.raises(TypeError):
        mlx_rmsnorm.rms_norm([1.0, 2.0], None, EPS)
    with pytest.raises(TypeError):
        mlx_rmsnorm.rms_norm(_x4, _w, "eps")
    with pytest.raises(TypeError):
        mlx_rmsnorm.rms_norm(_x4, _w, EPS, stream="cuda")


@pytest.mark.skipif(mlx_rmsnorm.has_cuda_kernels(), reason="CPU-flavor build only")
def test_gpu_stream_without_kernels_is_a_clear_error():
    if not mx.is_available(mx.gpu):
        with pytest.raises((ValueError, RuntimeError)):
            mx.eval(mlx_rmsnorm.rms_norm(_x4, _w, EPS, stream=mx.gpu))


def test_gpu_family_without_kernels_or_device():
    if not mlx_rmsnorm.has_cuda_kernels():
        assert mlx_rmsnorm.gpu_family() == 0
    else:
        with pytest.raises(RuntimeError, match="no CUDA device"):
            mlx_rmsnorm.gpu_family(1000)


# --- property tests (hypothesis): random shapes biased to the launch-plan
# boundaries, dtypes and mixed dtypes, eps, no weight, and non-contiguous or
# misaligned layouts, against the float64 reference.
#
# Profiles: "ci" (default; 40 cases per dtype and device, small, quick on a
# CPU) and "gpu" (1000 cases per dtype, larger, GPU stream only):
# MLX_RMSNORM_HYPOTHESIS_PROFILE=gpu. ---------------------------------------------------

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    given = None

PROFILE = os.environ.get("MLX_RMSNORM_HYPOTHESIS_PROFILE", "ci")
MAX_ELEMS = 2_000_000 if PROFILE == "gpu" else 60_000
# Row lengths at and around every table threshold (in elements: 8 per
# 16-byte vector for 2-byte dtypes, 4 for float32) and past the tables.
_EDGES = sorted({e * k + d for e in (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
                 for k in (4, 8) for d in (-1, 0, 1, 8) if e * k + d > 0})
PROPERTY_DTYPES = [mx.float32, mx.float16, mx.bfloat16]


def make_problem(dtype, w_kind, m, n, layout, eps, seed):
    rng = np.random.default_rng(seed)

    def arr(shape, scale=1.0, offset=0.0, as_dtype=dtype):
        return mx.array((rng.standard_normal(shape) * scale + offset).astype(np.float32)).astype(as_dtype)

    if layout == "transposed":
        x = arr((n, m)).T
    elif layout == "offset":  # breaks 16-byte alignment of the rows
        x = arr((m * n + 1,))[1:].reshape(m, n)
    elif layout == "strided":
        x = arr((m, 2 * n))[:, ::2]
    else:
        x = arr((m, n))
    w = None if w_kind == "none" else arr((n,), 0.5, 1.0, dtype if w_kind == "same" else mx.float32)
    out_type = mx.result_type(x.dtype, w.dtype) if w is not None else x.dtype
    g = arr((m, n), as_dtype=out_type)
    return x, w, g, out_type


if given is not None:
    settings.register_profile("ci", max_examples=40, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("gpu", max_examples=1000, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(PROFILE)

    @st.composite
    def problems(draw, dtype):
        w_kind = draw(st.sampled_from(["same", "float32", "none"]))
        n = draw(st.one_of(st.sampled_from(_EDGES), st.integers(1, 300),
                           st.integers(1, 300_000 if PROFILE == "gpu" else 20_000)))
        m = draw(st.one_of(st.integers(0, 3), st.integers(0, max(0, MAX_ELEMS // n))))
        m = min(m, MAX_ELEMS // n)
        layout = draw(st.sampled_from(["contiguous", "transposed", "offset", "strided"]))
        if layout == "transposed" and m * n > 1_000_000:
            layout = "contiguous"
        eps = draw(st.sampled_from([1e-6, 1e-5, 1e-3]))
        seed = draw(st.integers(0, 2**31 - 1))
        return dtype, w_kind, m, n, layout, eps, seed

    def _property_test(fn):
        return given(data=st.data())(fn)
else:  # pragma: no cover
    def _property_test(fn):
        return pytest.mark.skip(reason="needs hypothesis")(fn)


@pytest.mark.parametrize("dtype", PROPERTY_DTYPES, ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("device", DEVICES)
@_property_test
def test_random_problems_match_float64(device, dtype, data):
    if PROFILE == "gpu" and device == mx.cpu:
        pytest.skip("the gpu profile is for the GPU stream (CI covers the CPU)")
    problem = data.draw(problems(dtype))
    dtype, w_kind, m, n, layout, eps, seed = problem
    x, w, g, out_type = make_problem(*problem)
    y = mlx_rmsnorm.rms_norm(x, w, eps, stream=device)
    gx, gw = mlx_rmsnorm.rms_norm_vjp(x, w, g, eps, stream=device)
    mx.eval(y, gx, gw)
    assert rel_err(y, rms_forward(x, w, eps)) <= TOL[out_type]
    ref_gx, ref_gw = rms_backward(x, w, g, eps)
    assert rel_err(gx, ref_gx, gx_scale(x, w, g, eps)) <= TOL[dtype]
    if w is None:
        assert gw is None
    else:
        # summed in fp32 over all rows, rounded once to w's dtype; the fp32
        # sum relative to the size of its terms (H200: 6.2e-6 of |gw| at
        # 2 rows x N = 1 whose terms nearly cancelled)
        assert rel_err(gw, ref_gw, gw_scale(x, g, eps)) <= max(ONE_ROUNDING[w.dtype], 2e-6 * np.sqrt(max(m, 1)))
