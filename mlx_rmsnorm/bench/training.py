"""The shapes a training step calls, forward, backward (gx and gw) and
backward with gx only (a frozen weight), ours as mx.grad reaches it
(mlx_rmsnorm.rms_norm under mx.vjp, not rms_norm_vjp directly) against
mx.fast.rms_norm under mx.vjp."""

from __future__ import annotations

from .. import rms_norm
from .core import BUILTIN, CEILING, Section, builtin_rms_norm, fwd_figures, vjp_both, vjp_gx

# Tokens per GPU of a training step x the hidden sizes of common models
# (Qwen2.5-0.5B 896, Qwen3-0.6B 1024, ..., Llama-8B 4096, 14B 5120), then
# QK-norm: tokens x heads rows of the head dimension.
TRAIN_M = [4096, 8192, 16384, 32768]
TRAIN_N = [896, 1024, 2048, 2560, 3584, 4096, 5120, 8192]
QK_M = [65536, 131072, 262144]
QK_N = [64, 128, 256]


def training_contenders(w, gpu):
    return [("bwd", CEILING["bwd"], lambda x, g: x + g),
            ("bwd", "ours", vjp_both(rms_norm, w)),
            ("bwd", BUILTIN, vjp_both(builtin_rms_norm, w)),
            ("bwd_gx", "ours", vjp_gx(rms_norm, w)),
            ("bwd_gx", BUILTIN, vjp_gx(builtin_rms_norm, w))] + fwd_figures(w)


def training_shapes():
    return ([(m, n) for n in TRAIN_N for m in TRAIN_M]
            + [(m, n) for n in QK_N for m in QK_M])


SECTIONS = {
    "training": Section(
        training_shapes, [(128, 896), (64, 1024), (512, 64)], training_contenders,
        title="training",
        about="the shapes a training step calls: M x N in {4096..32768} x {896..8192} "
              "and the QK-norm rows {65536..262144} x {64, 128, 256}; forward, backward "
              "(gx and gw) and backward with gx only (a frozen weight), ours as mx.grad "
              "reaches it against mx.fast.rms_norm under mx.vjp"),
}
