"""Installing as a Python package: the recorded MLX and the ImportError on
another one, the pinned requirement, the build requirements the backend asks
for (nvcc from pip only when the CUDA flavor has no nvcc), and the .pth hook.
The isolated `pip install .` itself runs in .ci/run (a fresh venv, ~1 min)."""

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import build_backend as _backend

import mlx_rmsnorm
from mlx_rmsnorm import _mlx_env, _version_check

ROOT = Path(__file__).resolve().parent.parent


def _run(code, env_extra=None, cwd=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_RMSNORM_")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def test_build_info_records_the_installed_mlx():
    from mlx_rmsnorm import _build_info

    now = _mlx_env.installed_mlx()
    assert (_build_info.MLX_VERSION, _build_info.MLX_FLAVOR) == (now["version"], now["flavor"])
    import mlx.core as mx

    assert _build_info.MLX_VERSION == mx.__version__


def _copy_package(tmp_path, version, flavor):
    """The installed package (extension included) with another recorded MLX:
    exactly what an MLX upgrade leaves behind."""
    dst = tmp_path / "mlx_rmsnorm"
    shutil.copytree(Path(mlx_rmsnorm.__file__).parent, dst,
                    ignore=shutil.ignore_patterns("csrc", "__pycache__"))
    (dst / "_build_info.py").write_text(
        f"MLX_VERSION = {version!r}\nMLX_FLAVOR = {flavor!r}\nMLX_BACKEND_VERSION = {version!r}\n")
    return tmp_path


def test_import_with_another_mlx_raises_importerror(tmp_path):
    now = _mlx_env.installed_mlx()
    where = _copy_package(tmp_path, "0.29.1", now["flavor"])
    r = _run("import mlx_rmsnorm", cwd=where)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError:"), r.stderr
    assert "built against mlx 0.29.1" in last and f"mlx {now['version']}" in last
    assert "pip install --force-reinstall --no-deps" in last


def test_same_copy_with_the_right_record_imports(tmp_path):
    # The control of the test above: only the record differs.
    now = _mlx_env.installed_mlx()
    where = _copy_package(tmp_path, now["version"], now["flavor"])
    r = _run("import mlx_rmsnorm, mlx.core as mx; print(mlx_rmsnorm.__file__);"
             "print(mlx_rmsnorm.rms_norm(3 * mx.ones((2, 4)), None, 0.0).tolist())", cwd=where)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(str(where))
    # y = 3 * rsqrt(9) on the default device: on the GPU, one fp32 rounding
    # away from 1 (0.99999994), so not printed as exactly 1.0
    y = ast.literal_eval(r.stdout.splitlines()[1])
    assert len(y) == 2 and all(len(row) == 4 for row in y)
    assert all(abs(v - 1.0) <= 2**-22 for row in y for v in row), y


def test_other_flavor_is_a_mismatch():
    why = _version_check.mismatch({"version": "0.32.4", "flavor": "cpu", "backend_version": "0.32.4"},
                                  {"version": "0.32.4", "flavor": "cuda13", "backend_version": "0.32.4"})
    assert "mlx 0.32.4 (cpu)" in why and "mlx 0.32.4 (cuda13)" in why
    assert _version_check.mismatch({"version": "0.32.4", "flavor": "cpu", "backend_version": "0.32.4"},
                                   {"version": "0.32.4", "flavor": "cpu", "backend_version": "0.32.4"}) is None
    # libmlx of another release under the same front end is caught too.
    assert "0.32.5" in _version_check.mismatch(
        {"version": "0.32.4", "flavor": "cpu", "backend_version": "0.32.4"},
        {"version": "0.32.4", "flavor": "cpu", "backend_version": "0.32.5"})


def test_requirement_pins_version_and_flavor():
    assert _mlx_env.requirement({"version": "0.32.4", "flavor": "cpu"}) == "mlx[cpu]==0.32.4"
    assert _mlx_env.requirement({"version": "0.32.4", "flavor": "cuda13"}) == "mlx[cuda13]==0.32.4"
    assert _mlx_env.requirement({"version": "0.32.4", "flavor": "metal"}) == "mlx==0.32.4"
    assert _mlx_env.requirement({"version": "0.32.4", "flavor": None}) == "mlx==0.32.4"


def test_probe_sees_this_environment_through_pip_isolation(tmp_path):
    # pip's isolated build hides site-packages with a sitecustomize on
    # PYTHONPATH; the backend's probe (python -E) must still find MLX there.
    site = tmp_path / "site"
    site.mkdir()
    # The build environment: setuptools only (pip installs it there).
    build_env = tmp_path / "build_env"
    build_env.mkdir()
    for name in ("setuptools", "pkg_resources", "_distutils_hack"):
        spec = importlib.util.find_spec(name)
        if spec is not None:
            os.symlink(Path(spec.origin).parent, build_env / name)
    (site / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path[:] = [p for p in sys.path if 'site-packages' not in p] + [{str(build_env)!r}]
    """))
    backend_py = ROOT / "build_backend" / "mlx_rmsnorm_build.py"
    code = textwrap.dedent(f"""
        import importlib.util, json, sys
        try:
            import mlx
            print('mlx visible')
        except ImportError:
            pass
        sys.path.insert(0, {str(ROOT / 'build_backend')!r})
        spec = importlib.util.spec_from_file_location('b', {str(backend_py)!r})
        b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)
        print(json.dumps(b.target_mlx()))
    """)
    env = {"PYTHONPATH": str(site), "PYTHONNOUSERSITE": "1"}
    r = _run(code, env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "mlx visible" not in lines
    import json

    info = json.loads(lines[-1])
    assert info["version"] == _mlx_env.installed_mlx()["version"]
    assert os.path.isfile(os.path.join(info["mlx_root"], "share/cmake/MLX/MLXConfig.cmake"))


@pytest.mark.parametrize("flavor", ["cpu", "cuda13"])
@pytest.mark.parametrize("nvcc_on_path", [False, True])
def test_build_requirements(monkeypatch, tmp_path, flavor, nvcc_on_path):
    b = _backend()
    monkeypatch.setattr(b, "target_mlx", lambda: {"version": "0.32.4", "flavor": flavor, "pip_cuda_roots": [],
                                                  "nanobind_abi": 22})
    monkeypatch.setattr(b, "_pip_cuda_roots", lambda info: [])
    monkeypatch.delenv("CUDACXX", raising=False)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    if nvcc_on_path:
        (bindir / "nvcc").write_text("#!/bin/sh\n")
        (bindir / "nvcc").chmod(0o755)
    cmake = shutil.which("cmake")
    if cmake:
        os.symlink(cmake, bindir / "cmake")
    monkeypatch.setenv("PATH", str(bindir))
    reqs = b._build_requirements()
    assert "nanobind>=3.0,<3.2" in reqs  # MLX 0.32.4's nanobind ABI, v22
    assert ("cmake>=3.24" in reqs) == (b.find_cmake({}) is None)
    pip_nvcc = [r for r in reqs if r.startswith("nvidia-")]
    if flavor == "cuda13" and not nvcc_on_path:
        assert sorted(r.split(">")[0] for r in pip_nvcc) == sorted(b.PIP_NVCC_PACKAGES["cuda13"])
        assert all(r.endswith(">=13,<14") for r in pip_nvcc)
    else:
        assert pip_nvcc == []


def _executable(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_cmake_entry_point_failing_under_isolation_is_passed_over(monkeypatch, tmp_path):
    # The GPU machine's case: `cmake` on PATH is the cmake package's
    # entry-point script, which cannot import its module inside pip's
    # isolated build; the package's real binary is in the target environment.
    b = _backend()
    script = _executable(tmp_path / "bin" / "cmake",
                         f"#!{sys.executable}\nimport cmake_module_hidden_by_isolation\n")
    assert subprocess.run([str(script), "--version"], capture_output=True).returncode != 0
    site = tmp_path / "target_site"
    real = _executable(site / "cmake" / "data" / "bin" / "cmake", "#!/bin/sh\necho 'cmake version 3.31.6'\n")
    # The probe (run with the target python) reports the real binary.
    monkeypatch.delitem(sys.modules, "cmake", raising=False)
    monkeypatch.setattr(sys, "path", [str(site)])
    cmake_bins = _mlx_env.probe()["cmake_bins"]
    assert cmake_bins == [str(real)]
    # The build environment: the script first on PATH, no cmake package.
    monkeypatch.setattr(sys, "path", [str(tmp_path / "build_env")])
    monkeypatch.setenv("PATH", str(script.parent))
    info = {"version": "0.32.4", "flavor": "cpu", "pip_cuda_roots": [], "cmake_bins": cmake_bins,
            "nanobind_abi": 22}
    monkeypatch.setattr(b, "target_mlx", lambda: info)
    assert b.find_cmake(info) == str(real)
    assert not any(r.startswith("cmake") for r in b._build_requirements())
    # Nothing usable anywhere (the real binary too old): pip must fetch cmake.
    _executable(real, "#!/bin/sh\necho 'cmake version 3.22.1'\n")
    assert b.find_cmake(info) is None
    assert "cmake>=3.24" in b._build_requirements()


def test_find_nvcc_prefers_path_then_pip(monkeypatch, tmp_path):
    b = _backend()
    root = tmp_path / "site" / "nvidia" / "cu13"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "nvcc").write_text("")
    monkeypatch.delenv("CUDACXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site")])
    assert b.find_nvcc({"flavor": "cuda13", "pip_cuda_roots": []}) == (str(root / "bin" / "nvcc"), str(root))
    monkeypatch.setenv("CUDACXX", "/opt/cuda/bin/nvcc")
    assert b.find_nvcc({"flavor": "cuda13", "pip_cuda_roots": []}) == ("/opt/cuda/bin/nvcc", None)


@pytest.mark.parametrize("env,imported,patched,reported", [
    ({"MLX_RMSNORM_PATCH": "1"}, True, True, False),
    ({"MLX_RMSNORM_PATCH": "0"}, False, False, False),
    ({}, False, False, False),
    # the report alone (README): counts the built-in's primitives, unpatched
    ({"MLX_RMSNORM_REPORT": "1"}, True, False, True),
    ({"MLX_RMSNORM_PATCH": "1", "MLX_RMSNORM_REPORT": "1"}, True, True, True),
    # on a CPU stream patch() keeps MLX's own op unless routed (route_cpu)
    ({"MLX_RMSNORM_PATCH": "1", "MLX_RMSNORM_REPORT": "1", "MLX_RMSNORM_ROUTE_CPU": "1"}, True, True, True),
])
def test_pth_hook_at_interpreter_start(tmp_path, env, imported, patched, reported):
    b = _backend()
    (tmp_path / b.PTH_NAME).write_text(b.PTH_LINE)
    # addsitedir runs the .pth as site.py would at start-up; then a program
    # that never imports mlx_rmsnorm takes a gradient.
    code = textwrap.dedent(f"""
        import site, sys
        site.addsitedir({str(tmp_path)!r})
        print('mlx_rmsnorm' in sys.modules)
        import mlx.core as mx, mlx.nn as nn
        print('mlx_rmsnorm' in sys.modules and sys.modules['mlx_rmsnorm'].is_patched())
        layer = nn.RMSNorm(16)
        mx.eval(mx.grad(lambda x: layer(x).sum())(mx.ones((2, 16))))
    """)
    r = _run(code, env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(imported), str(patched)]
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("mlx_rmsnorm report:")]
    assert bool(line) == reported, r.stderr
    if reported:
        assert f"patched={patched} gradient_graphs=1" in line[0]
        import mlx.core as mx

        on_gpu = mx.default_device() == mx.gpu and mlx_rmsnorm.has_cuda_kernels()
        ours = patched and (on_gpu or env.get("MLX_RMSNORM_ROUTE_CPU") == "1")
        assert ("RMSNormPluginVJP=1" in line[0]) == ours
        # which implementation the CPU stream ran: a line wherever the default
        # stream is the CPU, patched or not
        notes = [ln for ln in line if "the default stream is the CPU" in ln]
        assert len(notes) == (0 if mx.default_device() == mx.gpu else 1), r.stderr
        if notes:
            want = ("where patch() runs the plugin's CPU path" if ours else
                    "where patch() runs MLX's own norm" if patched else "nothing is patched: MLX's own norm ran")
            assert want in notes[0], r.stderr


def test_run_sh_writes_the_pth_of_a_regular_install():
    # ./run.sh's editable install gets the same hook (so the README's
    # variables work in .venv): the script prints the backend's line.
    text = (ROOT / "run.sh").read_text()
    assert "mlx_rmsnorm_build.py --pth" in text and "mlx_rmsnorm_autopatch.pth" in text
    b = _backend()
    r = subprocess.run([sys.executable, str(ROOT / "build_backend" / "mlx_rmsnorm_build.py"), "--pth"],
                       capture_output=True, text=True, check=True)
    assert r.stdout == b.PTH_LINE and b.PTH_NAME == "mlx_rmsnorm_autopatch.pth"


# --- the nanobind ABI of the installed MLX decides the build's nanobind --------
# A stand-in for an MLX release: a fresh venv whose site-packages hold an `mlx`
# package (its CMake config, a core module binary carrying the nanobind tag
# string of that release, as the real wheels do) and the two distributions'
# metadata. The tags are the ones read from mlx 0.31.2, 0.32.1, 0.32.2 and
# 0.32.4 (nanobind 2.x puts the ABI first, 3.x last).
TAG_2X = "v{abi}_system_libstdcpp_gxx_abi_1xxx_use_cxx11_abi_1"
TAG_3X = "nanobind_system_libstdcpp_gxx_abi_1xxx_use_cxx11_abi_1_a1_v{abi}"


def _fake_mlx_env(tmp_path, version, abi, tag=TAG_2X):
    env = tmp_path / f"mlx-{version}-v{abi}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    mlx = site / "mlx"
    (mlx / "share" / "cmake" / "MLX").mkdir(parents=True)
    (mlx / "share" / "cmake" / "MLX" / "MLXConfig.cmake").write_text("# stand-in\n")
    (mlx / "__init__.py").write_text("")
    # Other strings of the real binary around the tag: the decoys the
    # reader must pass over (a format string, C++ ABI symbols).
    strings = ["\x7fELF", "__nb_internals_%s_%s__", "__gxx_personality_v0",
               "_ZTVN10__cxxabiv117__class_type_infoE", tag.format(abi=abi), "nb_internals"]
    (mlx / f"core.cpython-{sys.version_info[0]}{sys.version_info[1]}-x86_64-linux-gnu.so").write_bytes(
        b"\x00".join(s.encode() for s in strings) + b"\x00")
    for dist in ("mlx", "mlx_cpu"):
        meta = site / f"{dist}-{version}.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n")
    return python


def _requires_for_build(python):
    """The backend's PEP 517 hook as pip calls it, for the environment of `python`."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / 'build_backend')!r})
        import mlx_rmsnorm_build as b
        print([r for r in b.get_requires_for_build_wheel() if r.startswith('nanobind')])
    """)
    return _run(code, {"MLX_RMSNORM_PYTHON": str(python)}, cwd=ROOT)


@pytest.mark.parametrize("version,abi,tag,nanobind", [
    ("0.31.2", 19, TAG_2X, "nanobind>=2.12,<2.13"),
    ("0.32.1", 20, TAG_2X, "nanobind>=2.13,<2.15"),
    ("0.32.2", 21, TAG_2X, "nanobind>=2.15,<2.16"),
    ("0.32.4", 22, TAG_3X, "nanobind>=3.0,<3.2"),
])
def test_build_takes_the_nanobind_of_the_installed_mlx(tmp_path, version, abi, tag, nanobind):
    python = _fake_mlx_env(tmp_path, version, abi, tag)
    probe = subprocess.run([str(python), "-E", str(ROOT / "mlx_rmsnorm" / "_mlx_env.py")],
                           capture_output=True, text=True, check=True).stdout
    assert '"nanobind_abi": %d' % abi in probe and f'"version": "{version}"' in probe
    r = _requires_for_build(python)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == str([nanobind])
    # ./run.sh asks the same question through the script
    r = subprocess.run([str(python), str(ROOT / "mlx_rmsnorm" / "_mlx_env.py"), "--nanobind-requirement"],
                       capture_output=True, text=True)
    assert (r.returncode, r.stdout.strip()) == (0, nanobind), r.stderr


@pytest.mark.parametrize("version,abi,why", [
    ("0.30.6", 18, "supports MLX 0.31.2 to 0.32.4 (CPU build), 0.32.4 (CUDA build), and mlx 0.30.6 (cpu) "
                   "is installed"),
    ("0.32.4", 23, "nanobind ABI v23 (in mlx/core*.so), for which mlx-rmsnorm knows no nanobind"),
])
def test_build_stops_at_once_on_an_unsupported_mlx(tmp_path, version, abi, why):
    python = _fake_mlx_env(tmp_path, version, abi)
    for r in (_requires_for_build(python),
              subprocess.run([str(python), str(ROOT / "mlx_rmsnorm" / "_mlx_env.py"), "--nanobind-requirement"],
                             capture_output=True, text=True)):
        assert r.returncode == 1
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and why in last, r.stderr
        assert "pip install 'mlx[cpu]==0.32.4'" in last and "Traceback" not in r.stderr


def test_a_build_with_the_wrong_nanobind_stops_naming_the_right_one():
    b = _backend()
    info = {"version": "0.32.1", "flavor": "cpu", "nanobind_abi": 20}
    why = b.nanobind_mismatch(info, "3.1.0", 22)
    assert "mlx 0.32.1's Python module uses nanobind ABI v20" in why
    assert "nanobind 3.1.0 (ABI v22)" in why and "pip install 'nanobind>=2.13,<2.15'" in why
    assert b.nanobind_mismatch(info, "2.14.0", 20) is None
    # the nanobind of this environment builds the installed MLX's own ABI
    import nanobind

    here = _mlx_env.probe()
    assert _mlx_env.nanobind_internals_version(nanobind.source_dir()) == here["nanobind_abi"]
    assert b.nanobind_mismatch(here, nanobind.__version__,
                               _mlx_env.nanobind_internals_version(nanobind.source_dir())) is None


def test_cuda_flavor_range_and_where_the_range_is_stated():
    # The CUDA glue needs MLX 0.32.4's C++ API: an older CUDA MLX stops too.
    why = _mlx_env.unsupported({"version": "0.32.2", "flavor": "cuda13", "nanobind_abi": 21})
    assert "mlx 0.32.2 (cuda13) is installed" in why and "pip install 'mlx[cuda13]==0.32.4'" in why
    assert _mlx_env.unsupported({"version": "0.32.2", "flavor": "cpu", "nanobind_abi": 21}) is None
    # The same range in the package metadata (pyproject's summary), the
    # sdist's requirement and the README.
    stated = _mlx_env.describe_supported()
    assert stated == "MLX 0.31.2 to 0.32.4 (CPU build), 0.32.4 (CUDA build)"
    def words(path):  # the text with its line breaks as spaces
        return " ".join((ROOT / path).read_text().split())

    assert stated in words("pyproject.toml")
    assert "SUPPORTED_MLX" in words("setup.py")
    assert stated in words("README.md") and stated in words("docs/install.md")
