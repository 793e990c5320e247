"""GPU kernels on every launch plan: shapes from the tables' edges to the
fallbacks, both backward algorithms (and split), dtypes, alignment, accuracy
of gw and determinism. Skipped without MLX CUDA and our kernels."""

import mlx.core as mx
import numpy as np
import pytest
from conftest import (GPU_AVAILABLE, LARGE_GROUP, ONE_ROUNDING, TOL, gx_scale, holds_cluster_of_16,
                      longest_cluster_nvec, random, ref_backward, ref_forward, rel_err, to_numpy, ulp_errors)

import mlx_rmsnorm
from mlx_rmsnorm import _ext

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not GPU_AVAILABLE, reason="needs MLX CUDA + kernels"),
]

# (M, N): every row of the backward/forward tables, the fallbacks (odd N,
# N past the tables), M smaller than the grid, and the benchmark shapes.
SHAPES = [
    (1, 1), (3, 7), (1000, 1), (257, 31), (513, 32), (129, 33), (4096, 64),
    (20000, 128), (3000, 256), (1500, 512), (1024, 1000), (2048, 1024),
    (700, 2048), (16384, 2880), (600, 4096), (2048, 4099), (4096, 8192),
    (300, 16384), (300, 16392), (256, 32768), (40, 65536), (100, 65544),
    (6, 262144), (262144, 128), (333, 2560), (257, 3584), (1000, 5120),
]
ALGORITHMS = ["auto", "split", "naive"]


def inputs(shape, seed, dtype=mx.bfloat16, w_dtype=None, g_dtype=None):
    """x, w (near 1, as trained norm weights are) and g of a case; seeds
    seed, seed + 1, seed + 2."""
    x = random(shape, dtype, seed)
    w = random(shape[-1:], w_dtype or dtype, seed + 1, 0.5, 1.0)
    g = random(shape, g_dtype or dtype, seed + 2)
    return x, w, g


def run(x, w, g, eps=1e-5, algorithm="auto"):
    y = mlx_rmsnorm.rms_norm(x, w, eps, stream=mx.gpu)
    gx, gw = mlx_rmsnorm.rms_norm_vjp(x, w, g, eps, algorithm=algorithm, stream=mx.gpu)
    mx.eval(y, gx, gw)
    return y, gx, gw


def check_against_float64(x, w, g, outputs, tol, gw_tol, case=None):
    """y and gx within `tol` of the float64 reference (gx relative to its
    scale), gw within `gw_tol`."""
    y, gx, gw = outputs
    ref_gx, ref_gw = ref_backward(x, w, g, 1e-5)
    assert rel_err(y, ref_forward(x, w, 1e-5)) <= tol, case
    assert rel_err(gx, ref_gx, gx_scale(x, w, g, 1e-5)) <= tol, case
    if w is None:
        assert gw is None
    else:
        assert rel_err(gw, ref_gw) <= gw_tol, case


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("m,n", SHAPES, ids=[f"{m}x{n}" for m, n in SHAPES])
def test_bf16_shapes(m, n, algorithm):
    x, w, g = inputs((m, n), m + n)
    y, gx, gw = run(x, w, g, algorithm=algorithm)
    # gw accuracy: summed in fp32 and rounded once to bf16, so within one
    # bf16 rounding of the float64 value, element by element (<= 1 ulp). The
    # naive chain rounds its M x N partial to bf16 as the seed's does.
    naive = algorithm == "naive"
    check_against_float64(x, w, g, (y, gx, gw), TOL[mx.bfloat16],
                          1e-2 if naive else ONE_ROUNDING[mx.bfloat16])
    if not naive:
        assert ulp_errors(gw, ref_backward(x, w, g, 1e-5)[1], mx.bfloat16) <= 1.0


