"""Peak memory of a loss-and-gradients step of a tiny mlx-lm model (the tests'
tiny_models, 16 x 128 tokens), with and without mlx-lm's grad_checkpoint,
under the built-in, patch() and patch(fuse=True), and under fuse with the
fused op replaced by its composition (MLX's add, then the patched norm): where
fuse's checkpointed peak is above patch()'s, that row says whether the fused
op or the rewritten block holds the memory. MiB above what was held before
the step; the default device.

    python scripts/checkpoint_memory.py [--models qwen3,gpt2] [--tokens 16x128]

On a GPU the peak also follows where MLX cuts the step into CUDA graphs (a
graph is committed every 100 nodes or 1000 MB, and a graph's inputs are
freed only after it has run): MLX_MAX_OPS_PER_BUFFER=1 in the environment
commits every node. Even then the peak moves with how far the host runs
ahead of the GPU (the load of the machine); on the CPU device it follows
which arrays are alive.
"""

from __future__ import annotations

import argparse
import os
import sys

import mlx.core as mx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import mlx_rmsnorm  # noqa: E402
from mlx_rmsnorm import _ext, _fuse  # noqa: E402
from mlx_lm.tuner.trainer import grad_checkpoint  # noqa: E402
from tiny_models import VOCAB, loss_and_grads, make  # noqa: E402


def peak_mib(model, x, y) -> float:
    # a first step untimed: allocations made once (kernel compilation,
    # workspaces, graph caches) would count in the peak of the first
    loss_and_grads(model, x, y)
    mx.clear_cache()
    mx.reset_peak_memory()
    held = mx.get_active_memory()
    loss_and_grads(model, x, y)
    return (mx.get_peak_memory() - held) / 2**20


def composed_add_rms_norm(x, r, w, eps, *args, **kwargs):
    h = x + r
    return mx.fast.rms_norm(h, w, eps), h


def composed_add_layer_norm(x, r, w, b, eps):
    h = x + r
    return mx.fast.layer_norm(h, w, b, eps), h


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="qwen3,gpt2")
    p.add_argument("--tokens", default="16x128")
    a = p.parse_args()
    batch, seq = (int(v) for v in a.tokens.split("x"))
    t = mx.random.randint(0, VOCAB, (batch, seq + 1), key=mx.random.key(1))
    x, y = t[:, :-1], t[:, 1:]
    print(f"device {mx.default_device()}, {batch} x {seq} tokens, MiB above the held memory")
    print(f"{'model':8} {'mode':24} {'step':>8} {'checkpointed':>13} {'fused blocks':>13}")
    for name in a.models.split(","):
        modes = [("built-in", None, None), ("patch()", False, None), ("patch(fuse=True)", True, None),
                 ("fuse, op composed", True, "composed")]
        for label, fuse, op in modes:
            model = make(name)
            cls = type(model.layers[0])
            pristine = cls.__dict__["__call__"]
            saved = (_ext.add_rms_norm, _ext.add_layer_norm)
            try:
                if fuse is not None:
                    mlx_rmsnorm.patch(fuse=fuse)
                if op == "composed":
                    _ext.add_rms_norm, _ext.add_layer_norm = composed_add_rms_norm, composed_add_layer_norm
                _fuse.reset_counts()
                plain = peak_mib(model, x, y)
                grad_checkpoint(model.layers[0])
                checkpointed = peak_mib(model, x, y)
                fused = _fuse.counts().get("fused", 0)
            finally:
                _ext.add_rms_norm, _ext.add_layer_norm = saved
                mlx_rmsnorm.unpatch()
                # what grad_checkpoint left on the class goes (and the inert rewrite
                # under it that unpatch() kept); the original comes back
                _fuse._installed.pop((cls.__module__, cls.__name__, "__call__"), None)
                cls.__call__ = pristine
            print(f"{name:8} {label:24} {plain:8.1f} {checkpointed:13.1f} {fused:13d}", flush=True)


if __name__ == "__main__":
    main()
