"""Fast, exact and deterministic RMSNorm for MLX.

``rms_norm`` has the contract of ``mx.fast.rms_norm`` and differentiates
through our own backward (``rms_norm_vjp``) under ``mx.grad``; ``RMSNorm`` is
a drop-in for ``mlx.nn.RMSNorm``; ``patch()`` routes ``mx.fast.rms_norm`` --
and with it every ``nn.RMSNorm`` and the models built on it -- through the
plugin.
"""

from __future__ import annotations

from ._version_check import check as _check_mlx_version

_check_mlx_version()  # before anything loads libmlx: the MLX built against?

import mlx.core as mx
import mlx.nn as nn

from ._ext import (
    device_memory,
    gpu_family,
    has_cuda_kernels,
    rms_norm,
    rms_norm_vjp,
    trim_device_memory,
)

__all__ = [
    "RMSNorm",
    "device_memory",
    "gpu_family",
    "has_cuda_kernels",
    "is_patched",
    "patch",
    "patched",
    "rms_norm",
    "rms_norm_vjp",
    "trim_device_memory",
    "unpatch",
]


class RMSNorm(nn.RMSNorm):
    r"""Root Mean Square normalization through the plugin: an
    :class:`mlx.nn.RMSNorm` (a subclass: ``isinstance`` checks, parameters,
    ``repr`` and checkpoints are the same) whose call runs :func:`rms_norm`
    whether or not :func:`patch` is on.

    Args:
        dims (int): The feature dimension to normalize over.
        eps (float): Added for numerical stability. Default: ``1e-5``.
    """

    def __call__(self, x: mx.array) -> mx.array:
        return rms_norm(x, self["weight"], self.eps)


# The state of patching lives in a module that reload(mlx_rmsnorm) does not
# re-run (see its docstring for the semantics across threads and nesting).
from ._patching import is_patched, patch, patched, unpatch  # noqa: E402

# MLX_RMSNORM_PATCH / MLX_RMSNORM_REPORT (the .pth installed with the package
# imports us at interpreter start when either is set).
from ._autopatch import from_environment as _from_environment  # noqa: E402

_from_environment()
