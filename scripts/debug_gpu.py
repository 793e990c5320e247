import sys
import os; sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import mlx.core as mx
import numpy as np
from conftest import random, ref_backward, ref_forward, rel_err, gx_scale
import mlx_rmsnorm

cases = [("float16", 999, 128), ("bfloat16", 999, 128), ("float16", 333, 1024), ("float32", 16, 20000),
         ("float16", 16, 20000), ("bfloat16", 16, 20000), ("float32", 8, 32), ("float32", 999, 128)]
for pre_eval in (True, False):
    for dt, m, n in cases:
        t = getattr(mx, dt)
        x = random((m, n), t, 6); w = random((n,), t, 7, 0.5, 1.0); g = random((m, n), t, 8)
        if pre_eval:
            mx.eval(x, w, g)
        y = mlx_rmsnorm.rms_norm(x, w, 1e-5, stream=mx.gpu)
        mx.eval(y)
        gx, gw = mlx_rmsnorm.rms_norm_vjp(x, w, g, 1e-5, stream=mx.gpu)
        mx.eval(gx, gw)
        ry = ref_forward(x, w, 1e-5); rgx, rgw = ref_backward(x, w, g, 1e-5)
        e = lambda a, b, s=None: float(np.max(np.abs(np.array(a.astype(mx.float32), dtype=np.float64) - b)) / (s or np.max(np.abs(b))))
        print(f"pre_eval={pre_eval} {dt} {m}x{n}: y {e(y, ry):.2e} gx {e(gx, rgx, gx_scale(x,w,g,1e-5)):.2e} gw {e(gw, rgw):.2e}")
        ycpu = mlx_rmsnorm.rms_norm(x, w, 1e-5, stream=mx.cpu)
        print("   cpu y", f"{e(ycpu, ry):.2e}", "x equal on re-read:", np.array_equal(np.array(x.astype(mx.float32)), np.array(x.astype(mx.float32))))
