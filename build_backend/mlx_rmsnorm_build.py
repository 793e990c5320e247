"""PEP 517 build backend: setuptools, plus requirements that follow the MLX of
the environment being installed into.

Why not the usual ``requires = ["mlx[...]"]``: the extension links libmlx,
whose C++ ABI changes between releases and differs between the CPU and CUDA
flavors, so it has to be compiled against the very MLX it will load.
Installing a copy into pip's isolated build environment would need the right
version *and* flavor pinned before the build starts (pip does not tell the
backend where it installs), and for the CUDA flavor that copy drags in about
3 GB of CUDA libraries (cuBLAS, cuDNN, NCCL, ...) per build, which an offline
machine cannot fetch at all. Instead the build looks at the interpreter pip
runs the hooks with (``sys.executable``: the target environment's python,
also under build isolation, where only ``sys.path`` is swapped), reads that
environment's MLX from its metadata, and builds against its files. The
isolated environment only gets the build tools: setuptools, nanobind, cmake
when no usable one is found (see find_cmake), and nvcc from pip when the installed MLX is the CUDA
flavor and no nvcc is found (driver-only machines).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (the hooks we do not wrap)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PROBE = os.path.join(ROOT, "mlx_rmsnorm", "_mlx_env.py")

# nvcc from pip for the CUDA 13 flavor. nvidia-cuda-nvcc pulls in nvidia-nvvm
# (cicc) and nvidia-cuda-runtime (headers, cudart); crt and cccl hold the
# headers nvcc includes. All install into site-packages/nvidia/cu13, which is
# then laid out like a toolkit root.
PIP_NVCC_PACKAGES = {
    "cuda13": ["nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-cuda-cccl", "nvidia-nvvm", "nvidia-cuda-runtime"],
}
PIP_CUDA_SUBDIR = {"cuda13": "cu13"}
MIN_CMAKE = (3, 24)

# Installed beside the package (site-packages): honors the MLX_RMSNORM_*
# variables in any program of the environment (MLX_RMSNORM_REPORT alone counts
# the built-in's primitives of a program that never imports us). It runs at
# every interpreter start, so it only reads the environment and imports the
# package where MLX_RMSNORM_PATCH or MLX_RMSNORM_REPORT is on, or a variable
# holds a value the package refuses (the package then stops the program with
# its one-line error): the rules of mlx_rmsnorm/_autopatch.py (ON, OFF), which
# tests/test_variables.py checks this line against. Before the import it sets
# sys._mlx_rmsnorm_from_pth, which tells the package that it runs inside site
# at start-up (an exception there would be printed and the program run on);
# a second pass over the same site-packages (a venv's lib64 -> lib) does
# nothing.
PTH_NAME = "mlx_rmsnorm_autopatch.pth"
_PTH_OFF = "('', '0', 'false', 'no', 'off')"
_PTH_ON_OR_OFF = "('', '0', 'false', 'no', 'off', '1', 'true', 'yes', 'on')"
PTH_LINE = (
    "import os, sys; "
    "(lambda g: g('PATCH') not in " + _PTH_OFF + " or g('REPORT') not in " + _PTH_OFF
    + " or g('ROUTE_CPU') not in " + _PTH_ON_OR_OFF
    + " or not (g('FUSE_MIN_ROWS').isascii() and g('FUSE_MIN_ROWS').isdigit() or not g('FUSE_MIN_ROWS'))"
    " or g('ALLOCATOR') not in ('', 'pool', 'mlx'))"
    "(lambda v: os.environ.get('MLX_RMSNORM_' + v, '').strip().lower()) "
    "and 'mlx_rmsnorm' not in sys.modules "
    "and (setattr(sys, '_mlx_rmsnorm_from_pth', True), __import__('mlx_rmsnorm'))\n"
)

class NoMLXError(RuntimeError):
    pass


class UnsupportedMLXError(RuntimeError):
    """The installed MLX is outside the supported range, or its nanobind ABI
    is one no known nanobind builds: the build stops before it starts."""


def _mlx_env():
    """mlx_rmsnorm/_mlx_env.py as a module, without importing the package
    (which needs the extension being built)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_mlx_rmsnorm_mlx_env", _PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _probe_with(python: str) -> dict | None:
    # pip's build isolation works through PYTHONPATH (a sitecustomize that
    # drops the environment's site-packages) and PYTHONNOUSERSITE; -E ignores
    # both, so the probe sees the environment as it is.
    try:
        out = subprocess.run(
            [python, "-E", _PROBE], capture_output=True, text=True, check=True, timeout=120
        ).stdout
        return json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def target_mlx() -> dict:
    """The MLX of the environment being installed into (see the module doc).

    ``MLX_RMSNORM_PYTHON`` names that environment's interpreter explicitly,
    for front-ends that run the backend from a python of their own (``python
    -m build`` with isolation, uv); ``$VIRTUAL_ENV`` is tried last.
    """
    cached = os.environ.get("_MLX_RMSNORM_TARGET_MLX")
    if cached:
        return json.loads(cached)
    candidates = []
    if os.environ.get("MLX_RMSNORM_PYTHON"):
        candidates.append(os.environ["MLX_RMSNORM_PYTHON"])
    candidates.append(sys.executable)
    venv = os.environ.get("VIRTUAL_ENV")
    if venv:
        candidates.append(os.path.join(venv, "bin", "python"))
    tried = []
    for python in candidates:
        info = _probe_with(python)
        tried.append(python)
        if info and info.get("version") and info.get("mlx_root"):
            os.environ["_MLX_RMSNORM_TARGET_MLX"] = json.dumps(info)
            return info
    raise NoMLXError(
        "mlx-rmsnorm builds against the MLX already installed in the environment it is "
        f"installed into, and found none (looked with: {', '.join(dict.fromkeys(tried))}).\n"
        "Install MLX first, then install mlx-rmsnorm again:\n"
        "    pip install 'mlx[cpu]'      # CPU (Linux)\n"
        "    pip install 'mlx[cuda13]'   # NVIDIA GPU, CUDA 13\n"
        "If MLX is installed in another environment than the one running this build "
        "(python -m build, uv), set MLX_RMSNORM_PYTHON=/path/to/that/env/bin/python."
    )


