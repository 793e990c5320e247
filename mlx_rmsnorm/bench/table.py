"""The nine reference shapes: the copy ceiling, ours ("ours auto":
rms_norm_vjp as the plan picks it; "ours naive": the three-kernel baseline
chain, on the GPU only) and mx.fast, forward and backward."""

from __future__ import annotations

from .. import rms_norm_vjp
from .core import BUILTIN, CEILING, EPS, Section, builtin_rms_norm, fwd_figures, vjp_both

# The nine shapes of the reference table (H200 figures for QuACK, the
# built-in, Liger and torch were measured on these).
SHAPES = [
    (16384, 8192), (16384, 4096), (32768, 2048), (65536, 1024), (262144, 128),
    (4096, 8192), (16384, 2880), (8192, 16384), (4096, 32768),
]


def table_contenders(w, gpu):
    figs = [("bwd", CEILING["bwd"], lambda x, g: x + g),
            ("bwd", "ours auto", lambda x, g: rms_norm_vjp(x, w, g, EPS))]
    if gpu:  # the CPU path has one algorithm: a naive row would time it twice
        figs.append(("bwd", "ours naive", lambda x, g: rms_norm_vjp(x, w, g, EPS, algorithm="naive")))
    return figs + [("bwd", BUILTIN, vjp_both(builtin_rms_norm, w))] + fwd_figures(w)


SECTIONS = {
    "table": Section(
        lambda: list(SHAPES), [(256, 128), (128, 1024), (64, 4099)], table_contenders,
        layout="impl", title="nine shapes",
        about="the nine reference shapes (16384x8192 ... 4096x32768): ours as "
              "rms_norm_vjp runs it ('ours auto'; on a GPU also 'ours naive', the "
              "unfused three-kernel chain), mx.fast and the copy ceiling, "
              "backward and forward"),
}
