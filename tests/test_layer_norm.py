"""LayerNorm: layer_norm / layer_norm_vjp / LayerNorm against float64
NumPy and against mx.fast.layer_norm, every weight/bias combination, dtypes,
transforms, export, patch() and determinism. Every test runs on the CPU stream
and, where MLX has CUDA and the plugin its kernels, on the GPU (`gpu` marker).
"""

import os
import subprocess
import sys
import textwrap

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import DEVICES, GPU_AVAILABLE, TOL, graph_text, random, rel_err, to_numpy
from conftest import LN_COMBO_IDS as COMBO_IDS, LN_COMBOS as COMBOS
from conftest import layer_ref_backward as ref_backward, layer_ref_forward as ref_forward

import mlx_rmsnorm
from mlx_rmsnorm import _patching

EPS = 1e-5
BUILTIN = _patching.BUILTIN_LAYER_NORM  # MLX's own, even while patched


def make(shape, dtype, with_w, with_b, seed=0, wdtype=None):
    n = shape[-1]
    x = random(shape, dtype, seed, 1.0, 0.5)
    w = random((n,), wdtype or dtype, seed + 1, 0.5, 1.0) if with_w else None
    b = random((n,), wdtype or dtype, seed + 2, 0.5) if with_b else None
    g = random(shape, dtype, seed + 3)
    return x, w, b, g


def grads_of(fn, x, w, b, g):
    """(gx, gw, gb) of fn(x, w, b) under mx.vjp, None for absent inputs."""
    prim = [x] + [a for a in (w, b) if a is not None]

    def f(*a):
        it = iter(a[1:])
        ww = next(it) if w is not None else None
        bb = next(it) if b is not None else None
        return [fn(a[0], ww, bb, EPS)]

    _, grads = mx.vjp(f, prim, [g])
    it = iter(grads[1:])
    return grads[0], (next(it) if w is not None else None), (next(it) if b is not None else None)


# --- values and gradients ------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("combo", COMBOS, ids=COMBO_IDS)
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(7, 64), (3, 5, 768), (130, 1024), (2, 4096), (9, 100)], ids=str)
def test_forward_and_backward_vs_float64(device, combo, dtype, shape):
    with_w, with_b = combo
    x, w, b, g = make(shape, dtype, with_w, with_b, seed=sum(shape))
    with mx.stream(device):
        y = mlx_rmsnorm.layer_norm(x, w, b, EPS)
        gx, gw, gb = grads_of(mlx_rmsnorm.layer_norm, x, w, b, g)
        mx.eval(y, gx, gw, gb)
    assert y.dtype == dtype
    tol = TOL[dtype]
    assert rel_err(y, ref_forward(x, w, b, EPS)) < tol
    rgx, rgw, rgb = ref_backward(x, w, g, EPS)
    assert gx.dtype == dtype
    assert rel_err(gx, rgx) < 2 * tol
    if with_w:
        assert gw.dtype == w.dtype and gw.shape == w.shape
        assert rel_err(gw, rgw) < tol
    if with_b:
        assert gb.dtype == b.dtype and gb.shape == b.shape
        assert rel_err(gb, rgb) < tol


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("combo", COMBOS, ids=COMBO_IDS)
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=str)
def test_matches_builtin(device, combo, dtype):
    with_w, with_b = combo
    x, w, b, g = make((33, 512), dtype, with_w, with_b, seed=5)
    with mx.stream(device):
        ours = [mlx_rmsnorm.layer_norm(x, w, b, EPS), *grads_of(mlx_rmsnorm.layer_norm, x, w, b, g)]
        theirs = [BUILTIN(x, w, b, EPS), *grads_of(BUILTIN, x, w, b, g)]
        mx.eval([a for a in ours + theirs if a is not None])
    # The built-in rounds between its steps (x_hat, then * w, then + b): a few
    # roundings of the output dtype apart.
    tol = 4 * TOL[dtype]
    for o, t in zip(ours, theirs):
        assert (o is None) == (t is None)
        if o is not None:
            assert o.dtype == t.dtype and o.shape == t.shape
            assert rel_err(o, to_numpy(t)) < tol


