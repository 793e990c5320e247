"""The suite on machines it was not written on: under `pytest -n` (xdist) the
GPU cases with large tensors form one xdist group, so that `--dist loadgroup`
runs them one at a time (tests/conftest.py says why). Checked by collecting
tests/test_gpu.py, which works without a GPU: the marks are set at
collection."""

import os
import subprocess
import sys

from conftest import LARGE_ELEMENTS, LARGE_GROUP

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def collected(*args):
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        *args, "tests/test_gpu.py"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return {line.strip() for line in r.stdout.splitlines() if "::" in line}


def test_large_gpu_cases_share_one_xdist_group():
    everything = collected()
    grouped = collected("-m", "xdist_group")
    # the case that raised under -n 8, and the other benchmark shapes
    assert "tests/test_gpu.py::test_bitwise_deterministic[naive-4096-32768]" in grouped
    assert "tests/test_gpu.py::test_matches_builtin_and_is_more_accurate[16384-8192]" in grouped
    assert "tests/test_gpu.py::test_bf16_shapes[262144x128-auto]" in grouped
    # small ones stay spread over the workers
    assert "tests/test_gpu.py::test_bitwise_deterministic[naive-1000-1]" not in grouped
    assert "tests/test_gpu.py::test_bf16_shapes[4096x64-auto]" not in grouped
    assert grouped < everything and len(grouped) >= 30
    assert LARGE_GROUP == "gpu-large" and LARGE_ELEMENTS == 2**25


def test_gpu_run_runs_xdist_by_group():
    # one definition of the pytest-xdist options, used by every pytest call
    text = open(os.path.join(ROOT, "scripts", "gpu_run.sh")).read()
    assert text.count('echo "-n 8 --dist loadgroup"') == 1
    assert text.count("-n 8") == text.count("-n 8 --dist loadgroup")
    assert text.count("$XDIST") >= 3
