"""add_rms_norm (fused residual add + RMSNorm) and rms_norm(..., offset=):
values and gradients against a float64 NumPy reference and against the
unfused MLX composition (h = x + r; mx.fast.rms_norm(h, w)), every dtype,
odd shapes, strided inputs, transforms, export, determinism; Gemma's 1 + w."""

import mlx.core as mx
import numpy as np
import pytest
from conftest import DTYPES, TOL, graph_text, of_dtype, random, rel_err, to_numpy

import mlx_rmsnorm

NS = [1, 7, 33, 128, 256, 1000, 2880, 4099, 8192]
EPS = 1e-5


def ref_add_forward(x, r, w, eps, offset, h_dtype):
    """float64 (y, h): h rounded to h's dtype first, as the op stores it."""
    if h_dtype == mx.float64:
        hd = np.array(x + r)
    else:
        hd = to_numpy((x.astype(mx.float32) + r.astype(mx.float32)).astype(h_dtype))
    rstd = 1.0 / np.sqrt(np.mean(hd * hd, axis=-1, keepdims=True) + eps)
    y = hd * rstd
    if w is not None:
        y = y * (to_numpy(w) + offset)
    return y, hd


def ref_add_backward(hd, w, gy, gh, eps, offset):
    g = to_numpy(gy)
    n = hd.shape[-1]
    rstd = 1.0 / np.sqrt(np.mean(hd * hd, axis=-1, keepdims=True) + eps)
    v = g * (to_numpy(w) + offset) if w is not None else g
    gx = to_numpy(gh) + rstd * v - hd * (np.sum(v * hd, axis=-1, keepdims=True) / n) * rstd**3
    gw = (g * hd * rstd).reshape(-1, n).sum(axis=0) if w is not None else None
    return gx, gw


def run(x, r, w, gy, gh, eps, device, offset=0.0):
    """(y, h, gx, gr, gw) of the fused op through mx.vjp with both cotangents."""
    argnums = [0, 1] + ([2] if w is not None else [])
    primals = [x, r] + ([w] if w is not None else [])

    def f(*a):
        wt = a[2] if w is not None else None
        return list(mlx_rmsnorm.add_rms_norm(a[0], a[1], wt, eps, offset=offset, stream=device))

    (y, h), grads = mx.vjp(f, primals, [gy, gh])
    mx.eval(y, h, grads)
    gw = grads[2] if w is not None else None
    return y, h, grads[0], grads[1], gw


def check(x, r, w, eps, device, offset=0.0, seed=50):
    h_dtype = mx.result_type(x.dtype, r.dtype)
    y_dtype = mx.result_type(h_dtype, w.dtype) if w is not None else h_dtype
    gy = random(x.shape, y_dtype, seed)
    gh = random(x.shape, h_dtype, seed + 1)
    y, h, gx, gr, gw = run(x, r, w, gy, gh, eps, device, offset)
    assert y.dtype == y_dtype and h.dtype == h_dtype and y.shape == h.shape == x.shape
    ref_y, ref_h = ref_add_forward(x, r, w, eps, offset, h_dtype)
    assert np.array_equal(to_numpy(h), ref_h)  # the add is one rounding, as unfused
    assert rel_err(y, ref_y) <= TOL[y_dtype]
    ref_gx, ref_gw = ref_add_backward(ref_h, w, gy, gh, eps, offset)
    # gx: relative to the larger of its terms (g_h and r * g * w), see gx_scale.
    hd = ref_h
    rstd = 1.0 / np.sqrt(np.mean(hd * hd, axis=-1, keepdims=True) + eps)
    scale = max(np.max(np.abs(rstd * to_numpy(gy) * (to_numpy(w) + offset if w is not None else 1))),
                np.max(np.abs(to_numpy(gh))))
    # each input's gradient comes in its own dtype (a mixed pair was cast to h's)
    assert gx.dtype == x.dtype and gr.dtype == r.dtype
    assert rel_err(gx, ref_gx, scale) <= TOL[x.dtype]
    assert rel_err(gr, ref_gx, scale) <= TOL[r.dtype]
    if x.dtype == r.dtype:
        assert np.array_equal(np.array(gx.astype(mx.float32)), np.array(gr.astype(mx.float32)))
    if w is not None:
        assert gw.dtype == w.dtype and gw.shape == w.shape
        assert rel_err(gw, ref_gw) <= TOL[w.dtype]
    return y, h, gx, gw


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("n", NS)
def test_every_n_against_float64(device, dtype, n):
    t = DTYPES[dtype]
    x = random((5, n), t, 1)
    r = random((5, n), t, 2)
    w = random((n,), t, 3, 0.5, 1.0)
    check(x, r, w, EPS, device)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_no_weight_and_offset(device, dtype, offset):
    t = DTYPES[dtype]
    x = random((3, 4, 96), t, 4)
    r = random((3, 4, 96), t, 5)
    if offset:
        check(x, r, random((96,), t, 6, 0.1), EPS, device, offset=offset)
    else:
        check(x, r, None, EPS, device)


