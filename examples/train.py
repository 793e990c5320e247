"""Main job: a short mx.grad training loop of a small RMSNorm model, run twice
with the same seed -- MLX's built-in mx.fast.rms_norm, then mlx-rmsnorm via
patch() -- with the losses side by side. Runs on the GPU when MLX has CUDA and
the plugin was built with its kernels (the plugin column runs our CUDA
kernels), on the CPU otherwise: there patch() alone would keep MLX's own op,
so the plugin column also turns on route_cpu(True) and runs the plugin's CPU
path. It says which implementation each column ran and prints the primitives
in each column's first gradient graph, so the plugin column shows the
plugin's nodes; it fails when they are missing.

    python examples/train.py [--steps 30] [--dims 256] [--layers 4] [--dtype float32]
"""

import argparse
import contextlib
import time

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim

from mlx.utils import tree_flatten

import mlx_rmsnorm
from mlx_rmsnorm._autopatch import primitive_counts

# Primitive names in a graph: ours, and MLX's fused norm (a GPU builds it; on
# the CPU MLX expands its norm into plain ops, which carry no norm's name).
OURS = ("RMSNormPlugin", "RMSNormPluginVJP")
THEIRS = ("RMSNorm", "RMSNormVJP")


class Block(nn.Module):
    """Pre-norm MLP residual block: x + W2 relu(W1 rmsnorm(x))."""

    def __init__(self, dims):
        super().__init__()
        self.norm = nn.RMSNorm(dims)
        self.up = nn.Linear(dims, 4 * dims)
        self.down = nn.Linear(4 * dims, dims)

    def __call__(self, x):
        return x + self.down(nn.relu(self.up(self.norm(x))))


class Model(nn.Module):
    def __init__(self, dims, layers, classes):
        super().__init__()
        self.blocks = [Block(dims) for _ in range(layers)]
        self.norm = nn.RMSNorm(dims)
        self.head = nn.Linear(dims, classes)

    def __call__(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


def make_data(n, dims, classes, seed):
    """A learnable synthetic task: labels from a fixed random linear teacher."""
    k1, k2 = mx.random.split(mx.random.key(seed))
    x = mx.random.normal((n, dims), key=k1)
    teacher = mx.random.normal((dims, classes), key=k2)
    return x, mx.argmax(x @ teacher, axis=-1)


def implementation(use_plugin, on_gpu):
    """What a column runs."""
    if not use_plugin:
        return "MLX's built-in (mx.fast.rms_norm, unpatched)"
    if on_gpu:
        return "mlx_rmsnorm CUDA kernels (patch())"
    return "mlx_rmsnorm CPU path (patch() + route_cpu(True))"


def train(args, use_plugin, on_gpu):
    mx.random.seed(args.seed)
    model = Model(args.dims, args.layers, args.classes)
    model.set_dtype(getattr(mx, args.dtype))
    opt = optim.AdamW(learning_rate=args.lr)
    x, y = make_data(args.batch * args.steps, args.dims, args.classes, args.seed)
    x = x.astype(getattr(mx, args.dtype))

    def loss_fn(model, xb, yb):
        return nn.losses.cross_entropy(model(xb).astype(mx.float32), yb).mean()

    step = nn.value_and_grad(model, loss_fn)
    losses, times = [], []
    counts = {}
    with contextlib.ExitStack() as ctx:
        if use_plugin:
            ctx.enter_context(mlx_rmsnorm.patched())
            if not on_gpu:  # on a CPU stream patch() alone keeps MLX's own op
                was = mlx_rmsnorm.route_cpu(True)
                ctx.callback(mlx_rmsnorm.route_cpu, was)
        for i in range(args.steps):
            xb = x[i * args.batch:(i + 1) * args.batch]
            yb = y[i * args.batch:(i + 1) * args.batch]
            t0 = time.perf_counter()
            loss, grads = step(model, xb, yb)
            if i == 0:  # the graph, before it runs: which primitives the step holds
                t_count = time.perf_counter()
                found = primitive_counts(loss, *(g for _, g in tree_flatten(grads)))
                counts = {k: found[k] for k in OURS + THEIRS}
                t0 += time.perf_counter() - t_count
            opt.update(model, grads)
            mx.eval(loss, model.parameters(), opt.state)
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    return losses, times, counts


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=None, help="default: 50 on GPU, 20 on CPU")
    p.add_argument("--batch", type=int, default=None, help="default: 4096 on GPU, 128 on CPU")
    p.add_argument("--dims", type=int, default=None, help="default: 1024 on GPU, 128 on CPU")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--classes", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    on_gpu = mx.is_available(mx.gpu) and mlx_rmsnorm.has_cuda_kernels()
    mx.set_default_device(mx.gpu if on_gpu else mx.cpu)
    args.steps = args.steps or (50 if on_gpu else 20)
    args.batch = args.batch or (4096 if on_gpu else 128)
    args.dims = args.dims or (1024 if on_gpu else 128)
    print(f"device: {mx.default_device()} | model: {args.layers} blocks x {args.dims} dims, "
          f"{args.dtype} | batch {args.batch} | {args.steps} steps")
    base_losses, base_times, base_counts = train(args, use_plugin=False, on_gpu=on_gpu)
    our_losses, our_times, our_counts = train(args, use_plugin=True, on_gpu=on_gpu)
    names = ("built-in", "plugin")
    print("\ncolumns:")
    for name, use_plugin in zip(names, (False, True)):
        print(f"  {name:>8}: {implementation(use_plugin, on_gpu)}")

    print(f"\n{'step':>5} {'built-in':>14} {'plugin':>14} {'|diff|':>10}")
    for i, (a, b) in enumerate(zip(base_losses, our_losses)):
        if i < 5 or i % max(1, args.steps // 10) == 0 or i == args.steps - 1:
            print(f"{i:5d} {a:14.6f} {b:14.6f} {abs(a - b):10.2e}")
    skip = min(3, args.steps - 1)  # leave out warm-up steps (compilation, caches)
    for name, t in zip(names, (base_times, our_times)):
        ms = 1e3 * sum(t[skip:]) / len(t[skip:])
        print(f"{name:>10}: {ms:8.2f} ms/step, {args.batch / ms * 1e3:10.0f} samples/s")
    # The report: the norm primitives in each column's first gradient graph
    # (a forward node and a VJP node per norm the gradient flows through).
    print("\nreport (norm primitives in the first step's gradient graph):")
    for name, c in zip(names, (base_counts, our_counts)):
        line = " ".join(f"{k}={c[k]}" for k in OURS) + " " + " ".join(f"builtin_{k}={c[k]}" for k in THEIRS)
        print(f"  {name:>8}: {line}")
    if mx.default_device() == mx.cpu:
        print("  (on the CPU MLX expands its built-in norm into plain ops, so builtin_* count 0 there)")
    plugin_ran = our_counts["RMSNormPluginVJP"] > 0 and base_counts["RMSNormPlugin"] == 0
    # Both runs start from the same weights and data; rounding differences in
    # the gradients (a different but equally exact summation order) grow
    # slowly through the optimizer, so the bound is on the whole run.
    tol = 1e-3 if args.dtype == "float32" else 3e-2
    worst = max(abs(a - b) / max(abs(a), 1e-6) for a, b in zip(base_losses, our_losses))
    ok = worst <= tol and our_losses[-1] < our_losses[0] and plugin_ran
    print(f"\nlosses agree within {worst:.1e} (tolerance {tol:.0e}) and decrease, the plugin's "
          f"primitives only in the plugin column: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
