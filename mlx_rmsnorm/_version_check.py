"""The extension links libmlx, whose C++ ABI changes between releases and
differs between flavors: refuse to load it next to another MLX than the one
it was built against (recorded in ``_build_info``, written by setup.py)."""

from __future__ import annotations

from ._mlx_env import installed_mlx

REBUILD = (
    "pip install --force-reinstall --no-deps --no-cache-dir <mlx-rmsnorm source>  "
    "(a checkout: `pip install --force-reinstall --no-deps .`, or `./run.sh` for its .venv; "
    "a git URL: `pip install --force-reinstall --no-deps --no-cache-dir git+<url>`)"
)


def _describe(version, flavor):
    return f"mlx {version}" + (f" ({flavor})" if flavor else "")


def mismatch(built: dict, now: dict) -> str | None:
    """Why ``built`` (what _build_info records) cannot load with ``now``."""
    if now["version"] is None:
        return (
            f"mlx-rmsnorm was built against {_describe(built['version'], built['flavor'])}, "
            "and no MLX is installed now. Install that MLX: "
            f"pip install 'mlx[{built['flavor']}]=={built['version']}'"
        )
    same_version = now["version"] == built["version"]
    same_flavor = not (built["flavor"] and now["flavor"]) or now["flavor"] == built["flavor"]
    same_backend = (
        not (built.get("backend_version") and now.get("backend_version") and same_flavor and built["flavor"])
        or now["backend_version"] == built["backend_version"]
    )
    if same_version and same_flavor and same_backend:
        return None
    now_desc = _describe(now["version"], now["flavor"])
    if same_version and same_flavor:
        now_desc += f" with its library at {now['backend_version']}"
    return (
        f"mlx-rmsnorm was built against {_describe(built['version'], built['flavor'])}, "
        f"but {now_desc} is installed; its C++ extension must be rebuilt against the "
        f"installed MLX: {REBUILD}"
    )


def check() -> None:
    try:
        from . import _build_info
    except ImportError:
        return  # built by hand with CMake: nothing was recorded
    built = {
        "version": _build_info.MLX_VERSION,
        "flavor": _build_info.MLX_FLAVOR,
        "backend_version": getattr(_build_info, "MLX_BACKEND_VERSION", None),
    }
    why = mismatch(built, installed_mlx())
    if why:
        raise ImportError(why)
