from typing import Literal, Optional, Tuple, Union

import mlx.core as mx

has_cuda_kernels: bool

def rms_norm(
    x: mx.array,
    weight: Optional[mx.array],
    eps: float,
    *,
    offset: float = 0.0,
    stream: Union[None, mx.Stream, mx.Device] = None,
) -> mx.array: ...
def add_rms_norm(
    x: mx.array,
    residual: mx.array,
    weight: Optional[mx.array],
    eps: float,
    *,
    offset: float = 0.0,
    stream: Union[None, mx.Stream, mx.Device] = None,
) -> Tuple[mx.array, mx.array]: ...
def rms_norm_vjp(
    x: mx.array,
    weight: Optional[mx.array],
    g: mx.array,
    eps: float,
    *,
    need_gw: bool = True,
    algorithm: Literal["auto", "persistent", "split", "naive"] = "auto",
    stream: Union[None, mx.Stream, mx.Device] = None,
) -> Tuple[mx.array, Optional[mx.array]]: ...
def add_rms_norm_vjp(
    h: mx.array,
    weight: Optional[mx.array],
    g_y: mx.array,
    g_h: mx.array,
    eps: float,
    *,
    offset: float = 0.0,
    need_gw: bool = True,
    stream: Union[None, mx.Stream, mx.Device] = None,
) -> Tuple[mx.array, Optional[mx.array]]: ...
def layer_norm(
    x: mx.array,
    weight: Optional[mx.array],
    bias: Optional[mx.array],
    eps: float,
    *,
    stream: Union[None, mx.Stream, mx.Device] = None,
) -> mx.array: ...
def layer_norm_vjp(
    x: mx.array,
    weight: Optional[mx.array],
    bias: Optional[mx.array],
    g: mx.array,
    eps: float,
    *,
    need_gw: bool = True,
    need_gb: bool = True,
    stream: Union[None, mx.Stream, mx.Device] = None,
) -> Tuple[mx.array, Optional[mx.array], Optional[mx.array]]: ...
def add_layer_norm(
    x: mx.array,
    residual: mx.array,
    weight: Optional[mx.array],
    bias: Optional[mx.array],
    eps: float,
    *,
    stream: Union[None, mx.Stream, mx.Device] = None,
) -> Tuple[mx.array, mx.array]: ...
def add_layer_norm_vjp(
    h: mx.array,
    weight: Optional[mx.array],
    bias: Optional[mx.array],
    g_y: mx.array,
    g_h: mx.array,
    eps: float,
    *,
    need_gw: bool = True,
    need_gb: bool = True,
    stream: Union[None, mx.Stream, mx.Device] = None,
) -> Tuple[mx.array, Optional[mx.array], Optional[mx.array]]: ...
def routed_rms_norm(
    x: mx.array,
    weight: Optional[mx.array],
    eps: float,
    *,
    stream: Union[None, mx.Stream, mx.Device] = None,
) -> mx.array:
    """``mx.fast.rms_norm``'s signature and docstring: MLX's own op on a CPU
    stream (unless ``_set_route_cpu(True)``) and on a stream this build has
    no kernels for (a GPU without ``has_cuda_kernels``: Metal), the plugin's
    elsewhere (the rule: ``_route``)."""

def routed_layer_norm(
    x: mx.array,
    weight: Optional[mx.array],
    bias: Optional[mx.array],
    eps: float,
    *,
    stream: Union[None, mx.Stream, mx.Device] = None,
) -> mx.array:
    """``mx.fast.layer_norm``'s signature and docstring, routed as
    ``routed_rms_norm``."""

def _set_route_cpu(on: bool) -> bool: ...
def _route(device_kind: Literal["cpu", "gpu"], has_kernels: bool, route_cpu: bool) -> Literal["plugin", "builtin"]:
    """Where the routed functions send a call on a stream of ``device_kind``,
    in a build with (``has_kernels``) our kernels for it or without, under
    ``_set_route_cpu(route_cpu)``. This build has kernels for ``"cpu"``
    always and for ``"gpu"`` when ``has_cuda_kernels``."""

def _backward_kernels(rows: int, n: int, x_dtype: mx.Dtype, g_dtype: Optional[mx.Dtype] = None, add: bool = False) -> list[tuple[str, int]]:
    """The kernels the RMSNorm backward (``add``: add_rms_norm's) of ``rows`` x
    ``n`` would launch on the current GPU, planned without data:
    ``[(name, cluster blocks), ...]``; empty without CUDA kernels."""
    ...

def _op_counts() -> dict[str, int]:
    """Calls since the module was loaded, eager or traced: ``"RMSNormPlugin"``,
    ``"AddRMSNormPlugin"``, ``"LayerNormPlugin"``, ``"AddLayerNormPlugin"`` (a
    forward primitive of ours built) and ``"builtin_rms_norm"``,
    ``"builtin_layer_norm"`` (a call that ran MLX's ``mx.fast`` op in its
    place: a routed call sent to MLX, an export trace, a stream without our
    kernels, LayerNorm rows no plan of ours covers)."""

def _layer_norm_builtin_forward_reference_backward(
    x: mx.array, weight: Optional[mx.array], bias: Optional[mx.array], eps: float
) -> mx.array: ...
def _set_export_tracing(on: bool) -> bool: ...
def _export_tracing() -> bool: ...

def device_memory(device: int = 0) -> tuple[int, int]:
    """(in_use, reserved) bytes of the plugin's own GPU memory pool."""

def trim_device_memory(device: int = 0) -> None:
    """Returns the unused part of the plugin's GPU memory pool to the driver."""

def gpu_family(device: int = 0) -> int:
    """Plan family of the GPU code on ``device`` (90, 80 or 75; 0 without CUDA kernels)."""