@pytest.mark.parametrize("device", DEVICES)
def test_gw_gb_within_one_bf16_rounding(device):
    """gw and gb are summed in fp32 and rounded once: within one bf16 rounding
    (relative to the largest element) of float64."""
    x, w, b, g = make((4096, 256), mx.bfloat16, True, True, seed=11)
    with mx.stream(device):
        _, gw, gb = mlx_rmsnorm.layer_norm_vjp(x, w, b, g, EPS)
        mx.eval(gw, gb)
    _, rgw, rgb = ref_backward(x, w, g, EPS)
    for out, ref in ((gw, rgw), (gb, rgb)):
        err = np.abs(to_numpy(out) - ref) / np.maximum(np.abs(ref), 1e-3 * np.abs(ref).max())
        assert err.max() <= 2.0**-8 * 1.05


@pytest.mark.parametrize("device", DEVICES)
def test_large_mean_rows_keep_their_digits(device):
    """Rows whose mean is far larger than their spread normalize correctly in
    fp32: the GPU's one-pass sums are taken about a shift (the mean of the
    row's first vector), the CPU's are two passes; the plain E[x^2] - E[x]^2
    would lose every digit here."""
    rng = np.random.default_rng(3)
    x = mx.array((1000.0 + rng.standard_normal((16, 256))).astype(np.float32))
    with mx.stream(device):
        y = mlx_rmsnorm.layer_norm(x, None, None, EPS)
    assert rel_err(y, ref_forward(x, None, None, EPS)) < 1e-3


@pytest.mark.parametrize("device", DEVICES)
# N = 2048: a row that reads w and b per step, where only weights in x's
# dtype take the packed read (forward.cuh W_AS_X)
@pytest.mark.parametrize("n", [64, 2048])
def test_mixed_dtypes_follow_the_builtin(device, n):
    x = random((8, n), mx.bfloat16, 1)
    w32 = random((n,), mx.float32, 2)
    b16 = random((n,), mx.float16, 3)
    with mx.stream(device):
        for w, b in [(w32, None), (w32, b16), (None, b16), (None, w32)]:
            y = mlx_rmsnorm.layer_norm(x, w, b, EPS)
            assert y.dtype == BUILTIN(x, w, b, EPS).dtype
            gx, gw, gb = grads_of(mlx_rmsnorm.layer_norm, x, w, b, random((8, n), y.dtype, 4))
            assert gx.dtype == x.dtype
            if w is not None:
                assert gw.dtype == w.dtype
            if b is not None:
                assert gb.dtype == b.dtype
            assert rel_err(y, ref_forward(x, w, b, EPS)) < TOL[y.dtype] * 2


