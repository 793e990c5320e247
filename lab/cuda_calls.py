"""Which CUDA calls does an eval make? Counts every runtime and driver API
call (lab/cuda_calls.cpp, a CUPTI injection library) per eval, for the
built-in and for the plugin, in the workloads where a fixed cost per call
shows: one norm call per eval (forward, backward), many calls per eval, a
decode step of an mlx-lm model (one eval per token, as mlx_lm.generate) and a
compiled training step. Run on the GPU machine by scripts/gpu_run.sh (step
calls), or by hand:

    python3 -m lab.cuda_calls [--out FILE] [--scenarios a,b,...] [--contenders builtin,plugin]

--contenders plugin,fuse sets patch() against patch(fuse=True) instead
(decode with the blocks' residual add fused).

Prints, per scenario, ms per eval and the calls per eval of each contender
(both columns, the API functions where they differ first), the host time
spent inside those calls, and every kernel's GPU time per eval (CUPTI
activity records). The callbacks cost host time themselves, and a
contender's evals run as one block after the other's (the machine's drift
falls between them): read the counts and the GPU times here, and take wall
times from the benchmarks (decode: python -m mlx_rmsnorm.bench --generate,
which rotates the contenders every token). The built-in is MLX's own mx.fast.rms_norm; the
plugin is the same code under mlx_rmsnorm.patch().
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import statistics
import subprocess
import sys
import sysconfig
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = "/tmp/mlx_rmsnorm_cuda_calls.so"


def _cupti_dirs():
    roots = ["/usr/local/cuda/extras/CUPTI", "/usr/local/cuda", *glob.glob("/usr/local/cuda-*")]
    site = sysconfig.get_paths()["purelib"]
    roots += glob.glob(os.path.join(site, "nvidia", "cuda_cupti")) + glob.glob(os.path.join(site, "nvidia", "cu13"))
    inc = next((os.path.join(r, "include") for r in roots if os.path.exists(os.path.join(r, "include", "cupti.h"))), None)
    lib = next((d for r in roots for d in (os.path.join(r, "lib64"), os.path.join(r, "lib"))
                if glob.glob(os.path.join(d, "libcupti.so*"))), None)
    if inc is None or lib is None:
        raise SystemExit(f"CUPTI not found (include {inc}, lib {lib})")
    return inc, lib


def build():
    inc, lib = _cupti_dirs()
    cupti = sorted(glob.glob(os.path.join(lib, "libcupti.so*")))[0]
    subprocess.run(["g++", "-O2", "-std=c++17", "-shared", "-fPIC", f"-I{inc}",
                    os.path.join(HERE, "cuda_calls.cpp"), "-o", LIB, cupti,
                    f"-Wl,-rpath,{lib}"], check=True)


class Counter:
    def __init__(self):
        self.lib = ctypes.CDLL(LIB)  # the same handle the driver loaded
        self.buf = ctypes.create_string_buffer(1 << 20)

    def reset(self):
        self.lib.cc_reset()

    def read(self):
        self.lib.cc_dump(self.buf, len(self.buf))
        out = {}
        for line in self.buf.value.decode().splitlines():
            domain, name, calls, ns = line.split("\t")
            out[f"{domain[:3]}:{name}"] = (int(calls), int(ns))
        return out


# ---------------------------------------------------------------- scenarios
def scenarios(names):
    import mlx.core as mx
    import mlx.nn as nn

    import mlx_rmsnorm

    def norm_inputs(m, n):
        x = mx.random.normal((m, n)).astype(mx.bfloat16)
        g = mx.random.normal((m, n)).astype(mx.bfloat16)
        w = (1 + 0.1 * mx.random.normal((n,))).astype(mx.bfloat16)
        mx.eval(x, g, w)
        return x, g, w

    def single_fwd(m, n):
        x, _, w = norm_inputs(m, n)
        return lambda: mx.eval(mx.fast.rms_norm(x, w, 1e-5))

    def single_bwd(m, n, frozen=False):
        x, g, w = norm_inputs(m, n)
        if frozen:
            return lambda: mx.eval(mx.vjp(lambda x: mx.fast.rms_norm(x, w, 1e-5), [x], [g]))
        return lambda: mx.eval(mx.vjp(lambda x, w: mx.fast.rms_norm(x, w, 1e-5), [x, w], [g]))

    def many_bwd(m, n, calls=20, layer=False):
        x, g, w = norm_inputs(m, n)
        if layer:
            b = (0.1 * (w - 1)).astype(w.dtype)
            f, primals = (lambda x, w, b: mx.fast.layer_norm(x, w, b, 1e-5)), [x, w, b]
        else:
            f, primals = (lambda x, w: mx.fast.rms_norm(x, w, 1e-5)), [x, w]

        def run():
            outs = []
            for _ in range(calls):
                outs += mx.vjp(f, primals, [g])[1]
            mx.eval(outs)
        return run

    def decode(model_name, layers):
        """One greedy token per eval of a random-weight mlx-lm model (the
        generation benchmark's shapes, mlx_rmsnorm/bench/generation.py), with
        `layers` decoder layers."""
        import importlib

        from mlx_lm.models import cache as kv_cache
        from mlx_rmsnorm.bench.generation import MODELS
        module_name, config = MODELS[model_name]
        module = importlib.import_module(f"mlx_lm.models.{module_name}")
        mx.random.seed(0)
        model = module.Model(module.ModelArgs(**dict(config, num_hidden_layers=layers,
                                                     vocab_size=32768)))
        model.set_dtype(mx.bfloat16)
        mx.eval(model.parameters())
        prompt = mx.random.randint(0, 32768, (1, 64))
        states = {}  # a KV cache per contender: each decodes at the same lengths

        def reset(state):
            state["cache"] = kv_cache.make_prompt_cache(model)
            logits = model(prompt, cache=state["cache"])
            state["tok"] = mx.argmax(logits[:, -1], axis=-1, keepdims=True)
            mx.eval(state["tok"])

        def step():
            state = states.setdefault((mlx_rmsnorm.is_patched(), mlx_rmsnorm.is_fused()), {})
            if "cache" not in state or state["cache"][0].offset > 512:
                reset(state)
            logits = model(state["tok"], cache=state["cache"])
            state["tok"] = mx.argmax(logits[:, -1], axis=-1, keepdims=True)
            mx.eval(state["tok"])
        return step

    def train_step(model_name, frozen=False):
        """A compiled step of examples/bench_train_step.py's models."""
        from functools import partial

        import mlx.optimizers as optim
        sys.path.insert(0, os.path.join(HERE, "..", "examples"))
        from bench_train_step import build_model
        model, _ = build_model(model_name, 32768, False, frozen)
        opt = optim.AdamW(learning_rate=1e-5)
        opt.init(model.trainable_parameters())
        tokens = mx.random.randint(0, 32768, (4, 2049))
        x, y = tokens[:, :-1], tokens[:, 1:]
        steps = {}

        def loss_fn(model, x, y):
            return nn.losses.cross_entropy(model(x), y).mean()

        def run():
            key = mlx_rmsnorm.is_patched()
            if key not in steps:  # traced under the patch state it runs in
                st = [model.state, opt.state]

                @partial(mx.compile, inputs=st, outputs=st)
                def step(x, y):
                    loss, grads = nn.value_and_grad(model, loss_fn)(model, x, y)
                    opt.update(model, grads)
                    return loss
                steps[key] = step
            mx.eval(steps[key](x, y))
        return run

    table = {
        "fwd1-2048x1024": (lambda: single_fwd(2048, 1024), 40),
        "fwd1-1x1024": (lambda: single_fwd(1, 1024), 40),
        "bwd1-8192x2048": (lambda: single_bwd(8192, 2048), 40),
        "bwd1-frozen-8192x2048": (lambda: single_bwd(8192, 2048, frozen=True), 40),
        "bwd20-8192x1024": (lambda: many_bwd(8192, 1024), 20),
        # LayerNorm (weight and bias) beside RMSNorm on the same tensors: the
        # benchmark's LN / RMS ratio at small N, in calls and kernels
        "bwd20-8192x768": (lambda: many_bwd(8192, 768), 20),
        "lnbwd20-8192x768": (lambda: many_bwd(8192, 768, layer=True), 20),
        "decode-qwen3-0.6b": (lambda: decode("qwen3-0.6b", 28), 40),
        "decode-llama-3-8b": (lambda: decode("llama-3-8b", 32), 40),
        "train-qwen3-0.6b": (lambda: train_step("qwen3-0.6b"), 6),
        "train-llama-8b-slice-frozen": (lambda: train_step("llama-8b-slice", frozen=True), 6),
        "train-llama-8b-slice": (lambda: train_step("llama-8b-slice"), 6),
    }
    return {k: v for k, v in table.items() if not names or k in names}


# contender -> how it is set: unpatched, patch(), patch(fuse=True)
CONTENDERS = {"builtin": None, "plugin": False, "fuse": True}


def set_contender(name):
    import mlx_rmsnorm
    mlx_rmsnorm.unpatch()
    if CONTENDERS[name] is not None:
        mlx_rmsnorm.patch(fuse=CONTENDERS[name])


def measure(fn, evals, counter, contenders=("builtin", "plugin")):
    import mlx_rmsnorm
    res = {}
    # interleaved: a, b, a, b, a, b; the first round warms up
    for rnd in range(3):
        for contender in contenders:
            set_contender(contender)
            for _ in range(3):
                fn()
            counter.reset()
            times = []
            for _ in range(evals):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            counts = counter.read()
            if rnd:
                r = res.setdefault(contender, {"times": [], "counts": counts})
                r["times"] += times
    mlx_rmsnorm.unpatch()
    return res


def report(name, res, evals, out, kernel_width=60, contenders=("builtin", "plugin")):
    nb, np_ = contenders  # columns "b" and "p": the first contender and the second
    b, p = res[nb], res[np_]
    ms = lambda r: statistics.median(r["times"]) * 1e3
    gpu = lambda r: sum(ns for k, (_, ns) in r["counts"].items() if k.startswith("ker:")) / evals / 1e3
    lines = [f"## {name}: {evals} evals; ms per eval (median) {nb} {ms(b):.3f}, "
             f"{np_} {ms(p):.3f} ({np_}/{nb} {ms(p) / ms(b):.3f}); GPU kernel time per eval "
             f"{nb} {gpu(b):.1f} us, {np_} {gpu(p):.1f} us"]
    get = lambda r, k: r["counts"].get(k, (0, 0))
    keys = set(b["counts"]) | set(p["counts"])
    api = sorted((k for k in keys if not k.startswith("ker:")),
                 key=lambda k: (-abs(get(p, k)[0] - get(b, k)[0]), k))
    kernels = sorted((k for k in keys if k.startswith("ker:")),
                     key=lambda k: -abs(get(p, k)[1] - get(b, k)[1]))
    for title, ks, width in (("API call", api, 44), ("kernel (GPU time)", kernels, kernel_width)):
        lines.append(f"{title:{width}} {nb + '/eval':>12} {np_ + '/eval':>12} {'us/eval b':>10} {'us/eval p':>10}")
        for k in ks:
            (calls_b, ns_b), (calls_p, ns_p) = get(b, k), get(p, k)
            lines.append(f"{k[:width]:{width}} {calls_b / evals:12.2f} {calls_p / evals:12.2f} "
                         f"{ns_b / evals / 1e3:10.2f} {ns_p / evals / 1e3:10.2f}")
    text = "\n".join(lines)
    print(text, flush=True)
    out.write(text + "\n\n")
    out.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="cuda-calls.txt")
    p.add_argument("--scenarios", default="")
    p.add_argument("--kernel-width", type=int, default=60, help="characters of kernel names shown")
    p.add_argument("--contenders", default="builtin,plugin",
                   help="the two compared, of builtin, plugin (patch()), fuse (patch(fuse=True))")
    args = p.parse_args()
    contenders = tuple(args.contenders.split(","))
    if len(contenders) != 2 or any(c not in CONTENDERS for c in contenders):
        p.error(f"--contenders takes two of {', '.join(CONTENDERS)}")
    if os.environ.get("CUDA_INJECTION64_PATH") != LIB:
        build()
        env = dict(os.environ, CUDA_INJECTION64_PATH=LIB)
        # again, by path (sys.argv[0] is this file under -m too), with the library injected
        sys.exit(subprocess.call([sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env=env))
    counter = Counter()
    names = [s for s in args.scenarios.split(",") if s]
    with open(args.out, "w") as out:
        for name, (make, evals) in scenarios(names).items():
            res = measure(make(), evals, counter, contenders)
            report(name, res, evals, out, args.kernel_width, contenders)


if __name__ == "__main__":
    main()
