"""Property tests (hypothesis): random shapes biased to the launch-plan
boundaries, dtypes and mixed dtypes, eps, no weight, and non-contiguous or
misaligned layouts, against the float64 reference.

Profiles: "ci" (default; 40 cases per dtype and device, small, quick on a
CPU) and "gpu" (1000 cases per dtype, larger, GPU stream only):
MLX_RMSNORM_HYPOTHESIS_PROFILE=gpu."""

import os

import mlx.core as mx
import numpy as np
import pytest
from conftest import DEVICES, ONE_ROUNDING, TOL, gw_scale, gx_scale, ref_backward, ref_forward, rel_err

import mlx_rmsnorm

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

settings.register_profile("ci", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("gpu", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
PROFILE = os.environ.get("MLX_RMSNORM_HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)
MAX_ELEMS = 2_000_000 if PROFILE == "gpu" else 60_000

# Row lengths at and around every table threshold (in elements: 8 per
# 16-byte vector for 2-byte dtypes, 4 for float32) and past the tables.
_EDGES = sorted({e * k + d for e in (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
                 for k in (4, 8) for d in (-1, 0, 1, 8) if e * k + d > 0})
DTYPES = [mx.float32, mx.float16, mx.bfloat16]


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


def make(dtype, w_kind, m, n, layout, eps, seed):
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


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_random_problems_match_float64(device, dtype, data):
    if PROFILE == "gpu" and device == mx.cpu:
        pytest.skip("the gpu profile is for the GPU stream (CI covers the CPU)")
    problem = data.draw(problems(dtype))
    dtype, w_kind, m, n, layout, eps, seed = problem
    x, w, g, out_type = make(*problem)
    y = mlx_rmsnorm.rms_norm(x, w, eps, stream=device)
    gx, gw = mlx_rmsnorm.rms_norm_vjp(x, w, g, eps, stream=device)
    mx.eval(y, gx, gw)
    assert rel_err(y, ref_forward(x, w, eps)) <= TOL[out_type]
    ref_gx, ref_gw = ref_backward(x, w, g, eps)
    assert rel_err(gx, ref_gx, gx_scale(x, w, g, eps)) <= TOL[dtype]
    if w is None:
        assert gw is None
    else:
        # summed in fp32 over all rows, rounded once to w's dtype; the fp32
        # sum relative to the size of its terms (H200: 6.2e-6 of |gw| at
        # 2 rows x N = 1 whose terms nearly cancelled)
        assert rel_err(gw, ref_gw, gw_scale(x, g, eps)) <= max(ONE_ROUNDING[w.dtype], 2e-6 * np.sqrt(max(m, 1)))
