"""Which MLX an environment holds: version, flavor, where its files are.

Read from package metadata and the file system, never by importing
``mlx.core``: the CUDA flavor's core needs ``libcuda``, which a build machine
without a GPU driver lacks. Used at build time (run as a script with the
target environment's interpreter, printing JSON) and at import time (the
version check in ``_build_info``'s caller).
"""

from __future__ import annotations

import importlib.metadata as _md
import importlib.util as _util
import json
import os
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
    json.dump(probe(), sys.stdout)
