"""The build of a checkout that is worked on: where it lives, and whether it
is up to date. Used by setup.py, ./run.sh and scripts/gpu_run.sh.

An editable (or in-place) build compiles in a folder that stays,
``build/<flavor>-<mlx version>/`` (CMake's cache, the objects), so the next
build recompiles only what changed; a regular build (``pip install .``, a
wheel) compiles in a fresh temporary folder. After an editable build,
setup.py writes a stamp beside the extension (``mlx_rmsnorm/.built-tree``):
a hash of every input of the build (the C++/CUDA sources, the CMake files,
the build scripts, the version), the MLX built against, the interpreter,
nanobind, and the settings read from the environment. ``./run.sh`` skips the
build altogether (pip included) while that stamp matches the tree as it is
and the environment holds the editable install of this checkout.

    python build_backend/dev_build.py up-to-date     exit 0, or 1 with the reason
    python build_backend/dev_build.py missing REQ... the requirements not installed
    python build_backend/dev_build.py tree-hash      the hash of the build's inputs

Light on purpose (no setuptools, no mlx import): ./run.sh runs it every time.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import importlib.util
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = ROOT / "mlx_rmsnorm" / ".built-tree"
# What the extension is built from. A change anywhere here rebuilds (CMake
# and ninja/make then recompile only what depends on the change).
INPUTS = ("CMakeLists.txt", "setup.py", "pyproject.toml", "build_backend", "cuda",
          "mlx_rmsnorm/csrc", "mlx_rmsnorm/_mlx_env.py", "mlx_rmsnorm/_version.py")
# The build settings the environment passes (setup.py and the CMake files read them).
SETTINGS = ("MLX_RMSNORM_CUDA_ARCHS", "CMAKE_ARGS", "CMAKE_GENERATOR", "DEBUG", "CUDACXX")


def _mlx_env():
    spec = importlib.util.spec_from_file_location("_mlx_rmsnorm_mlx_env", ROOT / "mlx_rmsnorm" / "_mlx_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tree_hash() -> str:
    """sha256 of the build inputs: each file's path and contents."""
    h = hashlib.sha256()
    files = []
    # The command-line tools (benches, tuners) are not part of the extension:
    # cuda/CMakeLists.txt builds them only as the top-level project or with
    # MLX_RMSNORM_BUILD_CLI, so an edit of one does not make the extension
    # stale (nor a prebuilt one: scripts/device_prebuild.sh keys it by this hash).
    with_cli = "MLX_RMSNORM_BUILD_CLI" in os.environ.get("CMAKE_ARGS", "")
    cli = ROOT / "cuda" / "cli"
    for name in INPUTS:
        path = ROOT / name
        if path.is_dir():
            files += [p for p in path.rglob("*") if p.is_file()
                      and "__pycache__" not in p.parts and p.suffix != ".pyc"
                      and (with_cli or cli not in p.parents)]
        elif path.is_file():
            files.append(path)
    for path in sorted(files):
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def build_dir(info: dict) -> Path:
    """The editable build's CMake folder for ``info``'s MLX."""
    return ROOT / "build" / f"{info.get('flavor') or 'mlx'}-{info['version']}"


def stamp(info: dict, nanobind_version: str | None) -> str:
    """One line that changes when anything the build depends on does."""
    what = {
        "tree": tree_hash(),
        "mlx": [info.get(k) for k in ("version", "flavor", "backend_version", "mlx_root")],
        "python": info.get("python"),
        "nanobind": nanobind_version,
        "settings": {k: os.environ.get(k) for k in SETTINGS},
    }
    digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]
    return f"{digest} mlx {info.get('version')} ({info.get('flavor')}), nanobind {nanobind_version}"


def write_stamp(line: str) -> None:
    """Records ``line`` (the :func:`stamp` taken *before* the build began: a
    source saved while the build ran must make the next ./run.sh build again,
    not be vouched for by a stamp of the tree as it is afterwards)."""
    STAMP.write_text(line + "\n")


def _editable_install_of_this_checkout() -> bool:
    # Every mlx-rmsnorm on the path: the build's own mlx_rmsnorm.egg-info in
    # the checkout comes first when the checkout is the current folder.
    for dist in md.distributions(name="mlx-rmsnorm"):
        try:
            url = json.loads(dist.read_text("direct_url.json") or "{}")
        except ValueError:
            continue
        if url.get("dir_info", {}).get("editable") and url.get("url") == ROOT.as_uri():
            return True
    return False


def why_rebuild() -> str | None:
    """Why the editable build of this checkout is not current for this
    interpreter's environment, or None when it is."""
    if not STAMP.is_file():
        return "no build of this checkout yet"
    if not list((ROOT / "mlx_rmsnorm").glob("_ext.*")) or not (ROOT / "mlx_rmsnorm" / "_build_info.py").is_file():
        return "the extension is missing"
    if not _editable_install_of_this_checkout():
        return "this environment has no editable install of this checkout"
    info = _mlx_env().probe()
    if not info.get("version"):
        return "no MLX installed"
    try:
        nanobind = md.version("nanobind")
    except md.PackageNotFoundError:
        nanobind = None
    recorded = STAMP.read_text().split("\n", 1)[0].split(" ", 1)
    now = stamp(info, nanobind).split(" ", 1)
    if recorded[0] != now[0]:
        if recorded[1:] != now[1:]:
            return f"built for {recorded[1] if recorded[1:] else '?'}, now {now[1]}"
        return "sources or build settings changed"
    return None


def missing(requirements: list[str]) -> list[str]:
    """The requirements that this environment does not satisfy."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
    out = []
    for text in requirements:
        req = Requirement(text)
        try:
            version = md.version(req.name)
        except md.PackageNotFoundError:
            out.append(text)
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            out.append(text)
    return out


if __name__ == "__main__":
    command, args = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if command == "up-to-date" and not args:
        why = why_rebuild()
        if why:
            print(why)
        raise SystemExit(1 if why else 0)
    if command == "tree-hash" and not args:
        print(tree_hash())
        raise SystemExit(0)
    if command == "missing":
        print(" ".join(missing(args)))
        raise SystemExit(0)
    raise SystemExit("usage: dev_build.py up-to-date | tree-hash | missing REQUIREMENT...")
