"""Which MLX an environment holds: version, flavor, where its files are.

Read from package metadata and the file system, never by importing
``mlx.core``: the CUDA flavor's core needs ``libcuda``, which a build machine
without a GPU driver lacks. Used at build time (run as a script with the
target environment's interpreter, printing JSON) and at import time (the
version check in ``_build_info``'s caller).
"""

from __future__ import annotations

import glob
import importlib.metadata as _md
import importlib.util as _util
import json
import os
import re
import sys

# The distribution that carries libmlx on each platform, by the extra of
# ``mlx`` that pulls it in. Order: which one counts when several are present.
BACKENDS = (
    ("cuda13", "mlx-cuda-13"),
    ("cuda12", "mlx-cuda-12"),
    ("cpu", "mlx-cpu"),
    ("metal", "mlx-metal"),
)

# Extras that exist as `mlx[...]` (Metal comes with plain `mlx` on macOS).
EXTRA_OF_FLAVOR = {"cuda13": "cuda13", "cuda12": "cuda12", "cpu": "cpu"}


# The MLX releases this package builds against (inclusive), by flavor. The
# build stops outside them (MLX_RMSNORM_ANY_MLX=1 lets it try anyway). CPU:
# built and run against 0.31.2 and 0.32.4, the sources compile against the
# headers of 0.32.0-0.32.3. CUDA: the GPU glue (device_memory.cpp) uses
# allocator::Data, new in MLX 0.32.4, and only 0.32.4 was run on a GPU.
SUPPORTED_MLX = ("0.31.2", "0.32.4")  # the CPU build's range, and the sdist's pin
SUPPORTED_MLX_CUDA = ("0.32.4", "0.32.4")


def supported_range(flavor: str | None) -> tuple[str, str]:
    return SUPPORTED_MLX_CUDA if (flavor or "").startswith("cuda") else SUPPORTED_MLX


def describe_supported() -> str:
    lo, hi = SUPPORTED_MLX
    clo, chi = SUPPORTED_MLX_CUDA
    cuda = chi if clo == chi else f"{clo} to {chi}"
    return f"MLX {lo} to {hi} (CPU build), {cuda} (CUDA build)"

# nanobind's internals ABI -> the nanobind releases that build it. MLX's own
# Python module carries its ABI in a tag string ("v21_system_libstdcpp_..."
# from nanobind 2.x, "..._a1_v22" from 3.x); an extension built with another
# ABI imports fine and then rejects MLX's arrays ("incompatible function
# arguments"), so the build takes the nanobind of MLX's ABI. Read from each
# nanobind release's NB_INTERNALS_VERSION: 2.12 v19, 2.13-2.14 v20, 2.15 v21,
# 3.0-3.1 v22 (MLX 0.31.2 v19, 0.32.0-0.32.1 v20, 0.32.2 v21, 0.32.3-0.32.4 v22).
NANOBIND_FOR_ABI = {
    19: "nanobind>=2.12,<2.13",
    20: "nanobind>=2.13,<2.15",
    21: "nanobind>=2.15,<2.16",
    22: "nanobind>=3.0,<3.2",
}

# A platform part every nanobind tag has (compiler and C++ library), then
# the ABI number at the start (2.x) or the end (3.x).
_NB_TAG = re.compile(
    rb"(?:^|\x00)(v(\d+)_[A-Za-z0-9_]*?(?:libstdcpp|libcpp|mscver|mingw)[A-Za-z0-9_]*"
    rb"|[A-Za-z0-9_]*?(?:libstdcpp|libcpp|mscver|mingw)[A-Za-z0-9_]*?_v(\d+)(?:_stable)?(?:_ft)?)\x00")


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", v)[:3])


def nanobind_abi(mlx_root: str | None) -> int | None:
    """The nanobind ABI of MLX's Python module (mlx/core*.so), read from the
    tag string nanobind compiles into it; None when there is none to read."""
    if not mlx_root:
        return None
    for path in sorted(glob.glob(os.path.join(mlx_root, "core*.so")) +
                       glob.glob(os.path.join(mlx_root, "core*.pyd"))):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        for m in _NB_TAG.finditer(data):
            return int(m.group(2) or m.group(3))
    return None


def nanobind_internals_version(source_dir: str) -> int | None:
    """The ABI a nanobind installation builds (NB_INTERNALS_VERSION in its
    sources, ``nanobind.source_dir()``)."""
    for name in ("nb_internals.h", "nb_abi.h"):
        try:
            with open(os.path.join(source_dir, name)) as f:
                m = re.search(r"#\s*define\s+NB_INTERNALS_VERSION\s+(\d+)", f.read())
        except OSError:
            continue
        if m:
            return int(m.group(1))
    return None


