"""Memory: many training-style steps (forward + mx.grad through the plugin)
with the shape changing every step must keep mx.get_active_memory() flat --
no leak in our outputs, scratch or temporaries.

    python -m lab.memory_check [--steps 10000]
Run by scripts/gpu_run.sh (step memory) on the GPU; runs on the CPU too.
"""

import argparse
import sys
import time

import mlx.core as mx
import numpy as np

import mlx_rmsnorm

NS = [1, 33, 128, 1000, 2880, 4096, 4099, 8192, 20000]


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--max-rows", type=int, default=2048)
    args = p.parse_args()
    device = mx.gpu if mx.is_available(mx.gpu) and mlx_rmsnorm.has_cuda_kernels() else mx.cpu
    mx.set_default_device(device)
    rng = np.random.default_rng(0)
    weights = {n: mx.ones((n,), mx.float32) for n in NS}

    def loss(x, w):
        return (mlx_rmsnorm.rms_norm(x, w, 1e-5) ** 2).sum()

    grad = mx.grad(loss, argnums=(0, 1))
    samples = []
    for step in range(args.steps):
        n = NS[step % len(NS)]
        m = int(rng.integers(1, max(2, args.max_rows * 8192 // (n * 4))))
        dtype = (mx.bfloat16, mx.float16, mx.float32)[step % 3]
        x = mx.random.normal((m, n)).astype(dtype)
        gx, gw = grad(x, weights[n])
        mx.eval(gx, gw)
        del x, gx, gw
        if step % max(1, args.steps // 20) == 0 or step == args.steps - 1:
            # MLX releases a step's buffers from a completion callback, just
            # after mx.eval returns: let it finish before reading the counters.
            mx.synchronize()
            time.sleep(0.05)
            pool_in_use, pool_reserved = mlx_rmsnorm.device_memory()
            samples.append((step, mx.get_active_memory(), pool_in_use, pool_reserved))
    print(f"device {device}: bytes every {max(1, args.steps // 20)} steps "
          "(MLX active memory; the plugin's own GPU pool: in use, reserved)")
    for step, mem, used, reserved in samples:
        print(f"  step {step:6d}: MLX {mem:12d}   pool {used:10d} {reserved:12d}")
    # After the first tenth (caches warm), the live set must not grow. The
    # pool's reservation is a cache that grows to the largest step seen, so
    # it only has to settle: no growth over the second half.
    ok = True
    for name, column, start in (("MLX active", 1, args.steps // 10),
                                ("pool in use", 2, args.steps // 10),
                                ("pool reserved", 3, args.steps // 2)):
        steady = [s for s in samples if s[0] >= start]
        growth = max(s[column] for s in steady) - steady[0][column]
        flat = growth <= 1 << 20
        ok &= flat
        print(f"{name} growth from step {steady[0][0]}: {growth} bytes "
              f"({'flat' if flat else 'GROWING'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
