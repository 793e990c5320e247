"""add_layer_norm (fused residual add + LayerNorm) and add_layer_norm_vjp:
values and gradients against a float64 NumPy reference and against the
built-in composition (h = x + r; mx.fast.layer_norm(h, w, b)), every dtype and
weight/bias combination, N not a multiple of a vector, broadcast residuals,
strided inputs, transforms, export, determinism and error messages. The
contract at its edges (empty arrays under every transform, complex-step
derivatives) is in test_contract.py."""

import mlx.core as mx
import numpy as np
import pytest
from conftest import (DEVICES, DTYPES, TOL, graph_text, layer_ref_backward, layer_ref_forward, of_dtype, random,
                      rel_err, to_numpy, unbroadcast)
from conftest import LN_COMBO_IDS as COMBO_IDS, LN_COMBOS as COMBOS

import mlx_rmsnorm
from mlx_rmsnorm import _patching

EPS = 1e-5
BUILTIN = _patching.BUILTIN_LAYER_NORM  # MLX's own, even while patched


# --- float64 NumPy reference ----------------------------------------------------


def ref_forward(x, r, w, b, eps, h_dtype):
    """float64 (y, h): h rounded to h's dtype first, as the op stores it."""
    hd = to_numpy((x.astype(mx.float32) + r.astype(mx.float32)).astype(h_dtype))
    return layer_ref_forward(hd, w, b, eps), hd


def ref_backward(hd, w, gy, gh, eps):
    """(gx, gw, gb, scale): gx = g_h + d(layer_norm)/dh; scale is the size of
    the terms gx is made of (g_h and r * g * w), what its error is relative to."""
    gn, gw, gb = layer_ref_backward(hd, w, gy, eps)
    d = hd - hd.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt((d * d).mean(axis=-1, keepdims=True) + eps)
    v = to_numpy(gy) * to_numpy(w) if w is not None else to_numpy(gy)
    scale = max(float(np.max(np.abs(rstd * v))), float(np.max(np.abs(to_numpy(gh)))))
    return to_numpy(gh) + gn, gw, gb, scale


def make(x_shape, r_shape, dtype, with_w, with_b, seed, r_dtype=None, w_dtype=None):
    n = np.broadcast_shapes(x_shape, r_shape)[-1]
    x = random(x_shape, dtype, seed, 1.0, 0.5)
    r = random(r_shape, r_dtype or dtype, seed + 1)
    w = random((n,), w_dtype or dtype, seed + 2, 0.5, 1.0) if with_w else None
    b = random((n,), w_dtype or dtype, seed + 3, 0.5) if with_b else None
    return x, r, w, b


def run(fn, x, r, w, b, gy, gh):
    """(y, h, gx, gr, gw, gb) of fn(x, r, w, b) -> (y, h) through mx.vjp with
    both cotangents; None for an absent weight or bias."""
    primals = [x, r] + [a for a in (w, b) if a is not None]

    def f(*a):
        it = iter(a[2:])
        ww = next(it) if w is not None else None
        bb = next(it) if b is not None else None
        return list(fn(a[0], a[1], ww, bb))

    (y, h), grads = mx.vjp(f, primals, [gy, gh])
    mx.eval(y, h, grads)
    it = iter(grads[2:])
    gw = next(it) if w is not None else None
    gb = next(it) if b is not None else None
    return y, h, grads[0], grads[1], gw, gb


def fused(device):
    return lambda x, r, w, b: mlx_rmsnorm.add_layer_norm(x, r, w, b, EPS, stream=device)


def composition(device):
    """The built-in composition: MLX's add, then mx.fast.layer_norm."""

    def f(x, r, w, b):
        with mx.stream(device):
            h = x + r
            return BUILTIN(h, w, b, EPS), h

    return f


def cotangents(x, r, w, b, seed):
    h_dtype = mx.result_type(x.dtype, r.dtype)
    y_dtype = h_dtype if w is None else mx.result_type(h_dtype, *(a.dtype for a in (w, b) if a is not None))
    shape = np.broadcast_shapes(x.shape, r.shape)
    return random(shape, y_dtype, seed), random(shape, h_dtype, seed + 1), h_dtype, y_dtype


