"""The lab (lab/, not in the wheel) as the GPU machine's steps and the docs
call it: scripts/gpu_run.sh's steps are its run_* functions, each listed by
--help with its description, and a name that is no step is refused before
anything runs; the lab's command lines parse."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU_RUN = os.path.join(ROOT, "scripts", "gpu_run.sh")


def _run(*args, **kwargs):
    return subprocess.run(list(args), capture_output=True, text=True, cwd=ROOT, timeout=120, **kwargs)


def test_gpu_run_lists_every_step_with_its_description():
    text = open(GPU_RUN).read()
    functions = re.findall(r"^run_([a-z_]+)\(\) ", text, re.M)
    assert len(functions) == len(set(functions)) >= 29
    # each step's description is the "#:" line right above its function
    described = re.findall(r"^#: .+\nrun_([a-z_]+)\(\) ", text, re.M)
    assert described == functions
    out = _run("bash", GPU_RUN, "--help")
    assert out.returncode == 0, out.stderr
    listed = re.findall(r"^   ([a-z-]+) +\S", out.stdout, re.M)
    assert listed == [f.replace("_", "-") for f in functions]
    assert "Build and tools" in out.stdout and "scripts/gpu_distributed_check.sh" in out.stdout


def test_gpu_run_refuses_an_unknown_step_first(tmp_path):
    out = _run("bash", GPU_RUN, "build", "nosuch", env=dict(os.environ, OUT=str(tmp_path / "out")))
    assert out.returncode == 2
    assert "unknown step 'nosuch'" in out.stdout and " bench-ln " in out.stdout
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


@pytest.mark.parametrize("module", ["lab.sweep", "lab.host_cost", "lab.cuda_calls", "lab.memory_check",
                                    "lab.sanitize_cases", "lab.decode_kernels", "lab.cpu_speed"])
def test_lab_command_lines_parse(module):
    out = _run(sys.executable, "-m", module, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage:")
