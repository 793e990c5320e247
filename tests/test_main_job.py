"""The main job (examples/train.py, what ./run.sh runs): the plugin column
runs the plugin on every machine -- on a CPU its CPU path, which patch()
alone would leave to MLX's own op -- and the output names the implementation
of each column and shows the plugin's primitives in the plugin's column."""

import os
import re
import subprocess
import sys
from pathlib import Path

import mlx.core as mx

import mlx_rmsnorm

ROOT = Path(__file__).resolve().parent.parent


def test_main_job_runs_the_plugin_and_says_which_implementation_ran():
    # Without the suite's MLX_RMSNORM_ROUTE_CPU (conftest): the example must
    # route the CPU itself, as it does for a user.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_RMSNORM_")}
    on_gpu = mx.is_available(mx.gpu) and mlx_rmsnorm.has_cuda_kernels()
    # On a GPU the job's own length (its first steps at 4096 x 1024 overshoot
    # before the loss falls below the first: 2.93, 6.96, 6.26, 5.35 on the
    # H200); on a CPU 4 of its 20 steps already show it.
    steps = [] if on_gpu else ["--steps", "4"]
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "train.py"), *steps],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    plugin = "mlx_rmsnorm CUDA kernels" if on_gpu else "mlx_rmsnorm CPU path"
    assert re.search(r"built-in: MLX's built-in \(mx\.fast\.rms_norm", out), out
    assert re.search(rf"plugin: {plugin}", out), out
    counts = {name: dict(re.findall(r"(\w+)=(\d+)", line))
              for name, line in re.findall(r"^ *(built-in|plugin): (RMSNormPlugin=.*)$", out, re.M)}
    assert set(counts) == {"built-in", "plugin"}, out
    # 4 blocks + the final norm: a forward and a VJP node each
    assert int(counts["plugin"]["RMSNormPlugin"]) == 5 and int(counts["plugin"]["RMSNormPluginVJP"]) == 5
    assert int(counts["built-in"]["RMSNormPlugin"]) == int(counts["built-in"]["RMSNormPluginVJP"]) == 0
    if on_gpu:  # MLX's own primitive on a GPU; plain ops on the CPU
        assert int(counts["built-in"]["builtin_RMSNorm"]) == 5
    assert "losses agree within" in out and ": yes" in out.splitlines()[-1], out