@pytest.mark.parametrize("m,n", [(4096, 8192), (262144, 128), (16384, 2880), (1024, 16384)])
def test_gw_float32_accuracy(m, n):
    x, w, g = inputs((m, n), 3, mx.float32)
    check_against_float64(x, w, g, run(x, w, g), 2e-6, 1e-6 * max(1.0, np.log2(m)))


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("m,n", [(999, 128), (333, 1024), (100, 4096), (64, 8192), (16, 20000)])
@pytest.mark.parametrize("algorithm", ["auto", "naive"])
def test_other_dtypes(dtype, m, n, algorithm):
    x, w, g = inputs((m, n), 6, dtype)
    check_against_float64(x, w, g, run(x, w, g, algorithm=algorithm), TOL[dtype],
                          TOL[dtype] if algorithm == "naive" else 2 * TOL[dtype] / 5)


@pytest.mark.parametrize("n", [128, 2048, 8192, 40000])
@pytest.mark.parametrize("w_dtype", [mx.float32, None])
def test_mixed_and_no_weight(n, w_dtype):
    out_type = mx.float32 if w_dtype is not None else mx.bfloat16
    x, w, g = inputs((257, n), 9, w_dtype=w_dtype, g_dtype=out_type)
    w = None if w_dtype is None else w
    y, gx, gw = run(x, w, g)
    assert y.dtype == out_type
    assert rel_err(y, ref_forward(x, w, 1e-5)) <= TOL[out_type]
    check_against_float64(x, w, g, (y, gx, gw), TOL[mx.bfloat16], 1e-5)


# The one-wave forward (decode: plans::kForwardOneWave): every row of its
# table, N between rows (idle lanes: 1536, 3000) and just past it (5128),
# and row counts on both sides of one wave (132 SMs on the H200: 132 rows
# are one wave of its block-per-row rows, 133 are not).
ONE_WAVE_N = [256, 1024, 1536, 2048, 2560, 3000, 4096, 5120, 5128]


@pytest.mark.parametrize("rows", [1, 7, 132, 133])
@pytest.mark.parametrize("n", ONE_WAVE_N)
@pytest.mark.parametrize("dtype,w_dtype", [(mx.bfloat16, mx.bfloat16), (mx.float16, mx.float16),
                                           (mx.float32, mx.float32), (mx.bfloat16, mx.float32),
                                           (mx.bfloat16, None)],
                         ids=["bf16", "f16", "f32", "bf16-f32w", "bf16-no-w"])
def test_one_wave_forward(rows, n, dtype, w_dtype):
    x = random((1, rows, n), dtype, rows + n)
    w = None if w_dtype is None else random((n,), w_dtype, n, 0.5, 1.0)
    y = mlx_rmsnorm.rms_norm(x, w, 1e-5, stream=mx.gpu)
    builtin = mx.fast.rms_norm(x, w, 1e-5, stream=mx.gpu)
    mx.eval(y, builtin)
    assert y.dtype == builtin.dtype and y.shape == x.shape
    # y is formed in fp32 and rounded once: within one rounding of float64
    # (fp32 outputs: within a few fp32 roundings), and of the built-in
    ref = ref_forward(x, w, 1e-5)
    tol = 1e-6 if y.dtype == mx.float32 else ONE_ROUNDING[y.dtype] + 1e-6
    assert rel_err(y, ref) <= tol
    assert rel_err(y, to_numpy(builtin), np.abs(ref).max()) <= 2 * tol


@pytest.mark.parametrize("n", [64, 1024, 8192])
def test_unaligned_inputs(n):
    """A flat slice that starts one element in breaks 16-byte alignment."""
    m = 100
    x = random((m * n + 1,), mx.bfloat16, 12)[1:].reshape(m, n)
    g = random((m * n + 1,), mx.bfloat16, 13)[1:].reshape(m, n)
    w = random((n + 1,), mx.bfloat16, 14)[1:]
    check_against_float64(x, w, g, run(x, w, g), TOL[mx.bfloat16], ONE_ROUNDING[mx.bfloat16])


