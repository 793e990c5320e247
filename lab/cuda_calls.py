"""Which CUDA calls does an eval make? Counts every runtime and driver API
call (lab/cuda_calls.cpp, a CUPTI injection library) per eval, for the
built-in and for the plugin, in the workloads where a fixed cost per call
shows: one norm call per eval (forward, backward), many calls per eval, a
decode step of an mlx-lm model (one eval per token, as mlx_lm.generate) and a
compiled training step. Run on the GPU machine by scripts/gpu_run.sh (step
calls; CALLS_SCENARIOS=a,b runs those only), or by hand:

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

Timelines: the end-to-end rows that ran slower under the plugin, each built
by its benchmark's own code at the benchmark's sizes, the built-in against
the row's contender (--contenders overrides):

  trainstep-llama8b-frozen  a training step of examples/bench_train_step.py
                            --model llama-8b-slice --norms frozen (4x2048
                            tokens, bf16, compiled value_and_grad + AdamW),
                            against patch()
  prefill128-llama3-8b      a 128-token prefill of the generation benchmark
                            (mlx_rmsnorm/bench/generation.py --prompt 128),
                            Llama-3-8B's shape, against patch(fuse=True)
  prefill128-qwen3-0.6b     the same in Qwen3-0.6B's shape, against patch()

For these the report reads the library's timeline too (kernels, memcpys
and memsets with their GPU start and end, every outermost API call with its
host enter and exit) over 10 evals a contender (two blocks of 5, each after
3 untimed evals, after a warm-up round), and gives per eval: wall ms
(median, with the callbacks' cost: compare the contenders); the host
before the GPU's first activity and after its last; the GPU's span, busy
time (union of its activities) and idle gaps (sum, count, the largest by
the activities either side, with the CUDA calls the host was in
meanwhile); kernels by name (count and GPU time, those that differ
first); memcpy and memset counts and bytes; the synchronizing, graph and
memory calls and the API calls whose counts differ, with their host time;
then "## difference" lines: where the slower contender's extra time goes.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import ctypes
import glob
import os
import re
import statistics
import subprocess
import sys
import sysconfig
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = "/tmp/mlx_rmsnorm_cuda_calls.so"
TIMELINE = "/tmp/mlx_rmsnorm_cuda_calls_timeline.tsv"


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


def build(out=LIB):
    inc, lib = _cupti_dirs()
    cupti = sorted(glob.glob(os.path.join(lib, "libcupti.so*")))[0]
    subprocess.run(["g++", "-O2", "-std=c++17", "-shared", "-fPIC", f"-I{inc}",
                    os.path.join(HERE, "cuda_calls.cpp"), "-o", out, cupti,
                    f"-Wl,-rpath,{lib}"], check=True)


class Counter:
    def __init__(self):
        self.lib = ctypes.CDLL(LIB)  # the same handle the driver loaded
        self.lib.cc_now.restype = ctypes.c_ulonglong
        self.lib.cc_timeline.restype = ctypes.c_long
        self.buf = ctypes.create_string_buffer(1 << 20)

    def reset(self):
        self.lib.cc_reset()

    def now(self):
        """ns on the timeline's clock (CUPTI's, the activity records')"""
        return self.lib.cc_now()

    def read(self):
        self.lib.cc_dump(self.buf, len(self.buf))
        out = {}
        for line in self.buf.value.decode().splitlines():
            domain, name, calls, ns = line.split("\t")
            out[f"{domain[:3]}:{name}"] = (int(calls), int(ns))
        return out

    def timeline(self):
        """[(kind, start ns, end ns, bytes, name)] since the reset (cuda_calls.cpp: cc_timeline)"""
        if self.lib.cc_timeline(TIMELINE.encode()) < 0:
            raise OSError(f"cuda_calls.cpp could not write {TIMELINE}")
        with open(TIMELINE) as f:
            rows = (line.rstrip("\n").split("\t", 4) for line in f)
            return [(kind, int(s), int(e), int(b), name) for kind, s, e, b, name in rows]


# ---------------------------------------------------------------- scenarios
# the timelines' evals a block (two measured blocks a contender)
TIMELINE_EVALS = 5


