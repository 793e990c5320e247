"""Where a call runs (mlx_rmsnorm/csrc/routing.h) and how many ran where.

The routing rule is a pure function (``_ext._route``), tested here for every
device kind, with and without kernels, on any machine: a stream this build
has no kernels for (a Metal GPU, a GPU of a CPU-flavor build) goes to MLX's
own op, like a CPU stream without ``route_cpu``. ``_ext._op_counts`` counts
the forward primitives of ours that the ops build and the calls that ran
MLX's op instead.
"""

import itertools
import os
import tempfile

import mlx.core as mx
import pytest

from conftest import graph_text
import mlx_rmsnorm
from mlx_rmsnorm import _ext

KEYS = {"RMSNormPlugin", "AddRMSNormPlugin", "LayerNormPlugin", "AddLayerNormPlugin",
        "builtin_rms_norm", "builtin_layer_norm"}


@pytest.mark.parametrize(
    "kind, has_kernels, route_cpu",
    list(itertools.product(["cpu", "gpu"], [True, False], [True, False])),
)
def test_route_rule(kind, has_kernels, route_cpu):
    # ours only where this build has kernels, and on a CPU stream only when
    # asked to (route_cpu); MLX's op everywhere else
    expected = "plugin" if has_kernels and (kind == "gpu" or route_cpu) else "builtin"
    assert _ext._route(kind, has_kernels, route_cpu) == expected


def test_route_rejects_other_kinds():
    with pytest.raises(ValueError, match="device_kind"):
        _ext._route("metal", True, False)


def test_this_build_routes_gpu_by_its_kernels():
    # This build's GPU streams: ours exactly when it has the CUDA kernels.
    assert (_ext._route("gpu", _ext.has_cuda_kernels, False) == "plugin") == _ext.has_cuda_kernels


def counts_after(fn):
    before = _ext._op_counts()
    fn()
    after = _ext._op_counts()
    return {k: after[k] - before[k] for k in after}


def only(**expected):
    return {k: expected.get(k, 0) for k in KEYS}


def test_op_counts_keys():
    counts = _ext._op_counts()
    assert set(counts) == KEYS
    assert all(isinstance(v, int) and v >= 0 for v in counts.values())


def test_op_counts_forward_ops():
    x = mx.random.normal((4, 64))
    w = mx.ones((64,))
    b = mx.zeros((64,))
    cpu = mx.cpu
    assert counts_after(lambda: _ext.rms_norm(x, w, 1e-5, stream=cpu)) == only(RMSNormPlugin=1)
    assert counts_after(lambda: _ext.add_rms_norm(x, x, w, 1e-5, stream=cpu)) == only(AddRMSNormPlugin=1)
    assert counts_after(lambda: _ext.layer_norm(x, w, b, 1e-5, stream=cpu)) == only(LayerNormPlugin=1)
    assert counts_after(lambda: _ext.add_layer_norm(x, x, w, b, 1e-5, stream=cpu)) == only(AddLayerNormPlugin=1)
    # a backward op builds no forward primitive
    assert counts_after(lambda: _ext.rms_norm_vjp(x, w, x, 1e-5, stream=cpu)) == only()
    # float64 runs MLX ops of ours (the reference), neither a primitive nor mx.fast
    x64 = x.astype(mx.float64, stream=cpu)  # (float64 exists on the CPU only)
    assert counts_after(lambda: mx.eval(_ext.rms_norm(x64, w, 1e-5, stream=cpu))) == only()


def test_op_counts_traced_once_per_trace():
    x = mx.random.normal((4, 64))
    w = mx.ones((64,))
    f = mx.compile(lambda x: _ext.rms_norm(x, w, 1e-5, stream=mx.cpu))
    # traced at the first call; the compiled graph replays without calling the op
    assert counts_after(lambda: mx.eval(f(x))) == only(RMSNormPlugin=1)
    assert counts_after(lambda: mx.eval(f(x + 1))) == only()


def test_routed_calls_count_where_they_ran():
    x = mx.random.normal((4, 64))
    w = mx.ones((64,))
    b = mx.zeros((64,))
    was = _ext._set_route_cpu(False)
    try:
        # a CPU stream without route_cpu: MLX's op
        c = counts_after(lambda: _ext.routed_rms_norm(x, w, 1e-5, stream=mx.cpu))
        assert c == only(builtin_rms_norm=1)
        c = counts_after(lambda: _ext.routed_layer_norm(x, w, b, 1e-5, stream=mx.cpu))
        assert c == only(builtin_layer_norm=1)
        assert "RMSNormPlugin" not in graph_text(_ext.routed_rms_norm(x, w, 1e-5, stream=mx.cpu))
        _ext._set_route_cpu(True)
        c = counts_after(lambda: _ext.routed_rms_norm(x, w, 1e-5, stream=mx.cpu))
        assert c == only(RMSNormPlugin=1)
        c = counts_after(lambda: _ext.routed_layer_norm(x, w, b, 1e-5, stream=mx.cpu))
        assert c == only(LayerNormPlugin=1)
        assert "RMSNormPlugin" in graph_text(_ext.routed_rms_norm(x, w, 1e-5, stream=mx.cpu))
    finally:
        _ext._set_route_cpu(was)


def test_export_trace_counts_builtin():
    x = mx.random.normal((4, 64))
    w = mx.ones((64,))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "f.mlxfn")
        was = _ext._set_export_tracing(True)
        try:
            c = counts_after(lambda: mx.export_function(
                path, lambda x: _ext.add_rms_norm(x, x, w, 1e-5, stream=mx.cpu)[0], x))
        finally:
            _ext._set_export_tracing(was)
    assert c["builtin_rms_norm"] >= 1 and c["AddRMSNormPlugin"] == 0


def test_backward_kernels_takes_mlx_dtypes():
    """_ext._backward_kernels (the GPU tests' view of the backward's plan)
    takes MLX dtypes; a build without CUDA kernels plans nothing."""
    out = _ext._backward_kernels(4, 64, mx.bfloat16, mx.float32, add=True)
    if mlx_rmsnorm.has_cuda_kernels():
        assert out and all(isinstance(name, str) and cluster >= 1 for name, cluster in out)
    else:
        assert out == []
    with pytest.raises(TypeError):
        _ext._backward_kernels(4, 64, "bfloat16")

