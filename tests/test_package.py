"""The package as users and packagers see it: the public namespace, the
version (one source for the package and its metadata), the licence in the
sdist, and the editable build's up-to-date check (build_backend/dev_build.py)
that lets a second ./run.sh skip the build."""

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import types
from pathlib import Path

import pytest

import mlx_rmsnorm

ROOT = Path(__file__).resolve().parent.parent


def _dev_build():
    spec = importlib.util.spec_from_file_location("dev_build_under_test", ROOT / "build_backend" / "dev_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_namespace_is_the_public_api():
    names = set(dir(mlx_rmsnorm))
    for leaked in ("mx", "nn", "annotations", "np"):
        assert leaked not in names
    public = {n for n in names if not n.startswith("_")}
    submodules = {n for n in public if isinstance(getattr(mlx_rmsnorm, n), types.ModuleType)
                  and getattr(mlx_rmsnorm, n).__name__ == f"mlx_rmsnorm.{n}"}
    assert public - submodules == set(mlx_rmsnorm.__all__)
    for name in mlx_rmsnorm.__all__:
        assert getattr(mlx_rmsnorm, name) is not None


def test_has_cuda_kernels_is_a_function_like_is_patched():
    assert callable(mlx_rmsnorm.has_cuda_kernels) and callable(mlx_rmsnorm.is_patched)
    value = mlx_rmsnorm.has_cuda_kernels()
    assert isinstance(value, bool)
    from mlx_rmsnorm import _build_info

    assert value == (_build_info.MLX_FLAVOR or "").startswith("cuda")


def test_version_is_the_metadata_version():
    assert mlx_rmsnorm.__version__ == importlib.metadata.version("mlx-rmsnorm")
    # one place writes it: pyproject.toml reads it from mlx_rmsnorm/_version.py
    text = (ROOT / "pyproject.toml").read_text()
    assert '"version"' in text.split("dynamic = ", 1)[1].split("\n", 1)[0]
    assert 'version = {attr = "mlx_rmsnorm._version.__version__"}' in text
    assert not any(line.startswith("version =") for line in text.split("[project]", 1)[1].split("\n[", 1)[0].splitlines())


def test_sdist_carries_the_licence_and_the_version(tmp_path):
    # An sdist of the tracked files, as the PEP 517 hook builds it (no MLX needed).
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.splitlines()
    src = tmp_path / "src"
    for name in files:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path / "dist"
    dist.mkdir()
    code = "import sys, mlx_rmsnorm_build as b; print(b.build_sdist(sys.argv[1]))"
    r = subprocess.run([sys.executable, "-c", code, str(dist)], cwd=src, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(src / "build_backend")}, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    name = r.stdout.strip().splitlines()[-1]
    with tarfile.open(dist / name) as tar:
        members = {m.split("/", 1)[1] for m in tar.getnames() if "/" in m}
        pkg_info = tar.extractfile(f"{name[:-len('.tar.gz')]}/PKG-INFO").read().decode()
    assert "LICENSE" in members
    assert "build_backend/dev_build.py" in members and "mlx_rmsnorm/_version.py" in members
    assert "License-Expression: MIT" in pkg_info
    assert f"Version: {mlx_rmsnorm.__version__}" in pkg_info
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_tree_hash_follows_sources_and_ignores_caches(tmp_path, monkeypatch):
    d = _dev_build()
    for name in ("CMakeLists.txt", "setup.py", "mlx_rmsnorm/csrc/a.cpp", "cuda/k.cu"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    monkeypatch.setattr(d, "ROOT", tmp_path)
    first = d.tree_hash()
    assert d.tree_hash() == first
    (tmp_path / "mlx_rmsnorm" / "csrc" / "__pycache__").mkdir()
    (tmp_path / "mlx_rmsnorm" / "csrc" / "__pycache__" / "x.pyc").write_text("cache")
    assert d.tree_hash() == first
    (tmp_path / "cuda" / "k.cu").write_text("changed")
    assert d.tree_hash() != first
    (tmp_path / "cuda" / "k.cu").write_text("cuda/k.cu")
    assert d.tree_hash() == first
    (tmp_path / "cuda" / "k.cu").rename(tmp_path / "cuda" / "k2.cu")  # a rename is a change
    assert d.tree_hash() != first


def test_tree_hash_leaves_out_the_command_line_tools(tmp_path, monkeypatch):
    # cuda/cli is built only top-level or with MLX_RMSNORM_BUILD_CLI: an edit
    # there does not make the extension (or a prebuilt one) stale, unless the
    # build is asked for the tools.
    d = _dev_build()
    for name in ("CMakeLists.txt", "cuda/k.cu", "cuda/cli/bench.cu"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    monkeypatch.setattr(d, "ROOT", tmp_path)
    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    first = d.tree_hash()
    (tmp_path / "cuda" / "cli" / "bench.cu").write_text("changed")
    assert d.tree_hash() == first
    (tmp_path / "cuda" / "k.cu").write_text("changed")
    assert d.tree_hash() != first
    monkeypatch.setenv("CMAKE_ARGS", "-DMLX_RMSNORM_BUILD_CLI=ON")
    with_cli = d.tree_hash()
    (tmp_path / "cuda" / "cli" / "bench.cu").write_text("changed again")
    assert d.tree_hash() != with_cli


def test_stamp_follows_mlx_and_build_settings(monkeypatch):
    d = _dev_build()
    info = {"version": "0.32.4", "flavor": "cpu", "backend_version": "0.32.4", "mlx_root": "/m", "python": "/p"}
    base = d.stamp(info, "3.1.0").split()[0]
    assert d.stamp(dict(info), "3.1.0").split()[0] == base
    assert d.stamp({**info, "version": "0.32.3"}, "3.1.0").split()[0] != base
    assert d.stamp({**info, "flavor": "cuda13"}, "3.1.0").split()[0] != base
    assert d.stamp(info, "3.0.0").split()[0] != base
    monkeypatch.setenv("MLX_RMSNORM_CUDA_ARCHS", "90")
    assert d.stamp(info, "3.1.0").split()[0] != base
    assert d.build_dir(info) == ROOT / "build" / "cpu-0.32.4"


def test_missing_tools():
    d = _dev_build()
    pytest_version = importlib.metadata.version("pytest")
    assert d.missing(["pytest", f"pytest=={pytest_version}", "numpy>=1"]) == []
    assert d.missing(["pytest<1", "no-such-distribution-here"]) == ["pytest<1", "no-such-distribution-here"]


def test_editable_build_of_this_checkout_is_current():
    # ./run.sh built this checkout and wrote the stamp: a second ./run.sh
    # finds nothing to rebuild. (Fails after an edit of the C++/CUDA sources
    # that was not built: the extension under test is not the tree's.)
    d = _dev_build()
    if not d._editable_install_of_this_checkout():
        pytest.skip("not the editable install of this checkout")
    assert d.why_rebuild() is None
