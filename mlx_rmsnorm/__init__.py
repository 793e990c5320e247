"""Fast, exact and deterministic RMSNorm for MLX.

``layer_norm`` / ``LayerNorm`` do the same for ``mx.fast.layer_norm`` /
``nn.LayerNorm``, and ``patch()`` routes both.

``rms_norm`` has the contract of ``mx.fast.rms_norm`` and differentiates
through our own backward (``rms_norm_vjp``) under ``mx.grad``; ``RMSNorm`` is
a drop-in for ``mlx.nn.RMSNorm``; ``patch()`` routes ``mx.fast.rms_norm`` --
and with it every ``nn.RMSNorm`` and the models built on it -- through the
plugin on GPU streams with our CUDA kernels (CPU streams keep MLX's own op
unless ``route_cpu(True)``). ``add_rms_norm`` and ``add_layer_norm`` fuse a residual add into the norm, and
``patch(fuse=True)`` rewrites mlx-lm's decoder blocks to use it.
"""

# No `from __future__ import annotations` and no plain `import mlx.core as
# mx` here: every name this module binds is part of the namespace users see
# (dir(mlx_rmsnorm)); helpers take a leading underscore.
from ._version import __version__
from ._version_check import check as _check_mlx_version

_check_mlx_version()  # before anything loads libmlx: the MLX built against?

import mlx.core as _mx  # noqa: E402
import mlx.nn as _nn  # noqa: E402

from . import _ext  # noqa: E402
from ._ext import (  # noqa: E402
    add_layer_norm,
    add_layer_norm_vjp,
    add_rms_norm,
    add_rms_norm_vjp,
    device_memory,
    gpu_family,
    layer_norm,
    layer_norm_vjp,
    rms_norm,
    rms_norm_vjp,
    trim_device_memory,
)

__all__ = [
    "LayerNorm",
    "RMSNorm",
    "add_layer_norm",
    "add_layer_norm_vjp",
    "add_rms_norm",
    "add_rms_norm_vjp",
    "device_memory",
    "fused_architectures",
    "gpu_family",
    "has_cuda_kernels",
    "is_fused",
    "is_patched",
    "layer_norm",
    "layer_norm_vjp",
    "patch",
    "patched",
    "rms_norm",
    "rms_norm_vjp",
    "route_cpu",
    "trim_device_memory",
    "unpatch",
]


def has_cuda_kernels() -> bool:
    """Whether this build carries the CUDA kernels (built against MLX's CUDA
    flavor). A GPU run also needs a GPU: ``mx.is_available(mx.gpu)``."""
    return bool(_ext.has_cuda_kernels)  # a constant of the extension module


class RMSNorm(_nn.RMSNorm):
    r"""Root Mean Square normalization through the plugin: an
    :class:`mlx.nn.RMSNorm` (a subclass: ``isinstance`` checks, parameters,
    ``repr`` and checkpoints are the same) whose call runs :func:`rms_norm`
    whether or not :func:`patch` is on.

    Args:
        dims (int): The feature dimension to normalize over.
        eps (float): Added for numerical stability. Default: ``1e-5``.
    """

    def __call__(self, x: _mx.array) -> _mx.array:
        return rms_norm(x, self["weight"], self.eps)


class LayerNorm(_nn.LayerNorm):
    r"""Layer normalization through the plugin: an :class:`mlx.nn.LayerNorm`
    (a subclass: parameters, ``repr`` and checkpoints are the same) whose call
    runs :func:`layer_norm` whether or not :func:`patch` is on.

    Args:
        dims (int): The feature dimension to normalize over.
        eps (float): Added for numerical stability. Default: ``1e-5``.
        affine (bool): Learn a weight and a bias. Default: ``True``.
        bias (bool): With ``affine``, learn the bias too. Default: ``True``.
    """

    def __call__(self, x: _mx.array) -> _mx.array:
        weight = self["weight"] if "weight" in self else None
        bias = self["bias"] if "bias" in self else None
        return layer_norm(x, weight, bias, self.eps)


# The state of patching lives in a module that reload(mlx_rmsnorm) does not
# re-run (see its docstring for the semantics across threads and nesting).
from ._patching import (  # noqa: E402
    fused_architectures,
    is_fused,
    is_patched,
    patch,
    patched,
    route_cpu,
    unpatch,
)

# MLX_RMSNORM_PATCH / MLX_RMSNORM_REPORT (the .pth installed with the package
# imports us at interpreter start when either is set).
from ._autopatch import from_environment as _from_environment  # noqa: E402

_from_environment()