def _pip_cuda_roots(info: dict) -> list[str]:
    # The build environment first (our own build requirement), then the target.
    sub = PIP_CUDA_SUBDIR.get(info.get("flavor") or "", "cu13")
    roots = []
    for entry in sys.path:
        root = os.path.join(entry, "nvidia", sub)
        if os.path.isfile(os.path.join(root, "bin", "nvcc")):
            roots.append(os.path.abspath(root))
    roots += [r for r in info.get("pip_cuda_roots", []) if r.endswith(sub)]
    return list(dict.fromkeys(roots))


def find_nvcc(info: dict) -> tuple[str, str | None] | None:
    """``(nvcc, toolkit root or None)``: $CUDACXX, then nvcc on PATH, then the
    pip packages (nvidia/cu13 in the build environment or the target)."""
    if os.environ.get("CUDACXX"):
        return os.environ["CUDACXX"], None
    on_path = shutil.which("nvcc")
    if on_path:
        return on_path, None
    for root in _pip_cuda_roots(info):
        return os.path.join(root, "bin", "nvcc"), root
    return None


def _cmake_version(cmake: str) -> tuple[int, int] | None:
    try:
        r = subprocess.run([cmake, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"version (\d+)\.(\d+)", r.stdout)
    return (int(m.group(1)), int(m.group(2))) if r.returncode == 0 and m else None


def find_cmake(info: dict) -> str | None:
    """A cmake >= MIN_CMAKE that runs in this process's environment, where the
    build runs it: every ``cmake`` on PATH, then the ``cmake`` package's binary
    in the build environment (our own requirement), then in the target
    environment (``info["cmake_bins"]``). Checked by running it because a
    ``cmake`` on PATH may be the package's entry-point script, which fails
    under pip's isolation (its module is not importable there)."""
    candidates = [os.path.join(d, "cmake") for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    candidates += [os.path.join(e, "cmake", "data", "bin", "cmake") for e in sys.path if e]
    candidates += info.get("cmake_bins", [])
    for cmake in dict.fromkeys(candidates):
        if os.path.isfile(cmake) and os.access(cmake, os.X_OK):
            version = _cmake_version(cmake)
            if version and version >= MIN_CMAKE:
                return os.path.abspath(cmake)
    return None


def _pip_nvcc_requirements(flavor: str) -> list[str]:
    # Same major as the MLX flavor; MLX_RMSNORM_PIP_NVCC_VERSION narrows it
    # (e.g. "==13.0.*" to match an older driver or the wheels one carries).
    spec = os.environ.get("MLX_RMSNORM_PIP_NVCC_VERSION", ">=13,<14")
    return [f"{name}{spec}" for name in PIP_NVCC_PACKAGES[flavor]]


def check_supported(info: dict) -> None:
    why = _mlx_env().unsupported(info)
    if why:
        raise UnsupportedMLXError(why)


def nanobind_requirement(info: dict) -> str:
    return _mlx_env().nanobind_requirement(info)


def nanobind_mismatch(info: dict, version: str | None, abi: int | None) -> str | None:
    """Why the nanobind of this build (``version``, building ABI ``abi``)
    cannot build against ``info``'s MLX, or None."""
    want = info.get("nanobind_abi")
    if want is None or abi == want:
        return None
    found = f"nanobind {version} (ABI v{abi})" if version else "no nanobind"
    return (
        f"mlx {info['version']}'s Python module uses nanobind ABI v{want}, and this build "
        f"has {found}; an extension built so would reject MLX's arrays. Install the "
        f"matching one, then build again: pip install '{nanobind_requirement(info)}' "
        "(`pip install .` with its isolated build, and ./run.sh, pick it by themselves).")


def _stop(error: Exception):
    # The message alone (pip shows the hook's output): no traceback.
    print(f"error: {error}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def _build_requirements() -> list[str]:
    try:
        info = target_mlx()
        check_supported(info)
    except (NoMLXError, UnsupportedMLXError) as e:
        _stop(e)
    # The nanobind of MLX's own ABI (an extension built with another one
    # imports and then rejects MLX's arrays).
    reqs = [nanobind_requirement(info)]
    if find_cmake(info) is None:
        reqs.append("cmake>=%d.%d" % MIN_CMAKE)
    flavor = info.get("flavor") or ""
    if flavor.startswith("cuda") and find_nvcc(info) is None:
        if flavor not in PIP_NVCC_PACKAGES:
            raise RuntimeError(
                f"MLX is the {flavor} flavor and there is no nvcc on PATH: install that CUDA "
                "toolkit, or set CUDACXX to its nvcc (nvcc from pip is used for cuda13 only)."
            )
        reqs += _pip_nvcc_requirements(flavor)
    return reqs


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(config_settings) + _build_requirements()


def get_requires_for_build_editable(config_settings=None):
    return _setuptools.get_requires_for_build_editable(config_settings) + _build_requirements()


def get_requires_for_build_sdist(config_settings=None):
    # An sdist is built anywhere: it pins nothing and needs no MLX.
    return _setuptools.get_requires_for_build_sdist(config_settings)


if __name__ == "__main__":
    if sys.argv[1:] != ["--pth"]:
        raise SystemExit("usage: mlx_rmsnorm_build.py --pth")
    # ./run.sh: its editable install gets no .pth from setuptools; it writes
    # this one into site-packages so that the variables work there too.
    sys.stdout.write(PTH_LINE)
    raise SystemExit(0)
