# The build: CMake, against the MLX of the environment mlx-rmsnorm is installed
# into (found by build_backend/mlx_rmsnorm_build.py, which pip runs as the
# PEP 517 backend; `pip install --no-build-isolation .` and plain setuptools
# commands go through the same code). The built package records that MLX in
# mlx_rmsnorm/_build_info.py and pins it in its requirements.
#
# Where it compiles: an editable or in-place build (`pip install -e .`,
# ./run.sh) in build/<flavor>-<mlx version>/, which stays, so that the next
# build recompiles only what changed; a regular build (`pip install .`, a
# wheel) in a fresh temporary folder, removed afterwards (build_backend/
# dev_build.py says more).
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "build_backend"))
import dev_build  # noqa: E402
import mlx_rmsnorm_build as backend  # noqa: E402

def _target_or_none():
    try:
        info = backend.target_mlx()
        backend.check_supported(info)
        return info
    except backend.NoMLXError:
        # An sdist is built without MLX; it carries the open requirement and
        # is pinned when it is built into a wheel.
        if "sdist" in sys.argv[1:]:
            return None
        raise SystemExit(f"error: {sys.exc_info()[1]}")  # the message, not a traceback
    except backend.UnsupportedMLXError as e:
        if "sdist" in sys.argv[1:]:
            return None
        raise SystemExit(f"error: {e}")


def _check_nanobind(info):
    """The nanobind this build uses must build MLX's own nanobind ABI (see
    _mlx_env.NANOBIND_FOR_ABI): stop before compiling anything otherwise."""
    try:
        import nanobind

        version = nanobind.__version__
        abi = backend._mlx_env().nanobind_internals_version(nanobind.source_dir())
    except ImportError:
        version, abi = None, None
    why = backend.nanobind_mismatch(info, version, abi)
    if why:
        raise SystemExit(f"error: {why}")
    return version


def _nanobind_dir():
    try:
        import nanobind

        return nanobind.cmake_dir()
    except ImportError:
        return ""


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


def _ninja():
    for path in (shutil.which("ninja"), os.path.join(os.path.dirname(sys.executable), "ninja")):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


