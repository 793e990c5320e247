"""The ops' contract at its edges, against a float64 NumPy reference and
against MLX's built-in (or its composition of plain ops): what patch() puts in
mx.fast's place on a CPU stream, empty arrays under every transform, jvp,
float64, vmap over the weight, grad-of-grad, add_rms_norm's broadcast
residual, and error messages that name the op and the argument."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_rmsnorm import _ext

EPS = 1e-5


# --- patch()'s routed functions -------------------------------------------


@pytest.fixture
def route_cpu():
    was = _ext._set_route_cpu(True)
    yield
    _ext._set_route_cpu(was)


def test_routed_signatures_are_mx_fast():
    for ours, theirs in [(_ext.routed_rms_norm, mx.fast.rms_norm),
                         (_ext.routed_layer_norm, mx.fast.layer_norm)]:
        head, doc = ours.__doc__.split("\n", 1)
        their_head, their_doc = theirs.__doc__.split("\n", 1)
        assert doc == their_doc
        assert head.split("(", 1)[1] == their_head.split("(", 1)[1]


def test_routed_cpu_is_the_builtin_bit_for_bit():
    # N = 4099 float32: MLX's own test_fast.py case where ours differs from
    # the built-in's composition in the last bits.
    mx.random.seed(3)
    x = mx.random.normal((8, 4099))
    w = mx.random.normal((4099,))
    b = mx.random.normal((4099,))
    assert not mx.array_equal(_ext.rms_norm(x, w, EPS), mx.fast.rms_norm(x, w, EPS))
    for s in ({}, {"stream": mx.cpu}, {"stream": mx.default_stream(mx.cpu)}):
        assert mx.array_equal(_ext.routed_rms_norm(x, w, EPS, **s), mx.fast.rms_norm(x, w, EPS))
        assert mx.array_equal(_ext.routed_layer_norm(x, w, b, EPS, **s),
                              mx.fast.layer_norm(x, w, b, EPS))
    # its gradients too, second order included
    def loss(f):
        return lambda x, w: (f(x, w, EPS) ** 2).sum()

    def gx2(f):
        return mx.grad(lambda x: mx.grad(loss(f))(x, w).sum())(x)

    for ours, theirs in [(mx.grad(loss(_ext.routed_rms_norm), argnums=(0, 1))(x, w),
                          mx.grad(loss(mx.fast.rms_norm), argnums=(0, 1))(x, w)),
                         ([gx2(_ext.routed_rms_norm)], [gx2(mx.fast.rms_norm)])]:
        for a, t in zip(ours, theirs):
            assert mx.array_equal(a, t)


def test_routed_cpu_flag_runs_the_plugin(route_cpu):
    mx.random.seed(4)
    x = mx.random.normal((8, 4099))
    w = mx.random.normal((4099,))
    b = mx.random.normal((4099,))
    assert _ext._set_route_cpu(True) is True
    assert mx.array_equal(_ext.routed_rms_norm(x, w, EPS), _ext.rms_norm(x, w, EPS))
    assert mx.array_equal(_ext.routed_layer_norm(x, w, b, EPS), _ext.layer_norm(x, w, b, EPS))
    xn = np.array(x, dtype=np.float64)
    want = xn / np.sqrt((xn ** 2).mean(-1, keepdims=True) + EPS) * np.array(w, dtype=np.float64)
    np.testing.assert_allclose(np.array(_ext.routed_rms_norm(x, w, EPS)), want, rtol=1e-5, atol=1e-5)
    assert _ext._set_route_cpu(False) is True
    assert mx.array_equal(_ext.routed_rms_norm(x, w, EPS), mx.fast.rms_norm(x, w, EPS))


def test_routed_arguments_are_mx_fast_arguments():
    x = mx.ones((2, 8))
    with pytest.raises(TypeError):
        _ext.routed_rms_norm(x, None, EPS, offset=1.0)
    y = _ext.routed_rms_norm(x=x, weight=None, eps=EPS, stream=mx.cpu)
    assert mx.array_equal(y, mx.fast.rms_norm(x, None, EPS))
    y = _ext.routed_layer_norm(x=x, weight=None, bias=None, eps=EPS, stream=mx.cpu)
    assert mx.array_equal(y, mx.fast.layer_norm(x, None, None, EPS))