BENCHMARK_SHAPES = [(16384, 8192), (16384, 4096), (32768, 2048), (65536, 1024), (262144, 128),
                    (4096, 8192), (16384, 2880), (8192, 16384), (4096, 32768)]


@pytest.mark.parametrize("m,n", BENCHMARK_SHAPES + [(1000, 1)], ids=lambda v: str(v))
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_bitwise_deterministic(m, n, algorithm):
    """100 calls on the same inputs give the same bits (compared on the GPU)."""
    x, w, g = inputs((m, n), 15)
    y0, gx0, gw0 = (a.view(mx.uint16) for a in run(x, w, g, algorithm=algorithm))
    for _ in range(99):
        y, gx, gw = (a.view(mx.uint16) for a in run(x, w, g, algorithm=algorithm))
        same = mx.array_equal(y, y0) & mx.array_equal(gx, gx0) & mx.array_equal(gw, gw0)
        assert same.item()


@pytest.mark.parametrize("m,n", [(16384, 8192), (262144, 128), (16384, 2880), (8192, 16384)])
def test_matches_builtin_and_is_more_accurate(m, n):
    x, w, g = inputs((m, n), 18)
    y, gx, gw = run(x, w, g)
    _, (bgx, bgw) = mx.vjp(lambda x, w: mx.fast.rms_norm(x, w, 1e-5), [x, w], [g])
    by = mx.fast.rms_norm(x, w, 1e-5)
    ref_gx, ref_gw = ref_backward(x, w, g, 1e-5)
    tol = TOL[mx.bfloat16]
    assert rel_err(y, np.array(by.astype(mx.float32), dtype=np.float64)) <= tol
    assert rel_err(gx, np.array(bgx.astype(mx.float32), dtype=np.float64)) <= tol
    assert rel_err(gw, np.array(bgw.astype(mx.float32), dtype=np.float64)) <= 5 * tol
    assert rel_err(gw, ref_gw) <= max(rel_err(bgw, ref_gw), ONE_ROUNDING[mx.bfloat16])


