"""Training-step benchmark: mlx-lm models trained with MLX's built-in
mx.fast.rms_norm and with mlx_rmsnorm.patch(), in interleaved rounds in one
process (built-in, plugin, built-in, plugin, ...).

    python examples/bench_train_step.py [--model qwen3-0.6b,llama-8b-slice]
        [--norms trained,frozen] [--rounds 6] [--steps-per-round 5]
        [--warmup 1] [--batch 4] [--seq 2048] [--vocab 32768] [--quick]
        [--json PATH]

Models (random weights, nothing downloaded, bf16 throughout, norm weights
included, as a bf16 checkpoint loads):
  qwen3-0.6b      mlx_lm.models.qwen3 in Qwen3-0.6B's shape: hidden 1024,
                  28 layers, 16 q heads / 8 kv heads of 128 (QK-norm),
                  intermediate 3072, tied embeddings; the vocabulary is cut
                  to --vocab (32768; the real one has 151936) to keep memory
                  and time down: it only changes the embedding and the head.
  llama-8b-slice  mlx_lm.models.llama in Llama-3-8B's layer shape: hidden
                  4096, intermediate 14336, 32 heads / 8 kv, 4 of its 32
                  layers, --vocab words, untied head.
Norms: "trained" (every parameter learns) and "frozen" (every nn.RMSNorm
frozen, so the norms' backward needs gx only, as in LoRA fine-tuning).

Each step is nn.value_and_grad + AdamW inside mx.compile (model and optimizer
state as the compiled function's state), --batch x --seq tokens. mx.compile
caches a traced graph per function, so each variant gets its own compiled
step function, traced on its first call with the plugin patched in or not;
every round then patches or unpatches and checks, from the graph of its first
(untimed) step, that the plugin's primitives (RMSNormPlugin, RMSNormPluginVJP)
are there in the plugin's rounds and absent in the built-in's.

Printed per model and norm mode: ms/step and tokens/s (median [min-max] over
rounds of each round's median step), the speedup built-in / plugin (median
[min-max] of the per-round ratios, each plugin round against the built-in
round before it), and the share of the step spent in RMSNorm: the forward and
backward of every norm call of one step (recorded from the model itself:
shapes, dtypes, eps), timed on their own with contiguous cotangents, all in
one mx.eval.
"""

import argparse
import json
import statistics
import sys
import time
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx_lm.models import llama, qwen3

import mlx_rmsnorm
from mlx_rmsnorm._autopatch import primitive_counts

MODELS = {
    "qwen3-0.6b": (qwen3, dict(
        model_type="qwen3", hidden_size=1024, num_hidden_layers=28, intermediate_size=3072,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
        max_position_embeddings=40960, tie_word_embeddings=True, rope_theta=1000000.0)),
    "llama-8b-slice": (llama, dict(
        model_type="llama", hidden_size=4096, num_hidden_layers=4, intermediate_size=14336,
        num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5,
        max_position_embeddings=8192, tie_word_embeddings=False, rope_theta=500000.0)),
}
# --quick: the same code paths at sizes a CPU runs in seconds
QUICK_SHAPES = {
    "qwen3-0.6b": dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "llama-8b-slice": dict(hidden_size=64, num_hidden_layers=2, intermediate_size=160,
                           num_attention_heads=4, num_key_value_heads=2),
}
VARIANTS = (("mx.fast", False), ("mlx_rmsnorm", True))


def build_model(name, vocab, quick, frozen):
    module, config = MODELS[name]
    config = dict(config, vocab_size=vocab, **(QUICK_SHAPES[name] if quick else {}))
    mx.random.seed(0)
    model = module.Model(module.ModelArgs(**config))
    model.set_dtype(mx.bfloat16)
    if frozen:
        for _, m in model.named_modules():
            if isinstance(m, nn.RMSNorm):
                m.freeze()
    mx.eval(model.parameters())
    return model, config


def loss_fn(model, x, y):
    return nn.losses.cross_entropy(model(x), y).mean()  # as mlx-lm's trainer


