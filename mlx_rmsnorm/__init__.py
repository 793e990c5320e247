"""Fast, exact and deterministic RMSNorm for MLX.

``rms_norm`` has the contract of ``mx.fast.rms_norm`` and differentiates
through our own backward (``rms_norm_vjp``) under ``mx.grad``; ``RMSNorm`` is
a drop-in for ``mlx.nn.RMSNorm``; ``patch()`` routes ``mx.fast.rms_norm`` --
and with it every ``nn.RMSNorm`` and the models built on it -- through the
plugin.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from ._version_check import check as _check_mlx_version

_check_mlx_version()  # before anything loads libmlx: the MLX built against?

import mlx.core as mx
import mlx.nn as nn

from ._ext import device_memory, has_cuda_kernels, rms_norm, rms_norm_vjp, trim_device_memory

__all__ = [
    "RMSNorm",
    "device_memory",
    "has_cuda_kernels",
    "is_patched",
    "patch",
    "patched",
    "rms_norm",
    "rms_norm_vjp",
    "trim_device_memory",
    "unpatch",
]


class RMSNorm(nn.Module):
    r"""Root Mean Square normalization, a drop-in for :class:`mlx.nn.RMSNorm`.

    Same parameter (``weight``, initialised to ones in float32) and the same
    ``eps`` default, so checkpoints of ``nn.RMSNorm`` load as they are.

    Args:
        dims (int): The feature dimension to normalize over.
        eps (float): Added for numerical stability. Default: ``1e-5``.
    """

    def __init__(self, dims: int, eps: float = 1e-5):
        super().__init__()
        self.weight = mx.ones((dims,))
        self.eps = eps

    def _extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"

    def __call__(self, x: mx.array) -> mx.array:
        return rms_norm(x, self["weight"], self.eps)


_builtin_rms_norm = mx.fast.rms_norm


def patch() -> None:
    """Route ``mx.fast.rms_norm`` (and so every ``nn.RMSNorm``) through the plugin.

    Idempotent; undone by :func:`unpatch`.
    """
    mx.fast.rms_norm = rms_norm


def unpatch() -> None:
    """Restore MLX's built-in ``mx.fast.rms_norm``. Idempotent."""
    mx.fast.rms_norm = _builtin_rms_norm


def is_patched() -> bool:
    """Whether ``mx.fast.rms_norm`` currently runs the plugin."""
    return mx.fast.rms_norm is rms_norm


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """Context manager: the plugin inside, the previous state restored after."""
    was = is_patched()
    patch()
    try:
        yield
    finally:
        if not was:
            unpatch()


# MLX_RMSNORM_PATCH / MLX_RMSNORM_REPORT (the .pth installed with the package
# imports us at interpreter start when MLX_RMSNORM_PATCH is set).
from ._autopatch import from_environment as _from_environment  # noqa: E402

_from_environment()
