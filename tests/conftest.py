"""Shared fixtures: the devices to test on and a float64 NumPy reference."""

import importlib.util
import os
import re
import tempfile
import threading
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

# Under patch(), CPU streams run MLX's own op by default (a CPU program
# computes what it computes unpatched); the suite runs the plugin there too,
# so that CI exercises the plugin's CPU path and the fused blocks. Set before
# the import (subprocesses inherit it); tests of the default unset it.
os.environ.setdefault("MLX_RMSNORM_ROUTE_CPU", "1")
# Float32 matmuls in float32: on a GPU MLX runs them in TF32 by default (read
# once, at the first matmul), which turns a last-bit difference in a norm's
# output into ~1e-4 after the next matmul (docs/NOTES.md, Accuracy). The
# model-level tests compare float32 logits and gradients with the built-in's
# at 1e-5; they need the matmuls the CPU has. (The distributed tests set it
# for their ranks the same way.)
os.environ.setdefault("MLX_ENABLE_TF32", "0")
# patch(fuse=True) runs a block's own code below 64 rows (a decode step); the
# suite's tiny inputs fuse at every row count, so that the fused path is the
# one tested. test_fuse_safety tests the row limit itself.
os.environ.setdefault("MLX_RMSNORM_FUSE_MIN_ROWS", "0")

import mlx_rmsnorm  # noqa: E402

GPU_AVAILABLE = mx.is_available(mx.gpu) and mlx_rmsnorm.has_cuda_kernels()


def longest_cluster_nvec() -> int:
    """The longest rows (16-byte vectors) that one thread-block cluster covers
    on this GPU, 0 where it has none, as the plugin's planner finds it (it
    asks CUDA whether the GPU holds the kernel's cluster): 32768 (N = 262144
    in bf16, clusters of 16, past the portable 8; H100 and H200 hold them),
    8192 (clusters of 4, where clusters of 16 do not run: N = 131072 takes
    them too), none before sm_90."""
    if mlx_rmsnorm.gpu_family() < 90:
        return 0
    from mlx_rmsnorm import _ext

    for n in (262144, 65536):  # bf16: 8 elements a vector
        if _ext._backward_kernels(512, n, mx.bfloat16)[0][0] == "bwd_persistent_cluster":
            return n // 8
    return 0


def holds_cluster_of_16() -> bool:
    """Whether this GPU is one known to hold clusters of 16 blocks (H100,
    H200): where the tests pin that the planner uses them, by the device's
    name rather than by the planner's own answer."""
    name = str(mx.device_info(mx.gpu).get("device_name", "")) if GPU_AVAILABLE else ""
    return "H100" in name or "H200" in name


# Every correctness test runs on the CPU stream, and on the GPU where MLX has
# CUDA and the plugin was built with its kernels; GPU cases carry the `gpu`
# marker and skip cleanly elsewhere.
DEVICES = [
    pytest.param(mx.cpu, id="cpu"),
    pytest.param(
        mx.gpu,
        id="gpu",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not GPU_AVAILABLE, reason="needs MLX CUDA + kernels"),
        ],
    ),
]

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}

# Normwise tolerances (max |err| / max |ref|) by the dtype of the result: one
# or two roundings in that dtype, accumulation in fp32.
TOL = {mx.float32: 2e-5, mx.float16: 2e-3, mx.bfloat16: 1.2e-2}


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


# --- pytest -n (xdist) on one GPU ----------------------------------------------
# Every xdist worker is its own process with its own MLX buffer cache (which
# keeps freed buffers up to about the card's memory) and its own plugin pool
# (which keeps what it reserved), and none of them knows about the others. On
# one GPU eight workers together can hold more than the card while one of
# them runs a large test. That is the likely cause (read from the code; seen
# once on the H200, before the measures below) of the
# RuntimeError test_bitwise_deterministic[naive-4096-32768] (256 MiB tensors,
# 100 calls) raised under -n 8 while it passes alone: an allocation that
# found the memory held by the other workers' caches (ours fails with
# "allocating N bytes of GPU memory", MLX's with its malloc error; both are
# RuntimeErrors). So under xdist each worker caps its MLX
# cache, gives its caches back after every GPU test, and the tests with large
# tensors share one xdist group: with --dist loadgroup (scripts/gpu_run.sh)
# they run one after another in a single worker.
XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
LARGE_ELEMENTS = 2**25  # 64 MiB a bf16 tensor: the benchmark shapes and 262144x128
LARGE_GROUP = "gpu-large"