def test_integer_and_float64_inputs():
    x = mx.arange(24).reshape(3, 8)
    w = mx.ones((8,), dtype=mx.float32)
    y = mlx_rmsnorm.layer_norm(x, w, None, EPS)
    assert y.dtype == mx.float32
    assert rel_err(y, ref_forward(x, w, None, EPS)) < 1e-5
    with mx.stream(mx.cpu):  # MLX has no float64 on the GPU
        x64 = random((4, 16), mx.float32, 1).astype(mx.float64)
        y64 = mlx_rmsnorm.layer_norm(x64, None, None, EPS)
        assert y64.dtype == mx.float64
        gx = mx.grad(lambda a: (mlx_rmsnorm.layer_norm(a, None, None, EPS) ** 2).sum())(x64)
        mx.eval(y64, gx)
        assert np.allclose(np.array(y64), ref_forward(x64, None, None, EPS), atol=1e-10)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: mlx_rmsnorm.layer_norm(mx.array(1.0), None, None, EPS), "at least 1 dimension"),
        (lambda: mlx_rmsnorm.layer_norm(mx.ones((4, 8)), mx.ones((3,)), None, EPS), "weight has 3"),
        (lambda: mlx_rmsnorm.layer_norm(mx.ones((4, 8)), None, mx.ones((3,)), EPS), "bias has 3"),
        (lambda: mlx_rmsnorm.layer_norm(mx.ones((4, 8)), None, mx.ones((1, 8)), EPS), "bias must have 1 dimension"),
        (lambda: mlx_rmsnorm.layer_norm(mx.ones((4, 8)), mx.ones((1, 8)), None, EPS), "weight must have 1 dimension"),
        (lambda: mlx_rmsnorm.layer_norm(mx.ones((4, 8), mx.int32), None, None, EPS), "unsupported type int32"),
        (lambda: mlx_rmsnorm.layer_norm_vjp(mx.ones((4, 8)), None, None, mx.ones((4, 7)), EPS), "shape of x"),
    ],
)
def test_errors_are_value_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
    # The built-in rejects the same inputs.


def test_builtin_rejects_the_same_inputs():
    for args in [(mx.array(1.0), None, None), (mx.ones((4, 8)), mx.ones((3,)), None),
                 (mx.ones((4, 8)), None, mx.ones((3,))), (mx.ones((4, 8), mx.int32), None, None)]:
        with pytest.raises(ValueError):
            BUILTIN(*args, EPS)


# --- transforms ----------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("combo", COMBOS, ids=COMBO_IDS)
def test_grad_jvp_vmap_compile(device, combo):
    with_w, with_b = combo
    x, w, b, g = make((6, 128), mx.float32, with_w, with_b, seed=21)
    with mx.stream(device):

        def loss(fn):
            def f(x, w, b):
                return (fn(x, w, b, EPS) * g).sum()

            return f

        argnums = [0] + ([1] if with_w else []) + ([2] if with_b else [])
        ours = mx.grad(loss(mlx_rmsnorm.layer_norm), argnums=argnums)(x, w, b)
        theirs = mx.grad(loss(BUILTIN), argnums=argnums)(x, w, b)
        if len(argnums) == 1:  # a lone gradient comes back bare
            ours, theirs = [ours], [theirs]
        for o, t in zip(ours, theirs):
            assert rel_err(o, to_numpy(t)) < 1e-4

        # jvp of the forward
        tx = random((6, 128), mx.float32, 22)
        _, (jo,) = mx.jvp(lambda a: mlx_rmsnorm.layer_norm(a, w, b, EPS), [x], [tx])
        _, (jt,) = mx.jvp(lambda a: BUILTIN(a, w, b, EPS), [x], [tx])
        assert rel_err(jo, to_numpy(jt)) < 1e-4

        # vmap over a leading axis of x, and over x and the weight together
        xs = random((3, 6, 128), mx.float32, 23)
        vo = mx.vmap(lambda a: mlx_rmsnorm.layer_norm(a, w, b, EPS), in_axes=1)(xs)
        vt = mx.vmap(lambda a: BUILTIN(a, w, b, EPS), in_axes=1)(xs)
        assert rel_err(vo, to_numpy(vt)) < 1e-5
        if with_w:
            ws = random((3, 128), mx.float32, 24)
            vo = mx.vmap(lambda a, ww: mlx_rmsnorm.layer_norm(a, ww, b, EPS))(xs, ws)
            vt = mx.vmap(lambda a, ww: BUILTIN(a, ww, b, EPS))(xs, ws)
            assert rel_err(vo, to_numpy(vt)) < 1e-5

        # compile, plain and shapeless, forward and gradient
        for shapeless in (False, True):
            cf = mx.compile(lambda a: mlx_rmsnorm.layer_norm(a, w, b, EPS), shapeless=shapeless)
            for rows in (6, 10):
                xa = random((rows, 128), mx.float32, rows)
                assert rel_err(cf(xa), ref_forward(xa, w, b, EPS)) < 1e-5
            cg = mx.compile(mx.grad(loss(mlx_rmsnorm.layer_norm)), shapeless=shapeless)
            # (argnums 0: the gradient of x)
            assert rel_err(cg(x, w, b), to_numpy(theirs[0])) < 1e-4