@pytest.mark.parametrize(
    "x_dtype,r_dtype,w_dtype",
    [("bfloat16", "bfloat16", "float32"), ("bfloat16", "float32", "bfloat16"),
     ("float16", "float16", "float32"), ("float32", "bfloat16", "float32")],
)
def test_mixed_dtypes(device, x_dtype, r_dtype, w_dtype):
    x = random((7, 256), DTYPES[x_dtype], 7)
    r = random((7, 256), DTYPES[r_dtype], 8)
    w = random((256,), DTYPES[w_dtype], 9, 0.5, 1.0)
    check(x, r, w, EPS, device)


@pytest.mark.parametrize("n", [64, 1024, 4096, 5000])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_many_rows(device, dtype, n):
    # enough rows for several persistent units and their gw partials
    t = DTYPES[dtype]
    check(random((600, n), t, 10), random((600, n), t, 11), random((n,), t, 12, 0.5, 1.0), EPS, device)


@pytest.mark.parametrize(
    "shape,x_dtype,w_dtype",
    [((3, 16384), "bfloat16", "bfloat16"),  # the last persistent row (bulk copies)
     ((3, 16384), "bfloat16", "float32"),  # fp32 g: the stages no longer fit, split plan
     ((2, 40000), "bfloat16", "bfloat16"),  # past every table: looped forward, split backward
     ((2, 1000), "float16", "float16"),
     ((9, 136), "bfloat16", "bfloat16")],
)
def test_long_and_planless_rows(device, shape, x_dtype, w_dtype):
    x, r = random(shape, DTYPES[x_dtype], 60), random(shape, DTYPES[x_dtype], 61)
    check(x, r, random(shape[-1:], DTYPES[w_dtype], 62, 0.5, 1.0), EPS, device, offset=0.5)


def test_misaligned_views(device):
    # views starting one element in: not 16-byte aligned
    base = random((4, 1025), mx.bfloat16, 63)
    x, r = base[:, 1:], random((4, 1025), mx.bfloat16, 64)[:, 1:]
    check(x, r, random((1024,), mx.bfloat16, 65, 0.5, 1.0), EPS, device)


def unfused(x, r, w, eps, offset=0.0):
    h = x + r
    if w is None:
        return [mx.fast.rms_norm(h, None, eps), h]
    scale = w.astype(mx.float32) + offset if offset else w
    return [mx.fast.rms_norm(h, scale, eps).astype(mx.result_type(h.dtype, w.dtype)), h]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_against_the_unfused_composition(device, dtype, offset):
    t = DTYPES[dtype]
    shape = (2, 9, 384)
    x, r = random(shape, t, 13), random(shape, t, 14)
    w = random((384,), t, 15, 0.5, 0.0 if offset else 1.0)
    gy, gh = random(shape, t, 16), random(shape, t, 17)

    def fused(x, r, w):
        return list(mlx_rmsnorm.add_rms_norm(x, r, w, EPS, offset=offset, stream=device))

    def plain(x, r, w):
        with mx.stream(device):
            return unfused(x, r, w, EPS, offset)

    outs_f, grads_f = mx.vjp(fused, [x, r, w], [gy, gh])
    outs_p, grads_p = mx.vjp(plain, [x, r, w], [gy, gh])
    mx.eval(outs_f, grads_f, outs_p, grads_p)
    assert np.array_equal(to_numpy(outs_f[1]), to_numpy(outs_p[1]))  # h
    assert rel_err(outs_f[0], to_numpy(outs_p[0])) <= TOL[t]
    for a, b in zip(grads_f, grads_p):  # x, residual, weight
        assert a.dtype == b.dtype
        assert rel_err(a, to_numpy(b)) <= 2 * TOL[t]