if GPU_AVAILABLE and XDIST_WORKERS > 1:
    mx.set_cache_limit(mx.device_info().get("memory_size", 16 << 30) // (4 * XDIST_WORKERS))


def is_large_gpu_case(item) -> bool:
    """A GPU test whose (m, n) parameters make tensors of 2^25 elements or more."""
    if item.get_closest_marker("gpu") is None:
        return False
    params = getattr(getattr(item, "callspec", None), "params", {})
    m, n = params.get("m"), params.get("n")
    return isinstance(m, int) and isinstance(n, int) and m * n >= LARGE_ELEMENTS


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_large_gpu_case(item):
            item.add_marker(pytest.mark.xdist_group(LARGE_GROUP))


@pytest.fixture(autouse=True)
def _give_gpu_memory_back_under_xdist(request):
    yield
    if GPU_AVAILABLE and XDIST_WORKERS > 1 and request.node.get_closest_marker("gpu") is not None:
        mx.synchronize()
        mx.clear_cache()
        mlx_rmsnorm.trim_device_memory()


def to_numpy(a) -> np.ndarray:
    """float64 values of an MLX array (through float32) or of a NumPy one."""
    if isinstance(a, np.ndarray):
        return a.astype(np.float64)
    return np.array(a.astype(mx.float32), dtype=np.float64)


def of_dtype(rng, name, shape):
    """An array of MLX dtype `name` (integers in [-3, 3], bools, or normal
    floats), made on the CPU stream."""
    vals = rng.integers(-3, 4, shape) if name.startswith("int") else rng.standard_normal(shape)
    if name == "bool_":
        vals = rng.integers(0, 2, shape).astype(bool)
    return mx.array(vals).astype(getattr(mx, name), stream=mx.cpu)


def random(shape, dtype, seed, scale=1.0, offset=0.0):
    rng = np.random.default_rng(seed)
    return mx.array((rng.standard_normal(shape) * scale + offset).astype(np.float32)).astype(dtype)


def ref_forward(x, w, eps):
    """float64 reference of y from the arrays' actual (rounded) values."""
    xd = to_numpy(x)
    r = 1.0 / np.sqrt(np.mean(xd * xd, axis=-1, keepdims=True) + eps)
    y = xd * r
    return y * to_numpy(w) if w is not None else y


def ref_backward(x, w, g, eps):
    xd, gd = to_numpy(x), to_numpy(g)
    n = xd.shape[-1]
    r = 1.0 / np.sqrt(np.mean(xd * xd, axis=-1, keepdims=True) + eps)
    v = gd * to_numpy(w) if w is not None else gd
    gx = r * v - xd * (np.sum(v * xd, axis=-1, keepdims=True) / n) * r**3
    gw = None
    if w is not None:
        gw = (gd * xd * r).reshape(-1, n).sum(axis=0)
    return gx, gw


# LayerNorm's weight and bias combinations: (with weight, with bias)
LN_COMBOS = [(True, True), (True, False), (False, True), (False, False)]
LN_COMBO_IDS = ["w+b", "w", "b", "none"]


def layer_ref_forward(x, w, b, eps):
    """float64 LayerNorm of x (MLX or NumPy values)."""
    xd = to_numpy(x)
    d = xd - xd.mean(axis=-1, keepdims=True)
    y = d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + eps)
    if w is not None:
        y = y * to_numpy(w)
    if b is not None:
        y = y + to_numpy(b)
    return y


def layer_ref_backward(x, w, g, eps):
    """float64 (gx, gw, gb) of LayerNorm against cotangent g."""
    xd, gd = to_numpy(x), to_numpy(g)
    n = xd.shape[-1]
    d = xd - xd.mean(axis=-1, keepdims=True)
    r = 1.0 / np.sqrt((d * d).mean(axis=-1, keepdims=True) + eps)
    xh = d * r
    v = gd * to_numpy(w) if w is not None else gd
    gx = r * (v - v.mean(axis=-1, keepdims=True) - xh * (v * xh).mean(axis=-1, keepdims=True))
    gw = (gd * xh).reshape(-1, n).sum(axis=0)
    gb = gd.reshape(-1, n).sum(axis=0)
    return gx, gw, gb


def gx_scale(x, w, g, eps) -> float:
    """Size of the terms gx is the difference of (r * g * w). For N = 1, or
    rows where they nearly cancel, gx itself is far smaller than its terms and
    fp32 arithmetic can only be accurate relative to them."""
    xd, gd = to_numpy(x), to_numpy(g)
    r = 1.0 / np.sqrt(np.mean(xd * xd, axis=-1, keepdims=True) + eps)
    v = gd * to_numpy(w) if w is not None else gd
    return float(np.max(np.abs(r * v))) if v.size else 0.0