@pytest.mark.parametrize("device", DEVICES)
def test_second_order_and_vjp_transforms(device):
    x, w, b, g = make((5, 64), mx.float32, True, True, seed=31)
    with mx.stream(device):

        def gnorm(fn):
            return lambda a: (mx.grad(lambda z: (fn(z, w, b, EPS) * g).sum())(a) ** 2).sum()

        o = mx.grad(gnorm(mlx_rmsnorm.layer_norm))(x)
        t = mx.grad(gnorm(BUILTIN))(x)
        assert rel_err(o, to_numpy(t)) < 1e-3
        # vmap and jvp of the backward primitive itself
        gs = random((2, 5, 64), mx.float32, 32)
        vo = mx.vmap(lambda gg: mlx_rmsnorm.layer_norm_vjp(x, w, b, gg, EPS)[0])(gs)
        for i in range(2):
            ref, _, _ = ref_backward(x, w, gs[i], EPS)
            assert rel_err(vo[i], ref) < 1e-4
        _, (jo,) = mx.jvp(lambda gg: mlx_rmsnorm.layer_norm_vjp(x, w, b, gg, EPS)[1], [g], [g])
        _, rgw, _ = ref_backward(x, w, g, EPS)
        assert rel_err(jo, rgw) < 1e-4  # gw is linear in g


@pytest.mark.parametrize("device", DEVICES)
def test_no_work_for_what_gets_no_gradient(device):
    x, w, b, g = make((8, 64), mx.float32, True, True, seed=41)
    with mx.stream(device):
        gx, gw, gb = mlx_rmsnorm.layer_norm_vjp(x, w, b, g, EPS, need_gw=False)
        assert gw is None and gb is not None
        gx2, gw2, gb2 = mlx_rmsnorm.layer_norm_vjp(x, w, b, g, EPS, need_gb=False)
        assert gb2 is None and gw2 is not None
        mx.eval(gx, gb, gx2, gw2)
        assert np.array_equal(np.array(gx), np.array(gx2))
        # only x gets a gradient: the backward node has gx alone
        gonly = mx.grad(lambda a: (mlx_rmsnorm.layer_norm(a, w, b, EPS) * g).sum())(x)
        rgx, _, _ = ref_backward(x, w, g, EPS)
        assert rel_err(gonly, rgx) < 1e-4


# --- module, patch, export, determinism -----------------------------------------


def test_module_is_a_layer_norm():
    for kwargs in ({}, {"bias": False}, {"affine": False}):
        ours = mlx_rmsnorm.LayerNorm(32, eps=1e-6, **kwargs)
        theirs = nn.LayerNorm(32, eps=1e-6, **kwargs)
        assert isinstance(ours, nn.LayerNorm)
        assert repr(ours) == repr(theirs)
        x = random((4, 32), mx.float32, 1)
        assert "LayerNormPlugin" in graph_text(ours(x))
        assert rel_err(ours(x), to_numpy(theirs(x))) < 1e-5


def test_patch_routes_layer_norm():
    x = random((4, 32), mx.float32, 1)
    ln = nn.LayerNorm(32)
    assert not mlx_rmsnorm.is_patched()
    assert "LayerNormPlugin" not in graph_text(ln(x))
    with mlx_rmsnorm.patched():
        assert mlx_rmsnorm.is_patched()
        assert mx.fast.layer_norm is _patching.ROUTED_LAYER_NORM
        assert "LayerNormPlugin" in graph_text(ln(x))
        g = mx.grad(lambda a: ln(a).sum())(x)
        assert "LayerNormPluginVJP" in graph_text(g)
    assert mx.fast.layer_norm is BUILTIN
    mlx_rmsnorm.patch()
    try:
        assert mx.fast.layer_norm is _patching.ROUTED_LAYER_NORM
    finally:
        mlx_rmsnorm.unpatch()
    assert mx.fast.layer_norm is BUILTIN and mx.fast.rms_norm is _patching.BUILTIN