def test_strided_inputs(device):
    base = random((16, 8, 130), mx.float32, 18)
    x = base.transpose(1, 0, 2)[:, :, 1:129]  # transposed and sliced
    r = random((8, 16, 256), mx.float32, 19)[:, :, ::2]  # strided last axis
    w = random((256,), mx.float32, 20, 0.5, 1.0)[::2]
    y, h, gx, gw = check(x, r, w, EPS, device)
    yc, hc, gxc, gwc = check(mx.array(np.array(x)), mx.array(np.array(r)), mx.array(np.array(w)), EPS, device)
    assert np.array_equal(np.array(y), np.array(yc)) and np.array_equal(np.array(gx), np.array(gxc))


def test_float64_runs_the_reference():
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


@pytest.mark.parametrize("shape", [(3, 4096), (300, 256), (64, 2880)])
def test_repeated_calls_are_bitwise_identical(device, shape):
    x, r = random(shape, mx.bfloat16, 24), random(shape, mx.bfloat16, 25)
    w = random(shape[-1:], mx.bfloat16, 26, 0.5, 1.0)
    gy, gh = random(shape, mx.bfloat16, 27), random(shape, mx.bfloat16, 28)
    first = run(x, r, w, gy, gh, EPS, device)
    for _ in range(3):
        again = run(x, r, w, gy, gh, EPS, device)
        for a, b in zip(first, again):
            assert np.array_equal(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)))


def test_errors():
    x = mx.zeros((2, 8))
    with pytest.raises(ValueError, match="residual"):
        mlx_rmsnorm.add_rms_norm(x, mx.zeros((2, 4)), None, EPS)
    with pytest.raises(ValueError, match="weight"):
        mlx_rmsnorm.add_rms_norm(x, x, mx.zeros((4,)), EPS)
    with pytest.raises(ValueError, match="offset"):
        mlx_rmsnorm.add_rms_norm(x, x, None, EPS, offset=1.0)
    with pytest.raises(ValueError, match="offset"):
        mlx_rmsnorm.rms_norm(x, None, EPS, offset=1.0)
    with pytest.raises(ValueError, match="floating"):
        mlx_rmsnorm.add_rms_norm(mx.zeros((2, 8), mx.int32), mx.zeros((2, 8), mx.int32), None, EPS)


@pytest.mark.parametrize(
    "x_dtype,r_dtype,w_dtype",
    [("int32", "int32", "float32"), ("int8", "bool_", "bfloat16"), ("bool_", "bool_", "float16"),
     ("int32", "float32", None), ("float16", "float64", "float32"), ("bfloat16", "bfloat16", "float64")],
)
def test_every_dtype_rms_norm_accepts(x_dtype, r_dtype, w_dtype):
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
    tol = 1e-12 if y.dtype == mx.float64 else TOL[y.dtype]
    assert np.max(np.abs(np.array(y.astype(mx.float64, stream=mx.cpu)) - ref)) <= tol * np.max(np.abs(ref))


# --- transforms ----------------------------------------------------------------


@pytest.fixture
def data():
    shape = (4, 6, 48)
    return (random(shape, mx.float32, 30), random(shape, mx.float32, 31),
            random((48,), mx.float32, 32, 0.5, 1.0), random(shape, mx.float32, 33),
            random(shape, mx.float32, 34))


def loss_pair(gy, gh, offset=0.0):
    def fused(x, r, w):
        y, h = mlx_rmsnorm.add_rms_norm(x, r, w, EPS, offset=offset)
        return (y * gy).sum() + (h * gh).sum()

    def plain(x, r, w):
        y, h = unfused(x, r, w, EPS, offset)
        return (y * gy).sum() + (h * gh).sum()

    return fused, plain


def close(a, b, tol=2e-5):
    a, b = np.array(a), np.array(b)
    scale = max(np.max(np.abs(b)), 1e-30)
    assert np.max(np.abs(a - b)) / scale <= tol, np.max(np.abs(a - b)) / scale


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_grad_compile_and_shapeless(device, data, offset):
    x, r, w, gy, gh = data
    fused, plain = loss_pair(gy, gh, offset)
    with mx.stream(device):
        want = mx.grad(plain, argnums=(0, 1, 2))(x, r, w)
        for fn in (mx.grad(fused, argnums=(0, 1, 2)),
                   mx.compile(mx.grad(fused, argnums=(0, 1, 2))),
                   mx.compile(mx.grad(fused, argnums=(0, 1, 2)), shapeless=True)):
            got = fn(x, r, w)
            for a, b in zip(got, want):
                close(a, b)


