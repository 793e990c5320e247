"""The report (MLX_RMSNORM_REPORT=1, --report): what each number counts,
forward-only work (through the extension's op counter),
and a line saying which implementation the default device runs wherever
that is not our kernels: the CPU, patched or not, and a GPU without our
CUDA kernels (a Mac's Metal, or a CPU build of the plugin)."""

import contextlib
import os
import subprocess
import sys
import textwrap

import mlx.core as mx
import pytest

import mlx_rmsnorm
from mlx_rmsnorm import _autopatch, _ext

FAKE_COUNTS = {"RMSNormPlugin": 7, "AddRMSNormPlugin": 1, "LayerNormPlugin": 3, "AddLayerNormPlugin": 0,
               "builtin_rms_norm": 11, "builtin_layer_norm": 2}


def _lines():
    return _autopatch.summary().splitlines()


def test_each_line_says_what_it_counts():
    lines = _lines()
    assert all(ln.startswith("mlx_rmsnorm report: ") for ln in lines)
    assert lines[0].endswith("(nodes of each primitive in the graphs that mx.grad, mx.value_and_grad "
                             "and mx.vjp made)")
    assert "(calls of mlx-lm decoder blocks under patch(fuse=True)" in lines[1]
    assert lines[2].startswith("mlx_rmsnorm report: forward ops built, every call (eager or traced, "
                               "with or without a gradient): RMSNormPlugin=")


def test_forward_only_work_is_counted_through_the_op_counter(monkeypatch):
    monkeypatch.setattr(_ext, "_op_counts", lambda: dict(FAKE_COUNTS), raising=False)
    line = _lines()[2]
    assert line.startswith("mlx_rmsnorm report: forward ops built, every call (eager or traced, "
                           "with or without a gradient): ")
    assert ("RMSNormPlugin=7 AddRMSNormPlugin=1 LayerNormPlugin=3 AddLayerNormPlugin=0 (ours); "
            "builtin_rms_norm=11 builtin_layer_norm=2 (calls that ran MLX's mx.fast op in place of ours: "
            "routed calls on a stream that runs the built-in, export traces, rows no plan of ours "
            "covers)") in line
    # a counter that lacks a key reads 0 for it
    monkeypatch.setattr(_ext, "_op_counts", lambda: {"RMSNormPlugin": 2})
    assert "RMSNormPlugin=2 AddRMSNormPlugin=0 " in _lines()[2]


def _device_lines():
    return _lines()[3:]


@pytest.fixture
def on_cpu():
    if mx.default_device() != mx.cpu:
        pytest.skip("the default device here is not the CPU")
    was = mlx_rmsnorm.route_cpu(False)
    yield
    mlx_rmsnorm.route_cpu(was)


def test_cpu_line_unpatched(on_cpu):
    (line,) = _device_lines()
    assert "the default stream is the CPU and nothing is patched: MLX's own norm ran" in line
    assert "builtin_RMSNorm and builtin_LayerNorm (and their VJPs) stay 0 there" in line


def test_cpu_line_patched(on_cpu):
    with mlx_rmsnorm.patched():
        (line,) = _device_lines()
        assert "the default stream is the CPU, where patch() runs MLX's own norm" in line
        mlx_rmsnorm.route_cpu(True)
        (line,) = _device_lines()
        assert "the default stream is the CPU, where patch() runs the plugin's CPU path" in line


def test_gpu_without_our_kernels(monkeypatch):
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.gpu))
    monkeypatch.setattr(mlx_rmsnorm, "has_cuda_kernels", lambda: False)
    for patched in (False, True):
        with mlx_rmsnorm.patched() if patched else contextlib.nullcontext():
            (line,) = _device_lines()
            assert ("the default device is a GPU and this build has no CUDA kernels of ours "
                    "(has_cuda_kernels() is False): mx.fast's norms (nn.RMSNorm, nn.LayerNorm) run MLX's own op "
                    "there, patched or not") in line
    monkeypatch.setattr(mlx_rmsnorm, "has_cuda_kernels", lambda: True)
    assert _device_lines() == []  # our kernels: nothing to add


def test_report_alone_on_the_cpu_says_why_the_builtin_counts_zero(tmp_path):
    if mx.default_device() != mx.cpu:
        pytest.skip("the default device here is not the CPU")
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import mlx.core as mx, mlx.nn as nn
        model = nn.Sequential(nn.Linear(8, 16), nn.RMSNorm(16), nn.Linear(16, 1))
        step = nn.value_and_grad(model, lambda m, x: m(x).square().mean())
        mx.eval(step(model, mx.random.normal((4, 8))))
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_RMSNORM_")}
    r = subprocess.run([sys.executable, "-c", "import mlx_rmsnorm; exec(open('train.py').read())"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={**env, "MLX_RMSNORM_REPORT": "1"})
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("mlx_rmsnorm report:")]
    assert "patched=False gradient_graphs=1 RMSNormPlugin=0 RMSNormPluginVJP=0 builtin_RMSNorm=0 " in lines[0]
    assert "the default stream is the CPU and nothing is patched" in lines[-1], lines


def test_a_failing_counter_does_not_break_the_report(monkeypatch):
    def broken():
        raise RuntimeError("no counts")

    monkeypatch.setattr(_ext, "_op_counts", broken, raising=False)
    assert _lines()[2] == "mlx_rmsnorm report: could not read the extension's op counter (no counts)"