class CMakeBuild(build_ext):
    def run(self):
        # Asked before build_ext.run, which clears `inplace` while it builds.
        self._keep_build_dir = bool(self.inplace or getattr(self, "editable_mode", False))
        super().run()

    def build_extension(self, ext):
        info = backend.target_mlx()
        nanobind_version = _check_nanobind(info)
        out = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        out.mkdir(parents=True, exist_ok=True)
        keep = getattr(self, "_keep_build_dir", False)
        if keep:
            tmp = dev_build.build_dir(info)
            lib_dir = tmp / "lib"
        else:
            tmp = Path(tempfile.mkdtemp(prefix="mlx-rmsnorm-build-"))
            lib_dir = out
        tmp.mkdir(parents=True, exist_ok=True)
        cfg = "Debug" if (self.debug or os.environ.get("DEBUG") == "1") else "Release"
        args = [
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={lib_dir}{os.sep}",
            f"-DCMAKE_BUILD_TYPE={cfg}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DMLX_ROOT={info['mlx_root']}",
            # libmlx next to us in site-packages; never the build's own paths.
            # ($ORIGIN is the ELF loaders' word for the module's folder;
            # macOS's dyld spells it @loader_path.)
            "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
            "-DCMAKE_INSTALL_RPATH=" + ("@loader_path;@loader_path/../mlx/lib" if sys.platform == "darwin"
                                        else "$ORIGIN;$ORIGIN/../mlx/lib"),
            # in the cache, so that another nanobind starts a fresh build
            f"-DMLX_RMSNORM_NANOBIND_VERSION={nanobind_version}",
        ]
        if info.get("cudnn_root"):
            args.append(f"-DMLX_RMSNORM_CUDNN_ROOT={info['cudnn_root']}")
        nvcc = None
        if (info.get("flavor") or "").startswith("cuda"):
            nvcc = backend.find_nvcc(info)
            if nvcc is None:
                pkgs = " ".join(backend.PIP_NVCC_PACKAGES.get(info["flavor"], ["<the CUDA toolkit>"]))
                raise RuntimeError(
                    f"MLX here is the {info['flavor']} flavor, which needs nvcc to build the kernels, "
                    f"and none was found (CUDACXX, PATH, pip's nvidia/cu13). Put a CUDA toolkit's "
                    f"nvcc on PATH, or: pip install {pkgs}"
                )
            args.append(f"-DCMAKE_CUDA_COMPILER={nvcc[0]}")
            if nvcc[1]:
                args.append(f"-DCUDAToolkit_ROOT={nvcc[1]}")
            # Said at every configure: a kept build folder's cache would
            # otherwise keep the architectures of the build before it.
            archs = os.environ.get("MLX_RMSNORM_CUDA_ARCHS")
            args.append(f"-DMLX_RMSNORM_CUDA_ARCHS={archs}" if archs else "-UMLX_RMSNORM_CUDA_ARCHS")
        args += [a for a in os.environ.get("CMAKE_ARGS", "").split() if a]
        build_args = [] if "CMAKE_BUILD_PARALLEL_LEVEL" in os.environ else [f"-j{os.cpu_count()}"]
        self._drop_stale_cache(tmp, [info["mlx_root"], sys.executable, nvcc[0] if nvcc else "",
                                     _nanobind_dir(),
                                     f"MLX_RMSNORM_NANOBIND_VERSION:UNINITIALIZED={nanobind_version}"])
        # The exact binary the backend vetted: a `cmake` first on PATH may be
        # an entry-point script that cannot run under pip's isolation.
        cmake = backend.find_cmake(info)
        if cmake is None:
            raise RuntimeError(f"no cmake >= {'.'.join(map(str, backend.MIN_CMAKE))} found "
                               "(PATH, the cmake package): pip install cmake")
        print(f"mlx-rmsnorm: building against mlx {info['version']} ({info.get('flavor')}) "
              f"at {info['mlx_root']}" + (f", nvcc {nvcc[0]}" if nvcc else ""), flush=True)
        print(f"mlx-rmsnorm: cmake {cmake}, build folder {tmp}", flush=True)
        before = dev_build.stamp(info, nanobind_version) if keep else None
        try:
            self._configure(cmake, tmp, args)
            print("mlx-rmsnorm: compiling (a line per step)", flush=True)
            subprocess.run([cmake, "--build", ".", *build_args], cwd=tmp, check=True)
            if keep:
                # The newest module CMake wrote; replaced, not rewritten in
                # place, so that a process that has the old one loaded keeps it.
                built = max(glob.glob(str(lib_dir / "_ext.*")), key=os.path.getmtime)
                target = out / os.path.basename(built)
                shutil.copy2(built, f"{target}.tmp")
                os.replace(f"{target}.tmp", target)
                # setuptools then copies it into the package folder by
                # rewriting the file there: unlinked first, a running
                # process keeps the module it has mapped.
                (HERE / "mlx_rmsnorm" / target.name).unlink(missing_ok=True)
        finally:
            if not keep:
                shutil.rmtree(tmp, ignore_errors=True)
        self._write_build_info(info, out)
        if keep:
            dev_build.write_stamp(before)

    @staticmethod
    def _configure(cmake, tmp, args):
        # Configured again only when the arguments changed (a change of a
        # CMakeLists.txt reconfigures by itself in `cmake --build`).
        record = tmp / "mlx-rmsnorm-cmake-args.json"
        if (tmp / "CMakeCache.txt").is_file():
            if record.is_file() and json.loads(record.read_text()) == args:
                return
        elif "CMAKE_GENERATOR" not in os.environ and _ninja():
            args = [*args, "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={_ninja()}"]
        record.unlink(missing_ok=True)
        subprocess.run([cmake, str(HERE), *args], cwd=tmp, check=True)
        record.write_text(json.dumps([a for a in args if a not in ("-G", "Ninja") and
                                      not a.startswith("-DCMAKE_MAKE_PROGRAM=")]))

    @staticmethod
    def _drop_stale_cache(tmp, must_contain):
        # The kept build folder is shared by every editable build of this
        # checkout against that MLX version (isolated ones get a new nanobind
        # path each time, another venv other paths): a CMake cache from
        # another environment would keep its paths or refuse the other nvcc,
        # so start over when it does not name ours.
        cache = tmp / "CMakeCache.txt"
        if cache.is_file():
            text = cache.read_text(errors="replace")
            if not all(item in text for item in must_contain if item):
                cache.unlink()
                shutil.rmtree(tmp / "CMakeFiles", ignore_errors=True)

    def _write_build_info(self, info, out):
        text = (
            "# Written by setup.py when the extension was built: the MLX it was built\n"
            "# against. Checked at `import mlx_rmsnorm` (a different MLX raises ImportError).\n"
            f"MLX_VERSION = {info['version']!r}\n"
            f"MLX_FLAVOR = {info.get('flavor')!r}\n"
            f"MLX_BACKEND_VERSION = {info.get('backend_version')!r}\n"
        )
        targets = {out / "_build_info.py"}
        if getattr(self, "_keep_build_dir", False):  # the package imports from the source tree
            targets.add(HERE / "mlx_rmsnorm" / "_build_info.py")
        for path in targets:
            path.write_text(text)
        # The .pth that honors MLX_RMSNORM_PATCH goes beside the package.
        (Path(self.build_lib) / backend.PTH_NAME).write_text(backend.PTH_LINE)

    def get_outputs(self):
        outs = super().get_outputs()
        base = Path(self.get_ext_fullpath(self.extensions[0].name)).parent
        return outs + [str(base / "_build_info.py"), str(Path(self.build_lib) / backend.PTH_NAME)]


_info = _target_or_none()
setup(
    # A wheel pins the MLX it was built against; an sdist the supported range.
    install_requires=[backend._mlx_env().requirement(_info) if _info else
                      "mlx>={},<={}".format(*backend._mlx_env().SUPPORTED_MLX), "numpy"],
    ext_modules=[CMakeExtension("mlx_rmsnorm._ext")],
    cmdclass={"build_ext": CMakeBuild},
    packages=find_packages(include=["mlx_rmsnorm", "mlx_rmsnorm.*"]),
    package_data={"mlx_rmsnorm": ["*.pyi", "py.typed"]},
    include_package_data=False,  # not the C++ sources under mlx_rmsnorm/csrc
    zip_safe=False,
)
