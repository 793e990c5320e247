"""LayerNorm with a weight and a bias: mlx_rmsnorm.layer_norm against
mx.fast.layer_norm as mx.grad reaches them (mx.vjp of the forward), with the
ceilings on the same bytes (bwd: x + g; fwd: -x), and our own RMSNorm on the
same tensors: LayerNorm moves what RMSNorm moves (plus a bias and its
gradient, 2 N elements), so ours / our RMSNorm is the figure to read. The
same timing and tables as RMSNorm's training section."""

from __future__ import annotations

import mlx.core as mx

from .. import layer_norm, rms_norm
from .core import BUILTIN, CEILING, EPS, OUR_RMS_NORM, Section, bias_like, builtin_layer_norm, vjp_both, vjp_gx
from .table import SHAPES

LN_TRAIN_M = [8192, 16384, 32768]
LN_TRAIN_N = [768, 1024, 1280, 2048, 2560, 4096, 5120, 8192]


def ln_contenders(w, gpu):
    b = bias_like(w)

    def both(norm):
        def f(x, g):
            return mx.vjp(lambda x, w, b: norm(x, w, b, EPS), [x, w, b], [g])[1]
        return f

    def gx_only(norm):
        def f(x, g):
            return mx.vjp(lambda x: norm(x, w, b, EPS), [x], [g])[1]
        return f

    return [("bwd", CEILING["bwd"], lambda x, g: x + g),
            ("bwd", "ours", both(layer_norm)),
            ("bwd", BUILTIN, both(builtin_layer_norm)),
            ("bwd", OUR_RMS_NORM, vjp_both(rms_norm, w)),
            ("bwd_gx", "ours", gx_only(layer_norm)),
            ("bwd_gx", BUILTIN, gx_only(builtin_layer_norm)),
            ("bwd_gx", OUR_RMS_NORM, vjp_gx(rms_norm, w)),
            ("fwd", CEILING["fwd"], lambda x, g: -x),
            ("fwd", "ours", lambda x, g: layer_norm(x, w, b, EPS)),
            ("fwd", BUILTIN, lambda x, g: builtin_layer_norm(x, w, b, EPS)),
            ("fwd", OUR_RMS_NORM, lambda x, g: rms_norm(x, w, EPS))]


SECTIONS = {
    "ln_training": Section(
        lambda: [(m, n) for n in LN_TRAIN_N for m in LN_TRAIN_M], [(128, 768), (64, 1024)],
        ln_contenders, title="LayerNorm training", default=False, op="LayerNorm",
        about="LayerNorm with weight and bias, ours vs mx.fast.layer_norm, "
              "{8192, 16384, 32768} x {768..8192}, forward and backward"),
    "ln_table": Section(
        lambda: list(SHAPES), [(256, 128), (64, 4099)], ln_contenders,
        title="LayerNorm nine shapes", default=False, op="LayerNorm",
        about="LayerNorm at the nine reference shapes"),
}