def test_no_gw_when_the_weight_gets_no_gradient(data):
    x, r, w, gy, gh = data
    fused, _ = loss_pair(gy, gh)
    gx = mx.grad(fused, argnums=0)(x, r, w)
    text = graph_text(gx)
    assert "AddRMSNormPluginVJP" in text
    # one output (gx) on the backward node: no column sum, no gw
    (vjp,) = mx.vjp(lambda x: list(mlx_rmsnorm.add_rms_norm(x, r, w, EPS)), [x], [gy, gh])[1]
    assert vjp.shape == x.shape


def test_jvp(device, data):
    x, r, w, gy, gh = data
    tx, tr, tw = random(x.shape, mx.float32, 40), random(x.shape, mx.float32, 41), random((48,), mx.float32, 42)
    with mx.stream(device):
        f = lambda x, r, w: list(mlx_rmsnorm.add_rms_norm(x, r, w, EPS, offset=1.0))  # noqa: E731
        p = lambda x, r, w: unfused(x, r, w, EPS, 1.0)  # noqa: E731
        _, got = mx.jvp(f, [x, r, w], [tx, tr, tw])
        _, want = mx.jvp(p, [x, r, w], [tx, tr, tw])
    for a, b in zip(got, want):
        close(a, b)


@pytest.mark.parametrize("in_axes", [(0, 0, None), (1, None, None), (None, 2, None), (0, 0, 0)])
def test_vmap(device, in_axes):
    shapes = {0: (3, 5, 32), 1: (5, 3, 32), 2: (5, 32, 3), None: (5, 32)}
    x = random(shapes[in_axes[0]] if in_axes[0] != 2 else (5, 32, 3), mx.float32, 43)
    r = random(shapes[in_axes[1]], mx.float32, 44)
    w = random((3, 32) if in_axes[2] == 0 else (32,), mx.float32, 45, 0.5, 1.0)
    if in_axes[0] == 2:
        x = random((5, 32), mx.float32, 43)
        in_axes = (None, 2, None)
    with mx.stream(device):
        got = mx.vmap(lambda x, r, w: list(mlx_rmsnorm.add_rms_norm(x, r, w, EPS)), in_axes=in_axes)(x, r, w)
        want = mx.vmap(lambda x, r, w: unfused(x, r, w, EPS), in_axes=in_axes)(x, r, w)
    for a, b in zip(got, want):
        close(a, b)


def test_second_order(data):
    x, r, w, gy, gh = data
    fused, plain = loss_pair(gy, gh)
    got = mx.grad(lambda x: (mx.grad(fused)(x, r, w) ** 2).sum())(x)
    want = mx.grad(lambda x: (mx.grad(plain)(x, r, w) ** 2).sum())(x)
    close(got, want, 1e-4)


def test_export_writes_mlx_ops(tmp_path, data):
    x, r, w, _, _ = data
    path = str(tmp_path / "f.mlxfn")

    def f(x, r, w):
        return list(mlx_rmsnorm.add_rms_norm(x, r, w, EPS, offset=1.0))

    mx.export_function(path, f, x, r, w)
    with open(path, "rb") as fh:
        assert b"Plugin" not in fh.read()
    got = mx.import_function(path)(x, r, w)
    want = f(x, r, w)
    for a, b in zip(got, want):
        close(a, b)


# --- rms_norm(..., offset=) and Gemma's accuracy --------------------------------


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_rms_norm_offset(device, dtype):
    t = DTYPES[dtype]
    x, w, g = random((6, 200), t, 46), random((200,), t, 47, 0.3), random((6, 200), t, 48)
    y = mlx_rmsnorm.rms_norm(x, w, EPS, offset=1.0, stream=device)
    gx, gw = mx.vjp(lambda x, w: mlx_rmsnorm.rms_norm(x, w, EPS, offset=1.0, stream=device), [x, w], [g])[1]
    xd, gd, wd = to_numpy(x), to_numpy(g), to_numpy(w) + 1.0
    rstd = 1.0 / np.sqrt(np.mean(xd * xd, axis=-1, keepdims=True) + EPS)
    assert rel_err(y, xd * rstd * wd) <= TOL[t]
    v = gd * wd
    ref_gx = rstd * v - xd * (np.sum(v * xd, axis=-1, keepdims=True) / 200) * rstd**3
    assert rel_err(gx, ref_gx, np.max(np.abs(rstd * v))) <= TOL[t]
    assert rel_err(gw, (gd * xd * rstd).sum(axis=0)) <= TOL[t]


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