def scenarios(names=(), quick=False):
    """{name: (make, evals a block, default contenders, timeline)}; `quick`
    builds the benchmarks' --quick models (a CPU's smoke test)."""
    import mlx.core as mx

    import mlx_rmsnorm
    from mlx_rmsnorm.bench.core import bias_like

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

    def many_bwd(m, n, calls=20, layer=False, chain=False):
        """`calls` backward calls in one eval; `chain`: each call's x is the
        previous call's gx (no two calls can run side by side, as in a
        model's layers; bench --chain)."""
        x, g, w = norm_inputs(m, n)
        if layer:
            f, params = (lambda x, w, b: mx.fast.layer_norm(x, w, b, 1e-5)), [w, bias_like(w)]
        else:
            f, params = (lambda x, w: mx.fast.rms_norm(x, w, 1e-5)), [w]

        def run():
            outs, xi = [], x
            for _ in range(calls):
                grads = mx.vjp(f, [xi, *params], [g])[1]
                outs += grads
                xi = grads[0] if chain else x
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
        """One step of examples/bench_train_step.py (its model, its two
        batches taken in turn, its compiled step, mx.eval(loss, state)), at
        its default sizes (--quick: its quick ones); each contender's step is
        traced under its own patch state, as the benchmark's variants are."""
        import mlx.optimizers as optim
        sys.path.insert(0, os.path.join(HERE, "..", "examples"))
        import bench_train_step as bench
        batch, seq, vocab = (2, 16, 97) if quick else (4, 2048, 32768)
        model, _ = bench.build_model(model_name, vocab, quick, frozen)
        tokens = mx.random.randint(0, vocab, (2, batch, seq + 1), key=mx.random.key(1))
        batches = [(t[:, :-1], t[:, 1:]) for t in tokens]
        mx.eval(tokens)
        opt = optim.AdamW(learning_rate=1e-5)
        opt.init(model.trainable_parameters())
        steps, taken = {}, [0]

        def run():
            key = (mlx_rmsnorm.is_patched(), mlx_rmsnorm.is_fused())
            if key not in steps:
                steps[key] = bench.make_step(model, opt)
            step, state = steps[key]
            taken[0] += 1
            mx.eval(step(*batches[taken[0] % 2]), state)
        return run

    def prefill(model_name, tokens):
        """One prefill of the generation benchmark (its model and its
        prefill(): a fresh KV cache, the prompt in one eval, the greedy
        token), a prompt of `tokens`."""
        from mlx_rmsnorm.bench import generation
        vocab = 256 if quick else 32768
        model = generation.build_model(model_name, vocab, quick)
        prompt = mx.random.randint(0, vocab, (tokens,), key=mx.random.key(1))
        mx.eval(prompt)
        return lambda: generation.prefill(model, prompt)

    counts = {
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
    # the rows measured slower than the built-in: 0.958 (patch()), 0.973
    # (patch(fuse=True); at 512 tokens 0.990, at 2048 1.011), 0.979 (patch())
    timelines = {
        "trainstep-llama8b-frozen": (lambda: train_step("llama-8b-slice", frozen=True), "plugin"),
        "prefill128-llama3-8b": (lambda: prefill("llama-3-8b", 128), "fuse"),
        "prefill128-qwen3-0.6b": (lambda: prefill("qwen3-0.6b", 128), "plugin"),
        # 20 backward calls an eval at the seed shape: what an eval adds to
        # the kernels' time (through mx.eval ours took 10-30 us a call more
        # than its kernels under ncu, the built-in 9)
        "bwd20-16384x8192": (lambda: many_bwd(16384, 8192), "plugin"),
        # a row a thread-block cluster: LayerNorm's backward took 28-46 us a
        # call more through MLX than its kernels under ncu at 4096x32768,
        # RMSNorm's 11-20
        "lnbwd20-4096x32768": (lambda: many_bwd(4096, 32768, layer=True), "plugin"),
        "bwd20-4096x32768": (lambda: many_bwd(4096, 32768), "plugin"),
        # the same chained: LayerNorm's backward took 452 us a call at
        # 4096x32768 (bench --large-n --chain, H100), RMSNorm's 303, against
        # 328 and 295 unchained and ~300 us of LayerNorm's kernels under ncu
        "lnbwd20chain-4096x32768": (lambda: many_bwd(4096, 32768, layer=True, chain=True), "plugin"),
        "bwd20chain-4096x32768": (lambda: many_bwd(4096, 32768, chain=True), "plugin"),
    }
    table = {k: (make, evals, ("builtin", "plugin"), False) for k, (make, evals) in counts.items()}
    table.update({k: (make, TIMELINE_EVALS, ("builtin", slower), True)
                  for k, (make, slower) in timelines.items()})
    return {k: v for k, v in table.items() if not names or k in names}


def scenario_names():
    return list(scenarios())


# contender -> how it is set: unpatched, patch(), patch(fuse=True)
CONTENDERS = {"builtin": None, "plugin": False, "fuse": True}


def set_contender(name):
    import mlx_rmsnorm
    mlx_rmsnorm.unpatch()
    if CONTENDERS[name] is not None:
        mlx_rmsnorm.patch(fuse=CONTENDERS[name])


def measure(fn, evals, counter, contenders=("builtin", "plugin"), timeline=False):
    """{contender: {"times": s per measured eval, "counts": its first measured
    block's, "evals": with `timeline`, (t0, t1, records) a measured eval}}"""
    import mlx_rmsnorm
    res = {}
    # interleaved: a, b, a, b, a, b; the first round warms up
    for rnd in range(3):
        for contender in contenders:
            set_contender(contender)
            for _ in range(3):
                fn()
            counter.reset()
            times, marks = [], []
            for _ in range(evals):
                t0, start = counter.now(), time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
                marks.append((t0, counter.now()))
            counts = counter.read()
            if rnd:
                r = res.setdefault(contender, {"times": [], "counts": counts, "evals": []})
                r["times"] += times
                if timeline:
                    r["evals"] += split(counter.timeline(), marks)
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
    write(out, lines)


def write(out, lines):
    text = "\n".join(lines)
    print(text, flush=True)
    out.write(text + "\n\n")
    out.flush()


# ---------------------------------------------------------------- timelines
GPU_KINDS = ("kernel", "memcpy", "memset")
NO_CALL = "(in no CUDA call)"
# driver calls that wait, launch or instantiate graphs, or take and give
# memory: shown for both contenders whether their counts differ or not
SYNC_GRAPH_MEMORY = ("cuStreamSynchronize", "cuEventSynchronize", "cuCtxSynchronize", "cuStreamWaitEvent",
                     "cuEventQuery", "cuStreamQuery", "cuLaunchHostFunc", "cuGraphLaunch", "cuGraphUpload",
                     "cuGraphInstantiate", "cuGraphExecUpdate", "cuGraphExecDestroy", "cuMemAlloc",
                     "cuMemFree", "cuMemHostAlloc", "cuMemPool", "cuMemcpy", "cuMemset")


def split(records, marks):
    """[(t0, t1, records that start within)] an eval (t0, t1): an eval's
    GPU work starts after it begins and ends before its mx.eval returns."""
    records.sort(key=lambda r: r[1])
    starts = [r[1] for r in records]
    return [(t0, t1, records[bisect.bisect_left(starts, t0):bisect.bisect_right(starts, t1)])
            for t0, t1 in marks]


def eval_timeline(t0, t1, records):
    """One eval's timeline, ns: its wall; the host before the GPU's first
    activity (lead) and after its last (tail); the GPU's span, busy time
    (the union of its kernels, copies and sets) and idle gaps; by name, the
    kernels, the copies and sets, and the host time in the outermost CUDA
    calls but waits (…Synchronize: they last as long as the GPU's work, not
    the host's); the gaps by the activities either side (count, ns, longest,
    and the calls the host was in meanwhile, by name, NO_CALL where in none)."""
    C = collections.Counter
    t = dict(wall=t1 - t0, lead=t1 - t0, span=0, busy=0, idle=0, tail=0, gaps=0, kernels=C(),
             kernel_ns=C(), moves=C(), move_bytes=C(), work_ns=C(), gap_ns=C(), in_gaps=C(), pairs={})
    gpu, api = [], []
    for kind, s, e, nbytes, name in records:
        if kind == "kernel":
            t["kernels"][name] += 1
            t["kernel_ns"][name] += e - s
            gpu.append((s, e, name))
        elif kind in GPU_KINDS:
            move = f"memcpy {name}" if kind == "memcpy" else kind  # memcpy HtoD...
            t["moves"][move] += 1
            t["move_bytes"][move] += nbytes
            gpu.append((s, e, f"[{move}]"))
        else:
            api.append((s, e, f"{kind[:3]}:{name}"))
            if "Synchronize" not in name:
                t["work_ns"][api[-1][2]] += e - s
    if not gpu:
        return t
    gpu.sort()
    api.sort()
    first, end, last = gpu[0]
    gaps, lo = [], first
    for s, e, name in gpu[1:]:
        if s > end:
            gaps.append((end, s, last, name))
            t["busy"] += end - lo
            lo = s
        if e > end:
            end, last = e, name
    t["busy"] += end - lo
    t.update(lead=first - t0, span=end - first, tail=t1 - end, idle=end - first - t["busy"], gaps=len(gaps))
    k, active = 0, []
    for a, b, before, after in gaps:
        while k < len(api) and api[k][0] < b:
            active.append(api[k])
            k += 1
        active = [c for c in active if c[1] > a]  # the rest ended before this gap and the later ones
        pair = t["pairs"].setdefault((before, after), [0, 0, 0, C()])
        pair[0] += 1
        pair[1] += b - a
        pair[2] = max(pair[2], b - a)
        t["gap_ns"][before, after] += b - a
        covered, reach = 0, a  # calls of several threads may overlap: their union
        for s, e, name in sorted(active):
            s, e = max(s, a), min(e, b)
            pair[3][name] += e - s
            covered += max(0, e - max(s, reach))
            reach = max(reach, e)
        pair[3][NO_CALL] += b - a - covered
    for *_, host in t["pairs"].values():
        t["in_gaps"].update(host)
    return t


# activities a timeline report lists in order, of one eval a contender
SEQUENCE = 12


def sequence(ev, width, limit=SEQUENCE):
    """Lines: eval `ev`'s (t0, t1, records) first `limit` GPU activities by
    start, each with the earlier ones it overlapped (which run side by side
    shows here, and in no sum of the tallies)."""
    gpu = sorted((s, e, name if kind == "kernel" else f"[{kind}]")
                 for kind, s, e, _, name in ev[2] if kind in GPU_KINDS)[:limit]
    if not gpu:
        return ["  (no GPU activity)"]
    t0, lines = gpu[0][0], []
    for i, (s, e, name) in enumerate(gpu):
        beside = [f"#{j} {(min(e, ej) - s) / 1e3:.1f}" for j, (sj, ej, _) in enumerate(gpu[:i]) if ej > s]
        lines.append(f"  #{i:<2} {(s - t0) / 1e3:9.1f} {(e - t0) / 1e3:9.1f} {(e - s) / 1e3:8.1f}  "
                     f"{short(name, width):{width}}" + (f"  beside {', '.join(beside)}" if beside else ""))
    return lines


def summarize(evals):
    """eval_timeline over a contender's evals: the tallies summed and n, the
    number of evals, to divide by."""
    total = dict(n=len(evals), pairs={})
    for ev in (eval_timeline(*e) for e in evals):
        for key, value in ev.items():
            if key == "pairs":
                for pair, (n, ns, longest, host) in value.items():
                    p = total["pairs"].setdefault(pair, [0, 0, 0, collections.Counter()])
                    p[0], p[1], p[2] = p[0] + n, p[1] + ns, max(p[2], longest)
                    p[3].update(host)
            elif isinstance(value, collections.Counter):
                total.setdefault(key, collections.Counter()).update(value)
            else:
                total[key] = total.get(key, 0) + value
    return total


def short(name, width):
    """A kernel's name as the tables show it: no return type, parameters,
    MLX's namespace or namespaces inside the template arguments, bf16 for
    __nv_bfloat16; past `width`, its start and end (MLX's fused kernels
    differ in the middle and the end)."""
    name = name.removeprefix("void ")
    if name.endswith(")"):  # the parameter list: from the ")" back to its "("
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    head, bracket, arguments = name.replace("mlx::core::cu::", "").replace("__nv_bfloat16", "bf16").partition("<")
    name = head + bracket + re.sub(r"\b\w+::", "", arguments)
    if len(name) <= width:
        return name
    keep = width - 3
    return name[:keep - keep // 2] + "..." + name[len(name) - keep // 2:]


def report_timeline(name, res, evals, out, width=60, contenders=("builtin", "plugin")):
    """The two contenders' timelines side by side (per eval), then the
    difference: where the second's extra time goes."""
    nb, ns_ = contenders
    b, s = (summarize(res[c]["evals"]) for c in contenders)
    each = lambda t, key, k=None, scale=1e3: (t[key] if k is None else t[key][k]) / t["n"] / scale  # ns -> us
    total = lambda t, key, scale=1e3: sum(t[key].values()) / t["n"] / scale
    ms = {c: statistics.median(res[c]["times"]) * 1e3 for c in contenders}
    row = lambda label, vb, vs, f=".1f": f"{label:52} {vb:12{f}} {vs:12{f}} {vs - vb:+12{f}}"
    lines = [f"## {name}: timeline of {nb} against {ns_}, {b['n']} and {s['n']} evals (2 blocks of {evals} "
             f"each, interleaved); wall ms per eval (median) {nb} {ms[nb]:.3f}, {ns_} {ms[ns_]:.3f} "
             f"({ns_}/{nb} {ms[ns_] / ms[nb]:.3f})",
             f"{'per eval, us (mean)':52} {nb:>12} {ns_:>12} {'difference':>12}"]
    for label, key in (("wall (timeline clock)", "wall"), ("  host before the GPU's first activity", "lead"),
                       ("  GPU span, first start to last end", "span"),
                       ("    busy: kernels, copies, sets (their union)", "busy"),
                       ("    idle inside the span", "idle"), ("  host after the GPU's last end", "tail")):
        lines.append(row(label, each(b, key), each(s, key)))
    lines += [row("idle gaps inside the span (count)", each(b, "gaps", scale=1), each(s, "gaps", scale=1)),
              row("kernels (count)", total(b, "kernels", 1), total(s, "kernels", 1)),
              row("kernel time (sum; above busy where kernels overlap)", total(b, "kernel_ns"), total(s, "kernel_ns"))]
    for move in sorted(set(b["moves"]) | set(s["moves"])):
        lines += [row(f"{move} (count)", each(b, "moves", move, 1), each(s, "moves", move, 1)),
                  row(f"{move} (bytes)", each(b, "move_bytes", move, 1), each(s, "move_bytes", move, 1), ".0f")]

    lines.append(f"\n{'kernel, per eval (those whose count differs first)':{width}} {nb + ' n':>9} {ns_ + ' n':>9} "
                 f"{nb + ' us':>10} {ns_ + ' us':>10} {'diff us':>9}")
    change = lambda key, k: each(s, key, k) - each(b, key, k)
    for k in sorted(set(b["kernels"]) | set(s["kernels"]),
                    key=lambda k: (change("kernels", k) == 0, -abs(change("kernel_ns", k)))):
        lines.append(f"{short(k, width):{width}} {each(b, 'kernels', k, 1):9.2f} {each(s, 'kernels', k, 1):9.2f} "
                     f"{each(b, 'kernel_ns', k):10.1f} {each(s, 'kernel_ns', k):10.1f} {change('kernel_ns', k):+9.1f}")

    for c, t in ((nb, b), (ns_, s)):
        lines.append(f"\n{c}: the largest idle gaps, by the GPU activities either side (per eval: us, count; "
                     f"the longest one; the host meanwhile in, us)")
        for (before, after), (n, ns, longest, host) in sorted(t["pairs"].items(), key=lambda p: -p[1][1])[:5]:
            inside = ", ".join(f"{call} {v / t['n'] / 1e3:.1f}" for call, v in host.most_common(3))
            lines.append(f"  {ns / t['n'] / 1e3:8.1f} us {n / t['n']:5.1f}x  longest {longest / 1e3:7.1f} us  "
                         f"{short(before, 2 * width // 3)} -> {short(after, 2 * width // 3)}  | {inside}")

    for c in contenders:
        lines += [f"\n{c}: one eval's first {SEQUENCE} GPU activities in start order (us from the first "
                  f"start: start, end, length; beside: the activities it overlapped)"]
        lines += sequence(res[c]["evals"][len(res[c]["evals"]) // 2], width)

    lines.append(f"\n{'host inside the idle gaps, in (us per eval)':52} {nb:>12} {ns_:>12} {'difference':>12}")
    for k in sorted(set(b["in_gaps"]) | set(s["in_gaps"]), key=lambda k: -abs(change("in_gaps", k)))[:8]:
        lines.append(row(k[:52], each(b, "in_gaps", k), each(s, "in_gaps", k)))

    get = lambda c, k: res[c]["counts"].get(k, (0, 0))
    keys = set(res[nb]["counts"]) | set(res[ns_]["counts"])
    waits = sorted(k for k in keys if k.startswith("dri:") and k[4:].startswith(SYNC_GRAPH_MEMORY))
    differ = sorted((k for k in keys if not k.startswith("ker:") and get(nb, k)[0] != get(ns_, k)[0]),
                    key=lambda k: (-abs(get(ns_, k)[0] - get(nb, k)[0]), k))
    for title, ks in (("driver calls: waits, graphs, memory", waits),
                      ("API calls whose counts differ", differ)):
        lines.append(f"\n{title + ' (per eval)':52} {nb + ' n':>9} {ns_ + ' n':>9} {nb + ' us':>10} "
                     f"{ns_ + ' us':>10} {'diff us':>9}")
        for k in ks:
            (calls_b, ns_b), (calls_s, ns_s) = get(nb, k), get(ns_, k)
            lines.append(f"{k[:52]:52} {calls_b / evals:9.2f} {calls_s / evals:9.2f} {ns_b / evals / 1e3:10.1f} "
                         f"{ns_s / evals / 1e3:10.1f} {(ns_s - ns_b) / evals / 1e3:+9.1f}")

    # the second's extra time, split as the timeline splits the wall, and
    # the kernels, gaps and calls behind it; "##" lines, as gpu_run.sh shows
    top = lambda key, n=3: sorted(((k, change(key, k)) for k in set(b[key]) | set(s[key])),
                                  key=lambda kv: -abs(kv[1]))[:n]
    lines += ["", f"## {ns_} - {nb}, per eval: wall {1e3 * (ms[ns_] - ms[nb]):+.1f} us (median), "
              f"{change('wall', None):+.1f} us (mean) = host before the GPU {change('lead', None):+.1f} "
              f"+ GPU busy {change('busy', None):+.1f} + idle gaps {change('idle', None):+.1f} "
              f"({each(s, 'gaps', scale=1) - each(b, 'gaps', scale=1):+.1f} gaps) "
              f"+ host after the GPU {change('tail', None):+.1f}",
              f"##   kernel time {total(s, 'kernel_ns') - total(b, 'kernel_ns'):+.1f} us: " + ", ".join(
                  f"{short(k, 40)} {v:+.1f} ({each(b, 'kernels', k, 1):.0f} -> {each(s, 'kernels', k, 1):.0f})"
                  for k, v in top("kernel_ns")),
              f"##   idle gaps {change('idle', None):+.1f} us, the host meanwhile in: " + ", ".join(
                  f"{k} {v:+.1f}" for k, v in top("in_gaps")),
              "##   gaps that grew most: " + ", ".join(
                  f"{short(before, 30)} -> {short(after, 30)} {v:+.1f}" for (before, after), v in top("gap_ns", 2)),
              f"##   host in CUDA calls other than waits {total(s, 'work_ns') - total(b, 'work_ns'):+.1f} us: "
              + ", ".join(f"{k} {v:+.1f}" for k, v in top("work_ns"))]
    # driver calls per eval whose names start so (cuMemAlloc: its _v2, Async...)
    calls = lambda c, prefix: sum(n for k, (n, _) in res[c]["counts"].items() if k.startswith("dri:" + prefix)) / evals
    lines.append("##   driver calls per eval: " + ", ".join(
        f"{label} {calls(nb, prefix):.1f} -> {calls(ns_, prefix):.1f}" for label, prefix in (
            ("graph launches", "cuGraphLaunch"), ("instantiations", "cuGraphInstantiate"),
            ("updates", "cuGraphExecUpdate"), ("allocations", "cuMemAlloc"), ("frees", "cuMemFree"))))
    write(out, lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="cuda-calls.txt")
    p.add_argument("--scenarios", default="", help="comma list (default: all); " + ", ".join(scenario_names()))
    p.add_argument("--kernel-width", type=int, default=60, help="characters of kernel names shown")
    p.add_argument("--contenders", default="",
                   help="the two compared, of builtin, plugin (patch()), fuse (patch(fuse=True)); "
                        "default builtin,plugin, for a timeline builtin and its row's")
    args = p.parse_args()
    contenders = tuple(args.contenders.split(",")) if args.contenders else None
    if contenders and (len(contenders) != 2 or any(c not in CONTENDERS for c in contenders)):
        p.error(f"--contenders takes two of {', '.join(CONTENDERS)}")
    names = [s for s in args.scenarios.split(",") if s]
    unknown = sorted(set(names) - set(scenario_names()))
    if unknown:
        p.error(f"unknown scenario(s) {', '.join(unknown)}")
    if os.environ.get("CUDA_INJECTION64_PATH") != LIB:
        build()
        env = dict(os.environ, CUDA_INJECTION64_PATH=LIB)
        # again, by path (sys.argv[0] is this file under -m too), with the library injected
        sys.exit(subprocess.call([sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env=env))
    import mlx.core as mx
    counter = Counter()
    with open(args.out, "w") as out:
        for name, (make, evals, default, timeline) in scenarios(names).items():
            pair = contenders or default
            res = measure(make(), evals, counter, pair, timeline)
            (report_timeline if timeline else report)(name, res, evals, out, args.kernel_width, pair)
            mx.clear_cache()  # the next scenario's model (Llama-3-8B's is 15 GB) in the memory of this one


if __name__ == "__main__":
    main()