def test_report_counts_layer_norm():
    from mlx_rmsnorm import _autopatch

    ln = nn.LayerNorm(32)
    x = random((4, 32), mx.float32, 1)
    with mlx_rmsnorm.patched():
        counts = _autopatch.primitive_counts(mx.grad(lambda a: ln(a).sum())(x))
    assert counts["LayerNormPluginVJP"] == 1
    assert "LayerNormPluginVJP=" in _autopatch.summary()


def test_export_writes_mlx_ops(tmp_path):
    x, w, b, _ = make((4, 64), mx.float32, True, True, seed=51)
    path = str(tmp_path / "ln.mlxfn")

    def fn(a):
        return mlx_rmsnorm.layer_norm(a, w, b, EPS)

    mx.export_function(path, fn, x)
    with open(path, "rb") as f:
        assert b"LayerNormPlugin" not in f.read()
    out = mx.import_function(path)(x)[0]
    assert rel_err(out, ref_forward(x, w, b, EPS)) < 1e-5
    # and the gradient, exported under patch()
    gpath = str(tmp_path / "ln_grad.mlxfn")
    ln = nn.LayerNorm(64)
    with mlx_rmsnorm.patched():
        mx.export_function(gpath, mx.grad(lambda a: ln(a).sum()), x)
    with open(gpath, "rb") as f:
        assert b"LayerNormPlugin" not in f.read()
    script = textwrap.dedent(
        f"""
        import sys, mlx.core as mx
        f = mx.import_function({gpath!r})
        out = f(mx.ones((4, 64)))[0]
        mx.eval(out)
        assert "mlx_rmsnorm" not in sys.modules
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_RMSNORM")}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120)


@pytest.mark.parametrize("device", DEVICES)
def test_bitwise_deterministic(device):
    x, w, b, g = make((2048, 768), mx.bfloat16, True, True, seed=61)
    with mx.stream(device):
        runs = []
        for _ in range(3):
            out = mlx_rmsnorm.layer_norm_vjp(x, w, b, g, EPS)
            y = mlx_rmsnorm.layer_norm(x, w, b, EPS)
            mx.eval(*out, y)
            runs.append([np.array(a.view(mx.uint16)) for a in (*out, y)])
    for r in runs[1:]:
        for a, b_ in zip(runs[0], r):
            assert np.array_equal(a, b_)


# --- GPU-only: plans and the fallback --------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_AVAILABLE, reason="needs MLX CUDA + kernels")
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=str)
@pytest.mark.parametrize(
    "n,rows",
    [(n, r) for n in (8, 16, 64, 128, 256, 512, 768, 1024, 1280, 2048, 2560, 4096, 5120, 8192, 16384)
     for r in (1, 3, 257)]
    # many steps a unit: every stage of the pipeline is refilled
    + [(n, 2048) for n in (64, 128, 1024, 2048, 5120, 8192, 16384)],
)
def test_gpu_every_plan_row(dtype, n, rows):
    x, w, b, g = make((rows, n), dtype, True, True, seed=n + rows)
    with mx.stream(mx.gpu):
        y = mlx_rmsnorm.layer_norm(x, w, b, EPS)
        # planned: rows of up to 2048 16-byte vectors (N = 16384 bf16, 8192 fp32)
        planned = n * dtype.size // 16 <= 2048
        assert ("LayerNormPlugin" in graph_text(y)) == planned  # (before eval: the graph)
        gx, gw, gb = mlx_rmsnorm.layer_norm_vjp(x, w, b, g, EPS)
        mx.eval(y, gx, gw, gb)
    tol = TOL[dtype]
    assert rel_err(y, ref_forward(x, w, b, EPS)) < tol
    rgx, rgw, rgb = ref_backward(x, w, g, EPS)
    assert rel_err(gx, rgx) < 2 * tol
    assert rel_err(gw, rgw) < tol
    assert rel_err(gb, rgb) < tol


@pytest.mark.parametrize("combo", COMBOS, ids=COMBO_IDS)
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16], ids=str)
def test_odd_rows_path_is_exact(combo, dtype):
    """The GPU path for rows that are not a whole number of 16-byte vectors
    (the built-in's forward, our fp32 backward: on the H200 the built-in's own
    gx was 7.5-9.5% off at N = 100 in float16 and bfloat16), here on the CPU
    stream: values and gradients against float64."""
    with_w, with_b = combo
    x, w, b, g = make((9, 100), dtype, with_w, with_b, seed=7)
    fn = mlx_rmsnorm._ext._layer_norm_builtin_forward_reference_backward
    y = fn(x, w, b, EPS)
    gx, gw, gb = grads_of(fn, x, w, b, g)
    assert rel_err(y, ref_forward(x, w, b, EPS)) < 4 * TOL[dtype]
    rgx, rgw, rgb = ref_backward(x, w, g, EPS)
    assert rel_err(gx, rgx) < 2 * TOL[dtype]
    if with_w:
        assert gw.dtype == w.dtype and rel_err(gw, rgw) < TOL[dtype]
    if with_b:
        assert gb.dtype == b.dtype and rel_err(gb, rgb) < TOL[dtype]


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_AVAILABLE, reason="needs MLX CUDA + kernels")
def test_gpu_unplanned_rows_go_to_the_builtin():
    for n in (100, 32768):
        x, w, b, g = make((4, n), mx.bfloat16, True, True, seed=n)
        with mx.stream(mx.gpu):
            y = mlx_rmsnorm.layer_norm(x, w, b, EPS)
            assert "LayerNormPlugin" not in graph_text(y)
            gx, gw, gb = mlx_rmsnorm.layer_norm_vjp(x, w, b, g, EPS)
            mx.eval(y, gx, gw, gb)
        assert rel_err(y, ref_forward(x, w, b, EPS)) < 4 * TOL[mx.bfloat16]
        if n == 100:  # our fp32 backward there
            rgx, rgw, rgb = ref_backward(x, w, g, EPS)
            assert rel_err(gx, rgx) < 2 * TOL[mx.bfloat16]
            assert rel_err(gb, rgb) < TOL[mx.bfloat16]


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_AVAILABLE, reason="needs MLX CUDA + kernels")
def test_gpu_strided_and_misaligned_inputs():
    base = random((64, 2 * 768), mx.bfloat16, 1)
    x = base[:, 768:]  # not row-contiguous: gathered
    flat = random((1 + 16 * 768,), mx.bfloat16, 2)
    xm = flat[1:].reshape(16, 768)  # row-contiguous, 2 bytes off 16
    w = random((768,), mx.bfloat16, 3)
    with mx.stream(mx.gpu):
        for a in (x, xm):
            y = mlx_rmsnorm.layer_norm(a, w, None, EPS)
            gx, gw, _ = mlx_rmsnorm.layer_norm_vjp(a, w, None, mx.ones_like(a), EPS)
            mx.eval(y, gx, gw)
            assert rel_err(y, ref_forward(a, w, None, EPS)) < TOL[mx.bfloat16]
            rgx, rgw, _ = ref_backward(a, w, mx.ones_like(a), EPS)
            assert rel_err(gx, rgx, scale=1.0) < 2e-2
            assert rel_err(gw, rgw) < TOL[mx.bfloat16]
