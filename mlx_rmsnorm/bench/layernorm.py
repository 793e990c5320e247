"""LayerNorm with a weight and a bias: mlx_rmsnorm.layer_norm against
mx.fast.layer_norm as mx.grad reaches them (mx.vjp of the forward), with the
ceilings on the same bytes (bwd: x + g; fwd: -x); the same timing and tables
as RMSNorm's training section."""

from __future__ import annotations

import mlx.core as mx

from .. import layer_norm
from .core import BUILTIN, CEILING, EPS, Section, builtin_layer_norm
from .table import SHAPES

LN_TRAIN_M = [8192, 16384, 32768]
LN_TRAIN_N = [768, 1024, 1280, 2048, 2560, 4096, 5120, 8192]


def ln_contenders(w, gpu):
    b = (0.1 * (w - 1)).astype(w.dtype)  # a bias in w's dtype, as in a checkpoint
    mx.eval(b)

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
            ("bwd_gx", "ours", gx_only(layer_norm)),
            ("bwd_gx", BUILTIN, gx_only(builtin_layer_norm)),
            ("fwd", CEILING["fwd"], lambda x, g: -x),
            ("fwd", "ours", lambda x, g: layer_norm(x, w, b, EPS)),
            ("fwd", BUILTIN, lambda x, g: builtin_layer_norm(x, w, b, EPS))]


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