def check(device, x, r, w, b, seed=50):
    """Ours against float64: dtypes, h exact, y, every gradient."""
    gy, gh, h_dtype, y_dtype = cotangents(x, r, w, b, seed)
    y, h, gx, gr, gw, gb = run(fused(device), x, r, w, b, gy, gh)
    assert y.dtype == y_dtype and h.dtype == h_dtype
    ref_y, ref_h = ref_forward(x, r, w, b, EPS, h_dtype)
    assert y.shape == h.shape == ref_h.shape
    assert np.array_equal(to_numpy(h), ref_h)  # the add is one rounding, as unfused
    assert rel_err(y, ref_y) <= TOL[y_dtype]
    ref_gx, ref_gw, ref_gb, scale = ref_backward(ref_h, w, gy, gh, EPS)
    # each input's gradient in its own dtype and shape (summed back where broadcast)
    assert gx.dtype == x.dtype and gr.dtype == r.dtype
    assert rel_err(gx, unbroadcast(ref_gx, x.shape), None if gx.shape != ref_gx.shape else scale) \
        <= 2 * TOL[x.dtype]
    assert rel_err(gr, unbroadcast(ref_gx, r.shape), None if gr.shape != ref_gx.shape else scale) \
        <= 2 * TOL[r.dtype]
    if x.dtype == r.dtype and x.shape == r.shape:
        assert np.array_equal(np.array(gx.astype(mx.float32)), np.array(gr.astype(mx.float32)))
    if w is not None:
        assert gw.dtype == w.dtype and gw.shape == w.shape
        assert rel_err(gw, ref_gw) <= TOL[w.dtype]
    if b is not None:
        assert gb.dtype == b.dtype and gb.shape == b.shape
        assert rel_err(gb, ref_gb) <= TOL[b.dtype]
    return y, h, gx, gr, gw, gb


# --- values and gradients ------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("combo", COMBOS, ids=COMBO_IDS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", [(5, 1), (7, 33), (3, 4, 100), (9, 256), (2, 1000), (130, 1024)],
                         ids=str)
