"""float64 NumPy references of both norm families, with and without the
residual add, and RMS's offset (Gemma's 1 + w): what every family suite
(test_rms_norm.py, test_layer_norm.py) and the transform contract
(norm_contract.py) compare against.

Two kinds:

- from MLX arrays' actual (rounded) values, h = x + residual rounded to h's
  dtype first as the ops store it: `rms_forward`, `rms_backward`,
  `layer_forward`, `layer_backward`, `add_h`, `add_rms_backward`,
  `add_layer_backward` (the plain norms' are conftest's, which the
  model-level tests share);
- analytic ones on NumPy arrays (`np_*`), written with x * x and powers only,
  so that complex-step differentiation gives their derivatives to float64
  precision (norm_contract.py builds every transform's reference from them).
"""

import mlx.core as mx
import numpy as np
from conftest import gw_scale, gx_scale, to_numpy, unbroadcast
from conftest import layer_ref_backward as layer_backward
from conftest import layer_ref_forward as layer_forward
from conftest import ref_backward as rms_backward
from conftest import ref_forward as rms_forward

__all__ = [
    "add_h", "add_layer_backward", "add_rms_backward", "gw_scale", "gx_scale", "layer_backward",
    "layer_forward", "rms_backward", "rms_forward", "rms_offset_forward", "rms_offset_backward",
    "np_rms", "np_rms_vjp", "np_layer", "np_layer_vjp", "np_add", "np_add_vjp_inputs", "np_add_layer",
    "np_add_layer_vjp_inputs", "np_add_vjp", "np_add_layer_vjp",
]


# --- from MLX arrays' values ---------------------------------------------------


def _amax(a) -> float:
    return float(np.max(np.abs(a))) if a.size else 0.0


def add_h(x, r, h_dtype):
    """float64 h = x + residual, rounded to h's dtype first, as the op stores it
    (float64: the exact sum)."""
    if h_dtype == mx.float64:
        return np.array(x + r)
    return to_numpy((x.astype(mx.float32) + r.astype(mx.float32)).astype(h_dtype))


def rms_offset_forward(hd, w, eps, offset):
    """float64 RMSNorm of hd (MLX or NumPy values) times (w + offset)."""
    hd = to_numpy(hd)
    rstd = 1.0 / np.sqrt(np.mean(hd * hd, axis=-1, keepdims=True) + eps)
    y = hd * rstd
    return y * (to_numpy(w) + offset) if w is not None else y


def rms_offset_backward(hd, w, g, eps, offset):
    """float64 (gx, gw) of RMSNorm with weight w + offset against cotangent g."""
    hd, g = to_numpy(hd), to_numpy(g)
    n = hd.shape[-1]
    rstd = 1.0 / np.sqrt(np.mean(hd * hd, axis=-1, keepdims=True) + eps)
    v = g * (to_numpy(w) + offset) if w is not None else g
    gx = rstd * v - hd * (np.sum(v * hd, axis=-1, keepdims=True) / n) * rstd**3
    gw = (g * hd * rstd).reshape(-1, n).sum(axis=0) if w is not None else None
    return gx, gw


def add_rms_backward(hd, w, gy, gh, eps, offset=0.0):
    """float64 (gx, gw, scale) of add_rms_norm: gx = g_h + d(rms_norm)/dh;
    scale is the size of the terms gx is made of (g_h and r * g * (w +
    offset)), what its error is relative to."""
    gn, gw = rms_offset_backward(hd, w, gy, eps, offset)
    rstd = 1.0 / np.sqrt(np.mean(hd * hd, axis=-1, keepdims=True) + eps)
    v = to_numpy(gy) * (to_numpy(w) + offset if w is not None else 1)
    scale = max(_amax(rstd * v), _amax(to_numpy(gh)))
    return to_numpy(gh) + gn, gw, scale


def add_layer_backward(hd, w, gy, gh, eps):
    """float64 (gx, gw, gb, scale) of add_layer_norm, scale as add_rms_backward's."""
    gn, gw, gb = layer_backward(hd, w, gy, eps)
    d = hd - hd.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt((d * d).mean(axis=-1, keepdims=True) + eps)
    v = to_numpy(gy) * to_numpy(w) if w is not None else to_numpy(gy)
    scale = max(_amax(rstd * v), _amax(to_numpy(gh)))
    return to_numpy(gh) + gn, gw, gb, scale


# --- analytic (complex-steppable) references on NumPy arrays --------------------

EPS = 1e-5


def _rows(a):
    return tuple(range(a.ndim - 1))


def np_rms(x, w, eps=EPS):
    with np.errstate(all="ignore"):
        r = (np.mean(x * x, axis=-1, keepdims=True) + eps) ** -0.5
    return x * r * w


def np_rms_vjp(x, w, g, eps=EPS):
    n = x.shape[-1]
    with np.errstate(all="ignore"):
        r = (np.mean(x * x, axis=-1, keepdims=True) + eps) ** -0.5
        v = g * w
        gx = r * v - x * (np.sum(v * x, axis=-1, keepdims=True) / n) * r**3
    return [gx, np.sum(g * x * r, axis=_rows(x))]


def np_layer(x, w, b, eps=EPS):
    with np.errstate(all="ignore"):
        d = x - np.mean(x, axis=-1, keepdims=True)
        r = (np.mean(d * d, axis=-1, keepdims=True) + eps) ** -0.5
    return d * r * w + b


def np_layer_vjp(x, w, g, eps=EPS):
    with np.errstate(all="ignore"):
        d = x - np.mean(x, axis=-1, keepdims=True)
        r = (np.mean(d * d, axis=-1, keepdims=True) + eps) ** -0.5
        xh = d * r
        v = g * w
        gx = r * (v - np.mean(v, axis=-1, keepdims=True)
                  - xh * np.mean(v * xh, axis=-1, keepdims=True))
    return [gx, np.sum(g * xh, axis=_rows(x)), np.sum(g, axis=_rows(x))]


def np_add(x, r, w):
    h = x + r
    return [np_rms(h, w), h]


def np_add_vjp_inputs(x, r, w, cy, ch):
    """Gradients of sum(y * cy + h * ch) of np_add with respect to (x, r, w)."""
    h = x + r
    gx, gw = np_rms_vjp(h, w, cy)
    gh = gx + ch
    return [unbroadcast(gh, x.shape), unbroadcast(gh, r.shape), gw]


def np_add_layer(x, r, w, b):
    h = x + r
    return [np_layer(h, w, b), h]


def np_add_layer_vjp_inputs(x, r, w, b, cy, ch):
    """Gradients of sum(y * cy + h * ch) of np_add_layer with respect to (x, r, w, b)."""
    h = x + r
    gx, gw, gb = np_layer_vjp(h, w, cy)
    gh = gx + ch
    return [unbroadcast(gh, x.shape), unbroadcast(gh, r.shape), gw, gb]


def np_add_vjp(h, w, gy, gh):
    """(gx, gw) of add_rms_norm_vjp: the norm's backward at h, plus g_h."""
    gx, gw = np_rms_vjp(h, w, gy)
    return [gx + gh, gw]


def np_add_layer_vjp(h, w, b, gy, gh):
    gx, gw, gb = np_layer_vjp(h, w, gy)
    return [gx + gh, gw, gb]