def make_step(model, opt):
    state = [model.state, opt.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(x, y):
        loss, grads = nn.value_and_grad(model, loss_fn)(model, x, y)
        opt.update(model, grads)
        return loss

    return step, state


def record_norm_calls(model, x):
    """Every mx.fast.rms_norm call of one forward: (x shape, x dtype, w
    shape, w dtype, eps). nn.RMSNorm looks mx.fast.rms_norm up at each call,
    so a recording stand-in sees them all; the graph is never evaluated."""
    calls = []
    current = mx.fast.rms_norm

    def record(x, w, eps, **kwargs):
        calls.append((tuple(x.shape), x.dtype, tuple(w.shape), w.dtype, eps))
        return current(x, w, eps, **kwargs)

    mx.fast.rms_norm = record
    try:
        model(x)
    finally:
        mx.fast.rms_norm = current
    return calls


def plugin_nodes(arrays):
    """(forward, backward) plugin primitives in the graph that computes `arrays`."""
    counts = primitive_counts(*arrays)
    return counts["RMSNormPlugin"], counts["RMSNormPluginVJP"]


def check_graph(model, plugin, n_norms):
    """After a step call, before its eval: the updated embedding depends on
    the whole backward, so its graph holds every norm's forward and VJP."""
    fwd, bwd = plugin_nodes([model.parameters()["model"]["embed_tokens"]["weight"]])
    if plugin and (fwd < n_norms or bwd < n_norms):
        raise SystemExit(f"plugin round: {fwd} RMSNormPlugin and {bwd} RMSNormPluginVJP "
                         f"nodes in the step's graph, expected >= {n_norms} each")
    if not plugin and (fwd or bwd):
        raise SystemExit(f"built-in round: {fwd + bwd} plugin nodes in the step's graph")
    return fwd, bwd


def norm_seconds(calls, frozen, reps):
    """{variant: median seconds} of the forward and backward of all `calls`
    in one mx.eval, the variants interleaved rep by rep."""
    arrays = []
    for i, (xs, xt, ws, wt, eps) in enumerate(calls):
        x = mx.random.normal(xs, key=mx.random.key(i)).astype(xt)
        w = (1 + 0.1 * mx.random.normal(ws, key=mx.random.key(10000 + i))).astype(wt)
        g = mx.random.normal(xs, key=mx.random.key(20000 + i)).astype(mx.result_type(x, w))
        arrays.append((x, w, g, eps))
    mx.eval(arrays)
    assert not mlx_rmsnorm.is_patched()  # so mx.fast.rms_norm is MLX's own
    norms = {"mx.fast": mx.fast.rms_norm, "mlx_rmsnorm": mlx_rmsnorm.rms_norm}

    def run(norm):
        outs = []
        for x, w, g, eps in arrays:
            if frozen:
                y, vjps = mx.vjp(lambda x: norm(x, w, eps), [x], [g])
            else:
                y, vjps = mx.vjp(lambda x, w: norm(x, w, eps), [x, w], [g])
            outs += [*y, *vjps]
        t0 = time.perf_counter()
        mx.eval(outs)
        return time.perf_counter() - t0

    times = {name: [] for name in norms}
    for r in range(reps + 1):
        for name, norm in norms.items():
            t = run(norm)
            if r:  # the first rep warms up
                times[name].append(t)
    del arrays
    mx.clear_cache()
    return {name: statistics.median(t) for name, t in times.items()}


def _progress(total, desc):
    """A bar on stderr that moves every round of a variant (a CPU run of the
    full-size models takes many minutes); None without tqdm."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="round", file=sys.stderr)


def spread(values, scale=1.0, fmt="{:.2f}"):
    v = [scale * x for x in values]
    return f"{fmt.format(statistics.median(v))} [{fmt.format(min(v))}-{fmt.format(max(v))}]"


def bench(name, frozen, args):
    model, config = build_model(name, args.vocab, args.quick, frozen)
    tokens = mx.random.randint(0, args.vocab, (2, args.batch, args.seq + 1), key=mx.random.key(1))
    batches = [(t[:, :-1], t[:, 1:]) for t in tokens]
    mx.eval(tokens)
    mlx_rmsnorm.unpatch()
    calls = record_norm_calls(model, batches[0][0])
    opt = optim.AdamW(learning_rate=1e-5)
    opt.init(model.trainable_parameters())  # the state's tree is fixed before tracing
    steps = {}
    round_ms = {v: [] for v, _ in VARIANTS}
    nodes = {}
    progress = _progress(args.rounds * len(VARIANTS), f"{name}, norms {'frozen' if frozen else 'trained'}")
    for r in range(args.rounds):
        for variant, plugin in VARIANTS:
            (mlx_rmsnorm.patch if plugin else mlx_rmsnorm.unpatch)()
            if variant not in steps:
                steps[variant] = make_step(model, opt)  # traced below, under this patch state
            step, state = steps[variant]
            for i in range(args.warmup):
                loss = step(*batches[i % 2])
                if i == 0:
                    nodes[variant] = check_graph(model, plugin, len(calls))
                mx.eval(loss, state)
            times = []
            for i in range(args.steps_per_round):
                x, y = batches[i % 2]
                t0 = time.perf_counter()
                loss = step(x, y)
                mx.eval(loss, state)
                times.append(time.perf_counter() - t0)
            if not mx.isfinite(loss).item():
                raise SystemExit(f"{name}: non-finite loss in a {variant} round")
            round_ms[variant].append(1e3 * statistics.median(times))
            if progress is not None:
                progress.update(1)
    if progress is not None:
        progress.close()
    mlx_rmsnorm.unpatch()
    del steps, step, state, loss, opt, model, batches, tokens  # free before the norm timing
    mx.clear_cache()
    norm_s = norm_seconds(calls, frozen, args.norm_reps)
    mx.clear_cache()
    mlx_rmsnorm.trim_device_memory()
    ratios = [a / b for a, b in zip(round_ms["mx.fast"], round_ms["mlx_rmsnorm"])]
    tok = args.batch * args.seq
    return dict(model=name, norms="frozen" if frozen else "trained", config=config,
                tokens_per_step=tok, norm_calls=len(calls), plugin_nodes=nodes,
                round_ms=round_ms, speedup=ratios,
                norm_ms={v: 1e3 * s for v, s in norm_s.items()},
                share={v: 100 * 1e3 * norm_s[v] / statistics.median(round_ms[v])
                       for v, _ in VARIANTS})


def print_result(res):
    tok = res["tokens_per_step"]
    print(f"\n{res['model']}, norm weights {res['norms']}: {tok} tokens a step, "
          f"{res['norm_calls']} RMSNorm calls a step; plugin graph nodes (forward, VJP): "
          f"{res['plugin_nodes']['mlx_rmsnorm']}; {res['seconds']:.0f} s")
    for v, _ in VARIANTS:
        ms = res["round_ms"][v]
        print(f"  {v:12} {spread(ms):>24} ms/step  {spread([tok / m for m in ms], 1e3, '{:.0f}'):>26} "
              f"tokens/s  RMSNorm fwd+bwd {res['norm_ms'][v]:6.2f} ms = {res['share'][v]:4.1f}% of the step")
    print(f"  speedup built-in / plugin: {spread(res['speedup'])} over {len(res['speedup'])} rounds: "
          + " ".join(f"{x:.3f}" for x in res["speedup"]))


def print_table(results):
    print("\nms/step and speedup: median [min-max] over rounds; RMSNorm share: the norm calls "
          "of one step timed alone")
    hdr = (f"{'model':15} {'norms':8} {'mx.fast ms':>22} {'plugin ms':>22} {'speedup':>19} "
           f"{'plugin tok/s':>12} {'norm ms fast/plugin':>19} {'share fast/plugin':>17}")
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        ms_b, ms_p = r["round_ms"]["mx.fast"], r["round_ms"]["mlx_rmsnorm"]
        print(f"{r['model']:15} {r['norms']:8} {spread(ms_b):>22} {spread(ms_p):>22} "
              f"{spread(r['speedup'], fmt='{:.3f}'):>19} "
              f"{r['tokens_per_step'] / statistics.median(ms_p) * 1e3:12.0f} "
              f"{r['norm_ms']['mx.fast']:9.2f}/{r['norm_ms']['mlx_rmsnorm']:<9.2f} "
              f"{r['share']['mx.fast']:7.1f}%/{r['share']['mlx_rmsnorm']:.1f}%")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=",".join(MODELS), help=f"comma list from {','.join(MODELS)}")
    p.add_argument("--norms", default="trained,frozen", help="comma list from trained,frozen")
    p.add_argument("--rounds", type=int, default=6, help="rounds per variant (interleaved)")
    p.add_argument("--steps-per-round", type=int, default=5, help="timed steps per round")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps at the start of each round (>= 1)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--norm-reps", type=int, default=5, help="repeats of the norm-only timing")
    p.add_argument("--quick", action="store_true", help="tiny models, CPU smoke test")
    p.add_argument("--json", default="", help="write the results there")
    args = p.parse_args(argv)
    names = [s.strip() for s in args.model.split(",") if s.strip()]
    modes = [s.strip() for s in args.norms.split(",") if s.strip()]
    if any(n not in MODELS for n in names) or any(m not in ("trained", "frozen") for m in modes):
        p.error(f"--model from {list(MODELS)}, --norms from trained,frozen")
    if args.warmup < 1:
        p.error("--warmup must be >= 1 (the first step of a round is the one whose graph is checked)")
    if args.quick:
        args.rounds, args.steps_per_round = min(args.rounds, 2), min(args.steps_per_round, 2)
        args.batch, args.seq, args.vocab, args.norm_reps = 2, 16, 97, 2

    on_gpu = mx.is_available(mx.gpu) and mlx_rmsnorm.has_cuda_kernels
    mx.set_default_device(mx.gpu if on_gpu else mx.cpu)
    print(f"device: {mx.default_device()} | bf16, compiled step (value_and_grad + AdamW) | "
          f"{args.batch}x{args.seq} tokens | vocab {args.vocab} | {args.rounds} rounds x "
          f"{args.steps_per_round} steps per variant (+{args.warmup} warm-up a round), interleaved")
    results = []
    t0 = time.perf_counter()
    for name in names:
        for mode in modes:
            t1 = time.perf_counter()
            res = bench(name, mode == "frozen", args)
            res["seconds"] = time.perf_counter() - t1
            print_result(res)
            results.append(res)
            sys.stdout.flush()
    print_table(results)
    print(f"\n{time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=str(mx.default_device()), args=vars(args), results=results),
                      f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