def test_against_float64(device, combo, dtype, shape):
    # N = 1, 33, 100, 1000: not a multiple of 8 (no 16-byte rows; the GPU
    # runs the composition there)
    x, r, w, b = make(shape, shape, DTYPES[dtype], *combo, seed=sum(shape))
    check(device, x, r, w, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("combo", COMBOS, ids=COMBO_IDS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", [(2, 9, 384), (6, 100)], ids=str)
def test_against_the_builtin_composition(device, combo, dtype, shape):
    t = DTYPES[dtype]
    x, r, w, b = make(shape, shape, t, *combo, seed=13)
    gy, gh, _, _ = cotangents(x, r, w, b, 16)
    ours = run(fused(device), x, r, w, b, gy, gh)
    theirs = run(composition(device), x, r, w, b, gy, gh)
    assert np.array_equal(to_numpy(ours[1]), to_numpy(theirs[1]))  # h, bit for bit
    ref_y, ref_h = ref_forward(x, r, w, b, EPS, ours[1].dtype)
    ref_gx, ref_gw, ref_gb, _ = ref_backward(ref_h, w, gy, gh, EPS)
    refs = [ref_y, ref_h, ref_gx, ref_gx, ref_gw, ref_gb]
    # The built-in rounds between its steps (x_hat, * w, + b) and rounds its
    # gradient of h before the add of g_h: a few roundings apart. Where it is
    # farther from float64 than that (its float16 gx at N = 100 on the H200),
    # ours must be at least as close to float64 as the built-in is.
    for o, p, ref in zip(ours, theirs, refs):
        assert (o is None) == (p is None)
        if o is not None:
            assert o.dtype == p.dtype and o.shape == p.shape
            assert rel_err(o, to_numpy(p)) <= 4 * TOL[t] or rel_err(o, ref) <= rel_err(p, ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "x_shape,r_shape",
    [((4, 64), (64,)), ((4, 64), (1, 64)), ((64,), (4, 64)), ((1, 64), (4, 64)),
     ((2, 3, 40), (3, 40)), ((2, 1, 40), (3, 40))],
    ids=str,
)
def test_broadcast_residuals(device, dtype, x_shape, r_shape):
    t = DTYPES[dtype]
    x, r, w, b = make(x_shape, r_shape, t, True, True, seed=20)
    y, h, gx, gr, _, _ = check(device, x, r, w, b)
    assert gx.shape == x.shape and gr.shape == r.shape
    # and as the composition sums them back
    gy, gh, _, _ = cotangents(x, r, w, b, 50)
    theirs = run(composition(device), x, r, w, b, gy, gh)
    assert np.array_equal(to_numpy(h), to_numpy(theirs[1]))
    for o, p in zip((gx, gr), theirs[2:4]):
        assert rel_err(o, to_numpy(p)) <= 4 * TOL[t]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "x_dtype,r_dtype,w_dtype",
    [("bfloat16", "bfloat16", "float32"), ("bfloat16", "float32", "bfloat16"),
     ("float16", "float16", "float32"), ("float32", "bfloat16", "float32")],
)
def test_mixed_dtypes(device, x_dtype, r_dtype, w_dtype):
    x, r, w, b = make((7, 256), (7, 256), DTYPES[x_dtype], True, True, seed=7,
                      r_dtype=DTYPES[r_dtype], w_dtype=DTYPES[w_dtype])
    check(device, x, r, w, b)


@pytest.mark.parametrize("device", DEVICES)
def test_bias_alone_does_not_promote(device):
    # layer_norm's rule: y in h's dtype without a weight, whatever the bias
    x, r, _, _ = make((3, 64), (3, 64), mx.bfloat16, False, False, seed=8)
    b = random((64,), mx.float32, 9)
    y, h = mlx_rmsnorm.add_layer_norm(x, r, None, b, EPS, stream=device)
    assert y.dtype == h.dtype == mx.bfloat16
    assert y.dtype == BUILTIN(x + r, None, b, EPS).dtype
    check(device, x, r, None, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [64, 1000])
def test_many_rows(device, n):
    # enough rows for several blocks of the column sums (gw, gb)
    x, r, w, b = make((600, n), (600, n), mx.bfloat16, True, True, seed=10)
    check(device, x, r, w, b)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_and_misaligned_inputs(device):
    base = random((16, 8, 130), mx.float32, 18)
    x = base.transpose(1, 0, 2)[:, :, 1:129]  # transposed, sliced: off 16 bytes
    r = random((8, 16, 256), mx.float32, 19)[:, :, ::2]  # strided last axis
    w = random((256,), mx.float32, 20, 0.5, 1.0)[::2]
    b = random((128,), mx.float32, 21, 0.5)
    got = check(device, x, r, w, b)
    copies = [mx.array(np.array(a)) for a in (x, r, w, b)]
    want = check(device, *copies)
    for a, c in zip(got, want):
        assert np.array_equal(np.array(a), np.array(c))


def test_cpu_y_is_layer_norm_of_h_bit_for_bit():
    # one row code (layer_norm_cpu.h): the fused y is our layer_norm of the
    # same h, and the fused gx is layer_norm_vjp's gx of h plus g_h
    x, r, w, b = make((6, 300), (6, 300), mx.float32, True, True, seed=22)
    gy, gh = random((6, 300), mx.float32, 23), random((6, 300), mx.float32, 24)
    y, h = mlx_rmsnorm.add_layer_norm(x, r, w, b, EPS, stream=mx.cpu)
    assert mx.array_equal(h, x + r).item()
    assert mx.array_equal(y, mlx_rmsnorm.layer_norm(h, w, b, EPS, stream=mx.cpu)).item()
    gx, gw, gb = mlx_rmsnorm.add_layer_norm_vjp(h, w, b, gy, gh, EPS, stream=mx.cpu)
    lx, lw, lb = mlx_rmsnorm.layer_norm_vjp(h, w, b, gy, EPS, stream=mx.cpu)
    assert mx.array_equal(gw, lw).item() and mx.array_equal(gb, lb).item()
    assert mx.array_equal(gx, lx + gh).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("combo", COMBOS, ids=COMBO_IDS)
def test_vjp_op_is_the_backward_of_the_op(device, combo):
    x, r, w, b = make((5, 96), (5, 96), mx.bfloat16, *combo, seed=25)
    gy, gh, _, _ = cotangents(x, r, w, b, 26)
    y, h, gx, gr, gw, gb = run(fused(device), x, r, w, b, gy, gh)
    vx, vw, vb = mlx_rmsnorm.add_layer_norm_vjp(h, w, b, gy, gh, EPS, stream=device)
    assert mx.array_equal(vx, gx).item() and mx.array_equal(vx, gr).item()
    for o, v in ((gw, vw), (gb, vb)):
        assert (o is None) == (v is None)
        if o is not None:
            assert mx.array_equal(o, v).item()
    # nothing asked, nothing computed
    _, nw, nb = mlx_rmsnorm.add_layer_norm_vjp(h, w, b, gy, gh, EPS, need_gw=False, need_gb=False,
                                               stream=device)
    assert nw is None and nb is None


def test_backward_node_computes_only_what_is_wanted():
    x, r, w, b = make((4, 48), (4, 48), mx.float32, True, True, seed=27)
    gy, gh, _, _ = cotangents(x, r, w, b, 28)

    def loss(x, r, w, b):
        y, h = mlx_rmsnorm.add_layer_norm(x, r, w, b, EPS)
        return (y * gy).sum() + (h * gh).sum()

    gx = mx.grad(loss, argnums=0)(x, r, w, b)
    assert "AddLayerNormPluginVJP" in graph_text(gx)
    # gx alone: one output on the backward node (no column sums)
    (vjp,) = mx.vjp(lambda x: list(mlx_rmsnorm.add_layer_norm(x, r, w, b, EPS)), [x], [gy, gh])[1]
    assert vjp.shape == x.shape
    # gb alone: right, and the same as with every gradient
    gb = mx.grad(loss, argnums=3)(x, r, w, b)
    all_grads = mx.grad(loss, argnums=(0, 1, 2, 3))(x, r, w, b)
    assert mx.array_equal(gb, all_grads[3]).item()
    assert rel_err(gb, to_numpy(gy).sum(axis=0)) <= TOL[mx.float32]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(3, 4096), (300, 256)], ids=str)