@pytest.mark.bigmem
@pytest.mark.parametrize("n", [8192, 32768], ids=["persistent", "split"])
def test_more_than_2_31_elements(n):
    """M * N above 2^31: every offset past the int32 range must be right. The
    rows repeat a block of 64 random rows, so the float64 reference of the
    whole problem comes from that block (gw: 64 rows' sums times the repeats)
    and the rows past 2^31 elements are compared one by one."""
    block, repeats = 64, (2**31 // n) // 64 + 1
    m = block * repeats
    assert m * n > 2**31
    xs = random((block, n), mx.bfloat16, 30)
    gs = random((block, n), mx.bfloat16, 31)
    w = random((n,), mx.bfloat16, 32, 0.5, 1.0)
    x = mx.tile(xs, (repeats, 1))
    g = mx.tile(gs, (repeats, 1))
    y, gx, gw = run(x, w, g)
    ref_gx, ref_gw_block = ref_backward(xs, w, gs, 1e-5)
    ref_y = ref_forward(xs, w, 1e-5)
    for rows in (slice(0, block), slice(m - block, m)):  # first and last block
        assert rel_err(y[rows], ref_y) <= TOL[mx.bfloat16]
        assert rel_err(gx[rows], ref_gx, gx_scale(xs, w, gs, 1e-5)) <= TOL[mx.bfloat16]
    assert rel_err(gw, ref_gw_block * repeats) <= ONE_ROUNDING[mx.bfloat16]
    del x, g, y, gx, gw


@pytest.mark.bigmem
def test_unsatisfiable_allocation_raises():
    """An output that cannot fit in GPU memory is a Python error, not a hang
    or a crash, and the plugin keeps working afterwards. x (bf16) takes ~40%
    of the card and y (float32, from the float32 weight) would need ~80%."""
    total = mx.device_info().get("memory_size", 140 * 2**30)
    n = 16384
    m = int(total * 0.4) // (2 * n)
    x = mx.zeros((m, n), mx.bfloat16)
    mx.eval(x)
    w = mx.ones((n,), mx.float32)
    with pytest.raises(RuntimeError, match="allocat"):
        mx.eval(mlx_rmsnorm.rms_norm(x, w, 1e-5, stream=mx.gpu))
    del x
    mx.clear_cache()
    x = random((4, 64), mx.float32, 33)
    assert rel_err(mlx_rmsnorm.rms_norm(x, None, 1e-5, stream=mx.gpu), ref_forward(x, None, 1e-5)) <= TOL[mx.float32]


def test_one_kernel_with_growing_and_shrinking_rows():
    """A table row covers a range of N, so one kernel runs with different
    amounts of shared memory: larger after smaller must still launch."""
    for n in (256, 248, 256, 8192, 7000, 8192):
        x, w, g = inputs((3, n), 34)
        check_against_float64(x, w, g, run(x, w, g), TOL[mx.bfloat16],
                              ONE_ROUNDING[mx.bfloat16], n)


def test_small_grids_after_long_rows():
    """MLX updates a cached CUDA graph in place with the next graph of the
    same node keys. A cluster launch (rows past one SM's shared memory)
    followed by plain kernels in the same positions must still run every
    kernel: with both recorded as "K" nodes the update kept the cluster
    shape, the plain kernel did not run and gx stayed stale. The cases
    alternate cluster and plain backward graphs of the same node count (the
    walk, then the gw column sum), odd grids among them, twice over."""
    cases = [((256, 32768), mx.bfloat16), ((5, 32), mx.float32), ((3, 96), mx.float32),
             ((40, 65536), mx.bfloat16), ((999, 128), mx.float32), ((3, 256), mx.bfloat16),
             ((5, 2880), mx.float32), ((7, 131072), mx.bfloat16), ((33, 16384), mx.bfloat16),
             ((64, 32768), mx.float32), ((1, 8192), mx.bfloat16), ((3, 262144), mx.bfloat16),
             ((2, 131072), mx.float32)]
    if mlx_rmsnorm.gpu_family() >= 90:
        # the order above is the failure's only where the long rows are clusters
        assert _ext._backward_kernels(256, 32768, mx.bfloat16)[0] == ("bwd_persistent_cluster", 2)
        assert _ext._backward_kernels(5, 32, mx.float32)[0] == ("bwd_persistent", 1)
    if holds_cluster_of_16():
        assert longest_cluster_nvec() == 32768
        assert _ext._backward_kernels(3, 262144, mx.bfloat16)[0] == ("bwd_persistent_cluster", 16)
        assert _ext._backward_kernels(7, 131072, mx.bfloat16)[0] == ("bwd_persistent_cluster", 16)
    for i, (shape, dtype) in enumerate(cases + cases):
        x, w, g = inputs(shape, 40 + 3 * i, dtype)
        check_against_float64(x, w, g, run(x, w, g), TOL[dtype], 2 * TOL[dtype], shape)


# Row lengths of every backward plan: the persistent rows, the cluster rows
# past N = 16384 (sm_90: clusters of 2 to 16; N = 131072 and 262144 take the
# split plan where clusters of 16 do not run).
BATCH_N = [128, 1024, 8192, 16384, 32768, 65536, 131072, 262144]
BATCH_OPS = ["rms_norm", "add_rms_norm", "layer_norm", "add_layer_norm"]


def _norm_outputs(op, x, r, w, b, g, g2):
    """The op's outputs (y, and h with add) and gx for the rows x (and r)."""
    def f(x_, r_):
        if op == "rms_norm":
            return [mlx_rmsnorm.rms_norm(x_, w, 1e-5)]
        if op == "add_rms_norm":
            return list(mlx_rmsnorm.add_rms_norm(x_, r_, w, 1e-5))
        if op == "layer_norm":
            return [mlx_rmsnorm.layer_norm(x_, w, b, 1e-5)]
        return list(mlx_rmsnorm.add_layer_norm(x_, r_, w, b, 1e-5))

    outs, (gx, _) = mx.vjp(f, [x, r], [g, g2][: 2 if op.startswith("add") else 1])
    mx.eval(outs, gx)
    return outs + [gx]


@pytest.mark.xdist_group(LARGE_GROUP)
@pytest.mark.parametrize("op", BATCH_OPS)
@pytest.mark.parametrize("n", BATCH_N)
def test_batch_invariant(op, n):
    """A row's outputs and gx have the same bits whether it is computed
    alone, in a batch of 7 or among hundreds to 4096 rows: the plans and a
    row's reduction order depend on N and the dtypes, never on M or the
    grid (only gw's partials follow the grid)."""
    m = max(300, min(4096, 2**26 // n))
    x, w, g = inputs((m, n), 70)
    r = random((m, n), mx.bfloat16, 73)
    b = random((n,), mx.bfloat16, 74)
    g2 = random((m, n), mx.bfloat16, 75)
    row = m // 2 + 1
    with mx.stream(mx.gpu):
        def of_rows(lo, hi):
            got = _norm_outputs(op, x[lo:hi], r[lo:hi], w, b, g[lo:hi], g2[lo:hi])
            return [a[row - lo] for a in got]

        among_all = of_rows(0, m)
        for lo, hi in [(row, row + 1), (row - 3, row + 4)]:
            for k, (a, want) in enumerate(zip(of_rows(lo, hi), among_all)):
                assert mx.array_equal(a, want).item(), (op, n, (lo, hi), k)


# The forward's cluster rows (N past one block, sm_90) read w however it
# comes: in x's dtype at an aligned base (LayerNorm without b reads it as
# x-typed vectors), fp32, a view one element in, or no w. Each read gives the
# same fp32 values, so y has the same bits whichever runs.
@pytest.mark.parametrize("op,offset", [("rms_norm", 0.0), ("rms_norm", 1.0), ("layer_norm", 0.0)],
                         ids=["rms-w", "rms-1+w", "layer-w"])
@pytest.mark.parametrize("n", [65536, 131072, 262144])
def test_cluster_rows_read_w_every_way(n, offset, op):
    x = random((5, n), mx.bfloat16, n)
    w = random((n,), mx.bfloat16, n + 1, 0.5, 1.0)
    w_view = mx.concatenate([w[:1], w])[1:]  # 2 bytes past an aligned base
    with mx.stream(mx.gpu):
        def y_of(wt):
            if op == "layer_norm":
                y = mlx_rmsnorm.layer_norm(x, wt, None, 1e-5)
            else:
                y = mlx_rmsnorm.rms_norm(x, wt, 1e-5, offset=offset)
            mx.eval(y)
            return y.astype(mx.bfloat16)  # (fp32 w: an fp32 y, rounded once here)

        y = y_of(w)
        if op == "rms_norm":
            ref = ref_forward(x, w.astype(mx.float32) + offset, 1e-5)
        else:
            xd = to_numpy(x)
            d = xd - xd.mean(-1, keepdims=True)
            ref = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * to_numpy(w)
        assert rel_err(y, ref) <= TOL[mx.bfloat16]
        for other in (w.astype(mx.float32), w_view):
            assert mx.array_equal(y_of(other), y).item()
        if offset == 0.0:
            assert mx.array_equal(y_of(None), y_of(mx.ones((n,), mx.bfloat16))).item()


def test_gpu_family_is_the_built_code():
    """The planner's family is that of the code the GPU runs: a PTX-only
    build for compute_80 (or compute_75) on a Hopper GPU runs the family-80
    (75) paths and plans. MLX_RMSNORM_EXPECT_FAMILY, set by the check that
    builds such a build, says which one this build must report."""
    import os

    expected = os.environ.get("MLX_RMSNORM_EXPECT_FAMILY")
    family = mlx_rmsnorm.gpu_family()
    assert family in (75, 80, 90)
    if expected:
        assert family == int(expected)
