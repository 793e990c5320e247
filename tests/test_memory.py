"""The plugin's own GPU memory pool, as reported by device_memory()."""

import time

import mlx.core as mx
import pytest
from conftest import GPU_AVAILABLE, random

import mlx_rmsnorm


def settle():
    """MLX releases buffers from a completion callback just after eval."""
    mx.synchronize()
    time.sleep(0.05)


@pytest.mark.skipif(mlx_rmsnorm.has_cuda_kernels, reason="CPU-flavor build only")
def test_no_pool_without_cuda_kernels():
    mx.eval(mlx_rmsnorm.rms_norm(random((4, 8), mx.float32, 1), None, 1e-5))
    assert mlx_rmsnorm.device_memory() == (0, 0)
    mlx_rmsnorm.trim_device_memory()  # a no-op, not an error


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_AVAILABLE, reason="needs MLX CUDA + kernels")
def test_pool_counts_our_outputs_and_gives_them_back():
    # bf16 x with a float32 weight gives a float32 y: no input to donate, so
    # y comes from the pool.
    x = random((1024, 4096), mx.bfloat16, 2)
    w = mx.ones((4096,), mx.float32)
    mx.eval(x, w)
    settle()
    before, _ = mlx_rmsnorm.device_memory()
    y = mlx_rmsnorm.rms_norm(x, w, 1e-5, stream=mx.gpu)
    mx.eval(y)
    settle()
    held, reserved = mlx_rmsnorm.device_memory()
    assert held - before >= y.nbytes
    assert reserved >= held
    del y
    settle()
    after, _ = mlx_rmsnorm.device_memory()
    assert after == before
    mlx_rmsnorm.trim_device_memory()
    assert mlx_rmsnorm.device_memory()[1] <= reserved