def test_repeated_calls_are_bitwise_identical(device, shape):
    x, r, w, b = make(shape, shape, mx.bfloat16, True, True, seed=29)
    gy, gh, _, _ = cotangents(x, r, w, b, 30)
    first = run(fused(device), x, r, w, b, gy, gh)
    for _ in range(2):
        again = run(fused(device), x, r, w, b, gy, gh)
        for a, c in zip(first, again):
            assert np.array_equal(np.array(a.astype(mx.float32)), np.array(c.astype(mx.float32)))


def test_float64_runs_the_reference():
    # float64 exists on the CPU stream only
    x = random((4, 33), mx.float32, 31).astype(mx.float64, stream=mx.cpu)
    r = random((4, 33), mx.float32, 32).astype(mx.float64, stream=mx.cpu)
    w = random((33,), mx.float32, 33).astype(mx.float64, stream=mx.cpu)
    b = random((33,), mx.float32, 34).astype(mx.float64, stream=mx.cpu)
    y, h = mlx_rmsnorm.add_layer_norm(x, r, w, b, EPS, stream=mx.cpu)
    hd = np.array(x) + np.array(r)
    d = hd - hd.mean(axis=-1, keepdims=True)
    ref = d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + EPS) * np.array(w) + np.array(b)
    assert y.dtype == h.dtype == mx.float64
    assert np.max(np.abs(np.array(y) - ref)) <= 1e-12 * np.max(np.abs(ref))


@pytest.mark.parametrize(
    "x_dtype,r_dtype,w_dtype",
    [("int32", "int32", "float32"), ("int8", "bool_", "bfloat16"), ("int32", "float32", None),
     ("float16", "float64", "float32"), ("bfloat16", "bfloat16", "float64")],
)
def test_every_dtype_layer_norm_accepts(x_dtype, r_dtype, w_dtype):
    # as the composition x + residual, then layer_norm
    rng = np.random.default_rng(70)
    x, r = of_dtype(rng, x_dtype, (3, 40)), of_dtype(rng, r_dtype, (3, 40))
    w = of_dtype(rng, w_dtype, (40,)) if w_dtype else None
    b = of_dtype(rng, w_dtype, (40,)) if w_dtype else None
    with mx.stream(mx.cpu):
        y, h = mlx_rmsnorm.add_layer_norm(x, r, w, b, EPS, stream=mx.cpu)
        want_h = x + r
        want_y = mlx_rmsnorm.layer_norm(want_h, w, b, EPS, stream=mx.cpu)
        mx.eval(y, h, want_y, want_h)
    assert h.dtype == want_h.dtype and y.dtype == want_y.dtype
    assert mx.array_equal(h, want_h).item()
    assert mx.array_equal(y, want_y).item()
    hd = np.array(want_h.astype(mx.float64, stream=mx.cpu), dtype=np.float64)
    d = hd - hd.mean(axis=-1, keepdims=True)
    ref = d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + EPS)
    if w is not None:
        ref = ref * np.array(w.astype(mx.float64, stream=mx.cpu)) + np.array(b.astype(mx.float64, stream=mx.cpu))
    tol = 1e-12 if y.dtype == mx.float64 else TOL[y.dtype]
    assert np.max(np.abs(np.array(y.astype(mx.float64, stream=mx.cpu)) - ref)) <= tol * np.max(np.abs(ref))


