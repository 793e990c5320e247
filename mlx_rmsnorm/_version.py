# The one place the package's version is written: pyproject.toml reads it for
# the metadata ([tool.setuptools.dynamic]), the package exports it as
# mlx_rmsnorm.__version__.
__version__ = "0.1.0"