def gw_scale(x, g, eps) -> float:
    """Size of the terms gw sums (g * x * r over rows). Where the rows' terms
    nearly cancel (a few rows, N = 1), gw is far smaller than they are and an
    fp32 sum can only be accurate relative to them."""
    xd, gd = to_numpy(x), to_numpy(g)
    n = xd.shape[-1]
    r = 1.0 / np.sqrt(np.mean(xd * xd, axis=-1, keepdims=True) + eps)
    terms = np.abs(gd * xd * r).reshape(-1, n).sum(axis=0)
    return float(np.max(terms)) if terms.size else 0.0


def unbroadcast(g, shape):
    """The gradient of an input broadcast to g's shape (x + residual's
    residual, say): g summed back to `shape`."""
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for i, s in enumerate(shape):
        if s == 1 and g.shape[i] != 1:
            g = g.sum(axis=i, keepdims=True)
    return g


def rel_err(out, ref, scale=None) -> float:
    """max |out - ref| / max |ref| (or / scale when given)."""
    out = to_numpy(out) if isinstance(out, mx.array) else out
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert np.all(np.isfinite(out)), "non-finite values in the output"
    if scale is None:
        scale = np.max(np.abs(ref)) if ref.size else 0.0
    err = np.max(np.abs(out - ref)) if ref.size else 0.0
    return float(err / scale) if scale > 0 else float(err)


# One rounding to the output dtype, relative to the largest element (unit
# roundoff: 2^-8 for bfloat16, 2^-11 for float16, 2^-24 for float32).
ONE_ROUNDING = {mx.bfloat16: 2.0**-8, mx.float16: 2.0**-11, mx.float32: 2.0**-24}
_MANTISSA = {mx.bfloat16: 7, mx.float16: 10, mx.float32: 23}


def ulp_errors(out, ref, dtype) -> float:
    """Largest |out - ref| in units of the output dtype's ulp at ref; a
    correctly rounded result is <= 0.5, and fp32 accumulation adds a little."""
    out = to_numpy(out)
    mag = np.maximum(np.abs(ref), np.max(np.abs(ref)) * 1e-3)  # no ulp of ~0
    ulp = 2.0 ** (np.floor(np.log2(mag)) - _MANTISSA[dtype])
    return float(np.max(np.abs(out - ref) / ulp))


def graph_text(out: mx.array) -> str:
    """The DOT text of the graph that computes `out`: primitive names show
    which implementation a computation will run (e.g. RMSNormPlugin)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "graph.dot")
        mx.export_to_dot(path, out)
        with open(path) as f:
            return f.read()


def overlapping_patched_blocks(inside_b):
    """Thread A enters mlx_rmsnorm.patched(), B enters, A exits; B, still in
    its block, calls inside_b() and leaves. Returns what inside_b returned,
    after asserting that B got through its block."""
    a_in, b_in, a_out, b_done = (threading.Event() for _ in range(4))
    seen = {}

    def a():
        with mlx_rmsnorm.patched():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def b():
        a_in.wait(10)
        with mlx_rmsnorm.patched():
            b_in.set()
            a_out.wait(10)
            seen["result"] = inside_b()
        b_done.set()

    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert b_done.is_set()
    return seen["result"]


def build_backend():
    """build_backend/mlx_rmsnorm_build.py, loaded afresh as a module."""
    spec = importlib.util.spec_from_file_location(
        "mlx_rmsnorm_build_under_test", Path(__file__).resolve().parent.parent / "build_backend" / "mlx_rmsnorm_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train_steps(model, loss_fn, x, y, steps):
    """`steps` AdamW steps (learning rate 1e-3) of model on (x, y); the losses."""
    import mlx.nn as nn
    import mlx.optimizers as optim

    opt = optim.AdamW(learning_rate=1e-3)
    step = nn.value_and_grad(model, loss_fn)
    losses = []
    for _ in range(steps):
        loss, grads = step(model, x, y)
        opt.update(model, grads)
        mx.eval(loss, model.parameters(), opt.state)
        losses.append(loss.item())
    return losses


def assert_normwise_close(y, ref):
    """max |y - ref| <= TOL of y's dtype (1e-12 for float64) times max |ref|;
    ref a float64 NumPy array."""
    tol = 1e-12 if y.dtype == mx.float64 else TOL[y.dtype]
    assert np.max(np.abs(np.array(y.astype(mx.float64, stream=mx.cpu)) - ref)) <= tol * np.max(np.abs(ref))


def lit(text):
    """A message part to find as it is (not as a regular expression)."""
    return re.escape(text)
