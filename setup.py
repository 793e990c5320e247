# Builds the extension against the MLX installed in this environment (so use
# `pip install --no-build-isolation .`): CPU or CUDA flavor, detected by CMake.
from mlx import extension
from setuptools import setup

setup(
    ext_modules=[extension.CMakeExtension("mlx_rmsnorm._ext")],
    cmdclass={"build_ext": extension.CMakeBuild},
    packages=["mlx_rmsnorm"],
    package_data={"mlx_rmsnorm": ["*.pyi", "py.typed"]},
    zip_safe=False,
)