@pytest.mark.parametrize("device", DEVICES)
def test_no_elements_are_zeros(device):
    # no kernel and no reduction (MLX's stop the process on such arrays on
    # the GPU and can hang on the CPU): zeros of the right shapes
    x = mx.zeros((0, 8))
    y, h = mlx_rmsnorm.add_layer_norm(x, x, mx.ones((8,)), mx.ones((8,)), EPS, stream=device)
    gx, gw, gb = mlx_rmsnorm.add_layer_norm_vjp(x, mx.ones((8,)), mx.ones((8,)), x, x, EPS,
                                                stream=device)
    mx.eval(y, h, gx, gw, gb)
    assert y.shape == h.shape == gx.shape == (0, 8) and gw.shape == gb.shape == (8,)
    assert not np.any(np.array(gw)) and not np.any(np.array(gb))


# --- errors ---------------------------------------------------------------------

_x = mx.ones((3, 8))
_w = mx.ones((8,))


@pytest.mark.parametrize(
    "call,says",
    [
        (lambda: mlx_rmsnorm.add_layer_norm(_x, mx.ones((2, 8)), None, None, EPS),
         "[add_layer_norm] x of shape (3, 8) and residual of shape (2, 8) do not broadcast"),
        (lambda: mlx_rmsnorm.add_layer_norm(_x, _x, mx.ones((3,)), None, EPS),
         "[add_layer_norm] weight must be 1-D of the size of the last dimension of x + residual (8) "
         "but has shape (3,)"),
        (lambda: mlx_rmsnorm.add_layer_norm(_x, _x, _w, mx.ones((2, 8)), EPS),
         "[add_layer_norm] bias must be 1-D of the size of the last dimension of x + residual (8) "
         "but has shape (2, 8)"),
        (lambda: mlx_rmsnorm.add_layer_norm(mx.array(1.0), mx.array(2.0), None, None, EPS),
         "[add_layer_norm] x + residual must have at least 1 dimension"),
        (lambda: mlx_rmsnorm.add_layer_norm(_x.astype(mx.int32), _x.astype(mx.int8), None, None, EPS),
         "[add_layer_norm] Received unsupported type int32 (the result type of x int32 + residual int8)"),
        (lambda: mlx_rmsnorm.add_layer_norm(_x.astype(mx.int32), _x.astype(mx.int32),
                                            _w.astype(mx.int32), _w.astype(mx.int16), EPS),
         "[add_layer_norm] Received unsupported type int32 (the result type of x int32 + residual int32 "
         "and weight int32 and bias int16)"),
        (lambda: mlx_rmsnorm.add_layer_norm_vjp(_x, mx.ones((4,)), None, _x, _x, EPS),
         "[add_layer_norm_vjp] weight must have the same size as the last dimension of h, but h has 8"),
        (lambda: mlx_rmsnorm.add_layer_norm_vjp(_x, _w, mx.ones((4,)), _x, _x, EPS),
         "[add_layer_norm_vjp] bias must have the same size as the last dimension of h, but h has 8"),
        (lambda: mlx_rmsnorm.add_layer_norm_vjp(_x, _w, _w, _x, _x[:2], EPS),
         "[add_layer_norm_vjp] g_h must have the shape of h (3, 8) but has shape (2, 8)"),
        (lambda: mlx_rmsnorm.add_layer_norm_vjp(_x, _w, _w, _x.astype(mx.int32), _x, EPS),
         "[add_layer_norm_vjp] g_y must be a floating array but has dtype int32"),
        (lambda: mlx_rmsnorm.add_layer_norm_vjp(mx.array(1.0), None, None, mx.array(1.0),
                                                mx.array(1.0), EPS),
         "[add_layer_norm_vjp] h must have at least 1 dimension"),
    ],
)
def test_errors_name_the_op_and_the_argument(call, says):
    with pytest.raises(ValueError) as e:
        call()
    assert says in str(e.value)


