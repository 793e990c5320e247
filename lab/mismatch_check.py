"""On a GPU this build has no code for (e.g. an sm_80-only build on an H200),
every entry point must raise the RuntimeError that names the GPU, its compute
capability, the architectures built and the rebuild command; never a crash,
never the driver's bare message. Run with such a build importable first:

    MLX_RMSNORM_CUDA_ARCHS=80-real pip install --no-deps --target /tmp/t80 .
    cd /tmp && PYTHONPATH=/tmp/t80 python3 <repo>/lab/mismatch_check.py
(by path, from /tmp: the repository on sys.path would import its own build)
scripts/gpu_run.sh (step mismatch) does both on the GPU machine.
"""

import sys

import mlx.core as mx

import mlx_rmsnorm

def main():
    x = mx.ones((4, 1024), dtype=mx.bfloat16)
    w = mx.ones((1024,), dtype=mx.bfloat16)
    g = mx.ones((4, 1024), dtype=mx.bfloat16)
    calls = {
        "gpu_family()": lambda: mlx_rmsnorm.gpu_family(),
        "forward": lambda: mx.eval(mlx_rmsnorm.rms_norm(x, w, 1e-5)),
        "backward (mx.vjp)": lambda: mx.eval(
            mx.vjp(lambda x, w: mlx_rmsnorm.rms_norm(x, w, 1e-5), [x, w], [g])[1]),
    }
    print("module:", mlx_rmsnorm.__file__)
    failures = 0
    for name, call in calls.items():
        try:
            call()
            print(f"{name}: no error  <-- FAIL (this build was meant not to fit the GPU)")
            failures += 1
        except RuntimeError as e:
            msg = str(e)
            ok = all(s in msg for s in ("no GPU code for", "compute capability",
                                        "MLX_RMSNORM_CUDA_ARCHS=", "architectures"))
            print(f"{name}: RuntimeError: {msg}" + ("" if ok else "  <-- FAIL (not our message)"))
            failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
