"""Misuse of the public API raises a clear Python exception."""

import mlx.core as mx
import pytest

import mlx_rmsnorm

x = mx.ones((4, 8))
w = mx.ones((8,))


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: mlx_rmsnorm.rms_norm(mx.array(1.0), None, 1e-5), "at least 1 dimension"),
        (lambda: mlx_rmsnorm.rms_norm(x, mx.ones((3,)), 1e-5), "x has 8 and weight has 3"),
        (lambda: mlx_rmsnorm.rms_norm(x, mx.ones((1, 8)), 1e-5), "1 dimension but has 2"),
        (lambda: mlx_rmsnorm.rms_norm(x.astype(mx.int32), None, 1e-5), "unsupported type int32"),
        (lambda: mlx_rmsnorm.rms_norm(x.astype(mx.int8), w.astype(mx.int8), 1e-5), "unsupported type int8"),
        (lambda: mlx_rmsnorm.rms_norm(x.astype(mx.complex64), None, 1e-5), "unsupported type complex64"),
        (lambda: mlx_rmsnorm.rms_norm_vjp(x, w, mx.ones((4, 7)), 1e-5), "g must have the shape of x"),
        (lambda: mlx_rmsnorm.rms_norm_vjp(x, mx.ones((9,)), x, 1e-5), "x has 8 and weight has 9"),
        (lambda: mlx_rmsnorm.rms_norm_vjp(x, w, x.astype(mx.int32), 1e-5), "floating array but has dtype int32"),
        (lambda: mlx_rmsnorm.rms_norm_vjp(x, w, x, 1e-5, algorithm="fast"), "algorithm must be one of"),
    ],
)
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_wrong_argument_types_raise_type_error():
    with pytest.raises(TypeError):
        mlx_rmsnorm.rms_norm([1.0, 2.0], None, 1e-5)
    with pytest.raises(TypeError):
        mlx_rmsnorm.rms_norm(x, w, "eps")
    with pytest.raises(TypeError):
        mlx_rmsnorm.rms_norm(x, w, 1e-5, stream="cuda")


@pytest.mark.skipif(mlx_rmsnorm.has_cuda_kernels(), reason="CPU-flavor build only")
def test_gpu_stream_without_kernels_is_a_clear_error():
    if not mx.is_available(mx.gpu):
        with pytest.raises((ValueError, RuntimeError)):
            mx.eval(mlx_rmsnorm.rms_norm(x, w, 1e-5, stream=mx.gpu))


def test_gpu_family_without_kernels_or_device():
    import mlx_rmsnorm

    if not mlx_rmsnorm.has_cuda_kernels():
        assert mlx_rmsnorm.gpu_family() == 0
    else:
        with pytest.raises(RuntimeError, match="no CUDA device"):
            mlx_rmsnorm.gpu_family(1000)