def _install_command(info: dict) -> str:
    extra = EXTRA_OF_FLAVOR.get(info.get("flavor") or "", "cpu")
    return f"pip install 'mlx[{extra}]=={supported_range(info.get('flavor'))[1]}'"


def unsupported(info: dict) -> str | None:
    """Why mlx-rmsnorm cannot be built against ``info``'s MLX, or None."""
    lo, hi = supported_range(info.get("flavor"))
    what = f"mlx {info['version']}" + (f" ({info['flavor']})" if info.get("flavor") else "")
    fix = (f"Install a supported MLX, then mlx-rmsnorm again: {_install_command(info)}"
           + (f" (or any release from {lo} to {hi})." if lo != hi else "."))
    if os.environ.get("MLX_RMSNORM_ANY_MLX", "") not in ("", "0"):
        if info.get("nanobind_abi") in NANOBIND_FOR_ABI:
            return None
    elif not _version_tuple(lo) <= _version_tuple(info["version"]) <= _version_tuple(hi):
        return (f"mlx-rmsnorm supports {describe_supported()}, and {what} is installed. {fix} "
                "MLX_RMSNORM_ANY_MLX=1 tries the build anyway.")
    abi = info.get("nanobind_abi")
    if abi not in NANOBIND_FOR_ABI:
        seen = f"nanobind ABI v{abi}" if abi else "no nanobind ABI tag"
        return (f"{what}: its Python module has {seen} (in mlx/core*.so), for which "
                f"mlx-rmsnorm knows no nanobind release (it knows v{min(NANOBIND_FOR_ABI)}-"
                f"v{max(NANOBIND_FOR_ABI)}). {fix}")
    return None


def nanobind_requirement(info: dict) -> str:
    """The nanobind to build against ``info``'s MLX with (see NANOBIND_FOR_ABI)."""
    return NANOBIND_FOR_ABI[info["nanobind_abi"]]


def _version(dist: str) -> str | None:
    try:
        return _md.version(dist)
    except _md.PackageNotFoundError:
        return None


def installed_mlx() -> dict:
    """The installed MLX: ``version`` (None without MLX), ``flavor`` (None
    for a source build with no backend distribution), ``backend_version``."""
    info = {"version": _version("mlx"), "flavor": None, "backend_version": None}
    for flavor, dist in BACKENDS:
        v = _version(dist)
        if v is not None:
            info["flavor"], info["backend_version"] = flavor, v
            break
    return info


def _namespace_dirs(name: str) -> list[str]:
    try:
        spec = _util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [os.path.abspath(d) for d in spec.submodule_search_locations]


def requirement(info: dict) -> str:
    """The ``mlx`` requirement a wheel built against ``info`` must carry."""
    extra = EXTRA_OF_FLAVOR.get(info.get("flavor") or "")
    name = f"mlx[{extra}]" if extra else "mlx"
    return f"{name}=={info['version']}"


def probe() -> dict:
    """Everything the build needs to know about this environment's MLX."""
    info = installed_mlx()
    mlx_dirs = _namespace_dirs("mlx")
    info["python"] = sys.executable
    info["mlx_root"] = next(
        (d for d in mlx_dirs if os.path.isfile(os.path.join(d, "share/cmake/MLX/MLXConfig.cmake"))),
        None,
    )
    info["nanobind_abi"] = nanobind_abi(info["mlx_root"])
    nvidia = _namespace_dirs("nvidia")
    info["cudnn_root"] = next(
        (os.path.join(d, "cudnn") for d in nvidia if os.path.isfile(os.path.join(d, "cudnn/include/cudnn.h"))),
        None,
    )
    # A pip toolkit someone installed into this environment (nvidia-cuda-nvcc).
    info["pip_cuda_roots"] = [
        os.path.join(d, sub) for d in nvidia for sub in ("cu13", "cu12") if os.path.isfile(os.path.join(d, sub, "bin/nvcc"))
    ]
    # The `cmake` package's own binary. Its bin/cmake is a Python entry point
    # that imports the package, which pip's isolated build hides, so the
    # build has to call the binary itself.
    info["cmake_bins"] = [
        os.path.join(d, "data", "bin", "cmake") for d in _namespace_dirs("cmake")
        if os.path.isfile(os.path.join(d, "data", "bin", "cmake"))
    ]
    return info


if __name__ == "__main__":
    if sys.argv[1:] == ["--nanobind-requirement"]:
        # ./run.sh: the nanobind to install, or why this MLX is not supported
        found = probe()
        if not found.get("version"):
            sys.exit("no MLX installed")
        why = unsupported(found)
        if why:
            sys.exit(f"error: {why}")
        print(nanobind_requirement(found))
    else:
        json.dump(probe(), sys.stdout)