# --- transforms (every one, and empty arrays, in test_contract.py) ----------------


@pytest.fixture
def data():
    shape = (4, 6, 48)
    return (random(shape, mx.float32, 40), random(shape, mx.float32, 41),
            random((48,), mx.float32, 42, 0.5, 1.0), random((48,), mx.float32, 43, 0.5),
            random(shape, mx.float32, 44), random(shape, mx.float32, 45))


def loss_pair(gy, gh):
    def ours(x, r, w, b):
        y, h = mlx_rmsnorm.add_layer_norm(x, r, w, b, EPS)
        return (y * gy).sum() + (h * gh).sum()

    def plain(x, r, w, b):
        h = x + r
        return (BUILTIN(h, w, b, EPS) * gy).sum() + (h * gh).sum()

    return ours, plain


def close(a, b, tol=2e-5):
    a, b = np.array(a), np.array(b)
    scale = max(np.max(np.abs(b)), 1e-30)
    assert np.max(np.abs(a - b)) / scale <= tol, np.max(np.abs(a - b)) / scale


@pytest.mark.parametrize("device", DEVICES)
def test_grad_compile_and_shapeless(device, data):
    x, r, w, b, gy, gh = data
    ours, plain = loss_pair(gy, gh)
    argnums = (0, 1, 2, 3)
    with mx.stream(device):
        want = mx.grad(plain, argnums=argnums)(x, r, w, b)
        for fn in (mx.grad(ours, argnums=argnums),
                   mx.compile(mx.grad(ours, argnums=argnums)),
                   mx.compile(mx.grad(ours, argnums=argnums), shapeless=True)):
            got = fn(x, r, w, b)
            for a, c in zip(got, want):
                close(a, c)


@pytest.mark.parametrize("device", DEVICES)
def test_jvp_vmap_and_second_order(device, data):
    x, r, w, b, gy, gh = data
    ours, plain = loss_pair(gy, gh)
    f = lambda x, r, w, b: list(mlx_rmsnorm.add_layer_norm(x, r, w, b, EPS))  # noqa: E731
    p = lambda x, r, w, b: [BUILTIN(x + r, w, b, EPS), x + r]  # noqa: E731
    tans = [random(a.shape, mx.float32, 50 + i) for i, a in enumerate((x, r, w, b))]
    with mx.stream(device):
        for a, c in zip(mx.jvp(f, [x, r, w, b], tans)[1], mx.jvp(p, [x, r, w, b], tans)[1]):
            close(a, c)
        cases = [((0, 0, None, None), (x, r, w, b)),  # the rows only: our primitive
                 ((1, None, None, None), (x, r[:, 0], w, b)),  # r shared by the batch
                 ((0, 0, 0, 0), (x[:2], r[:2], mx.stack([w, w * 0.5]), mx.stack([b, b + 1.0])))]
        for axes, args in cases:
            got = mx.vmap(f, in_axes=axes)(*args)
            want = mx.vmap(p, in_axes=axes)(*args)
            for a, c in zip(got, want):
                close(a, c)
        got = mx.grad(lambda x: (mx.grad(ours)(x, r, w, b) ** 2).sum())(x)
        want = mx.grad(lambda x: (mx.grad(plain)(x, r, w, b) ** 2).sum())(x)
    close(got, want, 1e-4)


def test_export_writes_mlx_ops(tmp_path, data):
    x, r, w, b, gy, gh = data
    path = str(tmp_path / "f.mlxfn")

    def f(x, r, w, b):
        return list(mlx_rmsnorm.add_layer_norm(x, r, w, b, EPS))

    mx.export_function(path, f, x, r, w, b)
    with open(path, "rb") as fh:
        assert b"Plugin" not in fh.read()
    got = mx.import_function(path)(x, r, w, b)
    for a, c in zip(got, f(x, r, w, b)):
        close(a, c)
