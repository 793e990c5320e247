"""The plugin's own GPU memory pool, as reported by device_memory()."""

import time

import mlx.core as mx
import pytest
from conftest import GPU_AVAILABLE, TOL, random, ref_backward, rel_err

import mlx_rmsnorm


def settle():
    """MLX releases buffers from a completion callback just after eval."""
    mx.synchronize()
    time.sleep(0.05)


@pytest.mark.skipif(mlx_rmsnorm.has_cuda_kernels(), reason="CPU-flavor build only")
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


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_AVAILABLE, reason="needs MLX CUDA + kernels")
def test_reused_blocks_give_right_answers():
    # Freed blocks are handed out again with no CUDA call. Rows 300..303 at
    # N = 1000 round into the same blocks, and 240 rows fit a 300-row block:
    # every call after the first reuses what the one before gave back, and
    # must still write every element (no stale values from the last owner).
    w = random((1000,), mx.float32, 9, 0.5, 1.0)
    mx.eval(w)
    grad = mx.grad(lambda x, w, g: (mlx_rmsnorm.rms_norm(x, w, 1e-5) * g).sum(), (0, 1))
    reserved = []
    for rnd in range(2):
        for i, m in enumerate((300, 301, 303, 240, 302)):
            x = random((m, 1000), mx.bfloat16, 10 + i, 1.0 + rnd)
            g = random((m, 1000), mx.bfloat16, 20 + i)
            gx, gw = grad(x, w, g)
            mx.eval(gx, gw)
            ref_gx, ref_gw = ref_backward(x, w, g, 1e-5)
            assert rel_err(gx, ref_gx) < TOL[mx.bfloat16], (rnd, m)
            assert rel_err(gw, ref_gw) < TOL[mx.float32] * 10, (rnd, m)
            del x, g, gx, gw
            settle()
        reserved.append(mlx_rmsnorm.device_memory()[1])
    # The second round is served from the first round's blocks.
    assert reserved[1] == reserved[0]
