"""Training-step benchmark: mlx-lm models trained with MLX's built-in
mx.fast.rms_norm, with mlx_rmsnorm.patch() and with patch(fuse=True) (the
decoder blocks' residual add + norm as one add_rms_norm), in interleaved
rounds in one process (built-in, plugin, fused, built-in, ...).
--decode N also times text generation (N tokens, one eval per token, with a
KV cache, as mlx-lm's generate) for the three.

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
  gpt2-medium     mlx_lm.models.gpt2 in GPT-2 medium's shape (LayerNorm with
                  weight and bias): hidden 1024, 24 layers, 16 heads, tied
                  embeddings, positions extended to 4096, --vocab words;
                  patch() routes mx.fast.layer_norm there.
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
from mlx_lm.models import gpt2, llama, qwen3

import mlx_rmsnorm
from mlx_rmsnorm import _fuse
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
    # LayerNorm: GPT-2 medium's shape (hidden 1024, 24 layers, 16
    # heads, LayerNorm with weight and bias, tied embeddings), positions
    # extended to --seq.
    "gpt2-medium": (gpt2, dict(
        model_type="gpt2", n_ctx=1024, n_embd=1024, n_head=16, n_layer=24,
        n_positions=4096, layer_norm_epsilon=1e-5)),
}
# --quick: the same code paths at sizes a CPU runs in seconds
QUICK_SHAPES = {
    "gpt2-medium": dict(n_embd=64, n_layer=2, n_head=4),
    "qwen3-0.6b": dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "llama-8b-slice": dict(hidden_size=64, num_hidden_layers=2, intermediate_size=160,
                           num_attention_heads=4, num_key_value_heads=2),
}
# (name, plugin, fuse)
VARIANTS = (("mx.fast", False, False), ("mlx_rmsnorm", True, False),
            ("fuse", True, True))


def set_variant(plugin, fuse):
    mlx_rmsnorm.unpatch()  # patch() alone would leave an earlier fuse on
    if plugin:
        mlx_rmsnorm.patch(fuse=fuse)


# Models whose norms are LayerNorm (the rest are RMSNorm), and where their
# token embedding sits (its update depends on the whole backward).
LAYER_NORM_MODELS = {"gpt2-medium"}
EMBEDDING = {"gpt2-medium": ("model", "wte", "weight")}


def build_model(name, vocab, quick, frozen):
    module, config = MODELS[name]
    config = dict(config, vocab_size=vocab, **(QUICK_SHAPES[name] if quick else {}))
    mx.random.seed(0)
    model = module.Model(module.ModelArgs(**config))
    model.set_dtype(mx.bfloat16)
    if frozen:
        norm_class = nn.LayerNorm if name in LAYER_NORM_MODELS else nn.RMSNorm
        for _, m in model.named_modules():
            if isinstance(m, norm_class):
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


def record_norm_calls(model, x, layer=False):
    """Every mx.fast.rms_norm call of one forward (layer: mx.fast.layer_norm):
    (x shape, x dtype, w shape, w dtype, bias or not, eps). The modules look
    the function up at each call, so a recording stand-in sees them all; the
    graph is never evaluated."""
    calls = []
    op = "layer_norm" if layer else "rms_norm"
    current = getattr(mx.fast, op)

    def record(x, w, *rest, **kwargs):
        b, eps = rest if layer else (None, *rest)
        calls.append((tuple(x.shape), x.dtype, tuple(w.shape), w.dtype, b is not None, eps))
        return current(x, w, *rest, **kwargs)

    setattr(mx.fast, op, record)
    try:
        model(x)
    finally:
        setattr(mx.fast, op, current)
    return calls


def plugin_nodes(arrays, layer=False):
    """(forward, backward) plugin primitives in the graph that computes
    `arrays`; a fused add + norm counts as a norm."""
    counts = primitive_counts(*arrays)
    norm = "LayerNorm" if layer else "RMSNorm"
    return (counts[f"{norm}Plugin"] + counts[f"Add{norm}Plugin"],
            counts[f"{norm}PluginVJP"] + counts[f"Add{norm}PluginVJP"])


def check_graph(model, plugin, n_norms, name="", fuse=False):
    """After a step call, before its eval: the updated embedding depends on
    the whole backward, so its graph holds every norm's forward and VJP (with
    fuse, one fused add + norm per layer among them)."""
    tree = model.parameters()
    for key in EMBEDDING.get(name, ("model", "embed_tokens", "weight")):
        tree = tree[key]
    layer = name in LAYER_NORM_MODELS
    norm = "LayerNorm" if layer else "RMSNorm"
    fwd, bwd = plugin_nodes([tree], layer)
    if fuse:
        fused = primitive_counts(tree)[f"Add{norm}PluginVJP"]
        if fused < len(model.layers):
            raise SystemExit(f"fuse round: {fused} Add{norm}PluginVJP nodes, expected >= "
                             f"{len(model.layers)} (one a layer)")
    if plugin and (fwd < n_norms or bwd < n_norms):
        raise SystemExit(f"plugin round: {fwd} {norm}Plugin and {bwd} {norm}PluginVJP nodes "
                         f"(fused ones counted) in the step's graph, expected >= {n_norms} each")
    if not plugin and (fwd or bwd):
        raise SystemExit(f"built-in round: {fwd + bwd} plugin nodes in the step's graph")
    return fwd, bwd


def norm_seconds(calls, frozen, reps, layer=False):
    """{variant: median seconds} of the forward and backward of all `calls`
    (record_norm_calls) in one mx.eval, the variants interleaved rep by rep;
    w (and b) learn unless frozen."""
    arrays = []
    for i, (xs, xt, ws, wt, has_b, eps) in enumerate(calls):
        x = mx.random.normal(xs, key=mx.random.key(i)).astype(xt)
        w = (1 + 0.1 * mx.random.normal(ws, key=mx.random.key(10000 + i))).astype(wt)
        b = (0.1 * mx.random.normal(ws, key=mx.random.key(30000 + i))).astype(wt) if has_b else None
        g = mx.random.normal(xs, key=mx.random.key(20000 + i)).astype(mx.result_type(x, w))
        arrays.append((x, w, b, g, eps))
    mx.eval(arrays)
    assert not mlx_rmsnorm.is_patched()  # so mx.fast's norms are MLX's own
    op = "layer_norm" if layer else "rms_norm"
    norms = {"mx.fast": getattr(mx.fast, op), "mlx_rmsnorm": getattr(mlx_rmsnorm, op)}

    def run(norm):
        outs = []
        for x, w, b, g, eps in arrays:
            def f(x, w=w, b=b):
                return norm(x, w, b, eps) if layer else norm(x, w, eps)
            learned = [] if frozen else [a for a in (w, b) if a is not None]
            y, vjps = mx.vjp(f, [x, *learned], [g])
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
    layer = name in LAYER_NORM_MODELS
    calls = record_norm_calls(model, batches[0][0], layer)
    opt = optim.AdamW(learning_rate=1e-5)
    opt.init(model.trainable_parameters())  # the state's tree is fixed before tracing
    steps = {}
    round_ms = {v: [] for v, _, _ in VARIANTS}
    nodes = {}
    progress = _progress(args.rounds * len(VARIANTS), f"{name}, norms {'frozen' if frozen else 'trained'}")
    for r in range(args.rounds):
        for variant, plugin, fuse in VARIANTS:
            set_variant(plugin, fuse)
            if variant not in steps:
                steps[variant] = make_step(model, opt)  # traced below, under this patch state
            step, state = steps[variant]
            for i in range(args.warmup):
                loss = step(*batches[i % 2])
                if i == 0:
                    nodes[variant] = check_graph(model, plugin, len(calls), name, fuse)
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
    norm_s = norm_seconds(calls, frozen, args.norm_reps, layer)
    mx.clear_cache()
    mlx_rmsnorm.trim_device_memory()
    ratios = [a / b for a, b in zip(round_ms["mx.fast"], round_ms["mlx_rmsnorm"])]
    # fuse against the plugin alone and against the built-in, round by round
    fuse_vs_plugin = [a / b for a, b in zip(round_ms["mlx_rmsnorm"], round_ms["fuse"])]
    fuse_vs_builtin = [a / b for a, b in zip(round_ms["mx.fast"], round_ms["fuse"])]
    tok = args.batch * args.seq
    return dict(model=name, norms="frozen" if frozen else "trained", config=config,
                norm="LayerNorm" if layer else "RMSNorm",
                tokens_per_step=tok, norm_calls=len(calls), plugin_nodes=nodes,
                round_ms=round_ms, speedup=ratios, fuse_vs_plugin=fuse_vs_plugin,
                fuse_vs_builtin=fuse_vs_builtin,
                norm_ms={v: 1e3 * s for v, s in norm_s.items()},
                share={v: 100 * 1e3 * norm_s[v] / statistics.median(round_ms[v])
                       for v in norm_s})


def print_result(res):
    tok = res["tokens_per_step"]
    print(f"\n{res['model']}, norm weights {res['norms']}: {tok} tokens a step, "
          f"{res['norm_calls']} {res['norm']} calls a step; plugin graph nodes (forward, VJP): "
          f"{res['plugin_nodes']['mlx_rmsnorm']}; {res['seconds']:.0f} s")
    for v, _, _ in VARIANTS:
        ms = res["round_ms"][v]
        norm = (f"{res['norm']} fwd+bwd {res['norm_ms'][v]:6.2f} ms = {res['share'][v]:4.1f}% of the step"
                if v in res["norm_ms"] else "")
        print(f"  {v:12} {spread(ms):>24} ms/step  {spread([tok / m for m in ms], 1e3, '{:.0f}'):>26} "
              f"tokens/s  {norm}")
    print(f"  speedup built-in / plugin: {spread(res['speedup'])} over {len(res['speedup'])} rounds: "
          + " ".join(f"{x:.3f}" for x in res["speedup"]))
    print(f"  speedup plugin / fuse: {spread(res['fuse_vs_plugin'], fmt='{:.3f}')}; "
          f"built-in / fuse: {spread(res['fuse_vs_builtin'], fmt='{:.3f}')}")


def print_table(results):
    print("\nms/step and speedup: median [min-max] over rounds; RMSNorm share: the norm calls "
          "of one step timed alone")
    hdr = (f"{'model':15} {'norms':8} {'mx.fast ms':>22} {'plugin ms':>22} {'fuse ms':>22} "
           f"{'speedup':>19} {'plugin/fuse':>19} "
           f"{'plugin tok/s':>12} {'norm ms fast/plugin':>19} {'share fast/plugin':>17}")
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        ms_b, ms_p = r["round_ms"]["mx.fast"], r["round_ms"]["mlx_rmsnorm"]
        print(f"{r['model']:15} {r['norms']:8} {spread(ms_b):>22} {spread(ms_p):>22} "
              f"{spread(r['round_ms']['fuse']):>22} "
              f"{spread(r['speedup'], fmt='{:.3f}'):>19} "
              f"{spread(r['fuse_vs_plugin'], fmt='{:.3f}'):>19} "
              f"{r['tokens_per_step'] / statistics.median(ms_p) * 1e3:12.0f} "
              f"{r['norm_ms']['mx.fast']:9.2f}/{r['norm_ms']['mlx_rmsnorm']:<9.2f} "
              f"{r['share']['mx.fast']:7.1f}%/{r['share']['mlx_rmsnorm']:.1f}%")


def bench_decode(name, args):
    """ms per generated token (one mx.eval per token, KV cache, greedy) after a
    128-token prompt, through the generation benchmark's loop
    (mlx_rmsnorm/bench/generation.py): each variant on its own KV cache, the
    variants taking the tokens in turn, the order rotating every token (one
    variant's --decode tokens after another's would put the machine's drift
    between them)."""
    from types import SimpleNamespace

    from mlx_rmsnorm.bench import generation

    model, _ = build_model(name, args.vocab, args.quick, frozen=False)
    opts = SimpleNamespace(vocab=args.vocab, quick=args.quick, rounds=args.rounds,
                           prompt=16 if args.quick else 128, tokens=args.decode)
    rounds, _ = generation.bench(name, opts, generation._NoProgress(), model=model)
    # (this file's VARIANTS carry the generation benchmark's names)
    per_token = {v: [1e3 * step for _, step in rounds[v]] for v, _, _ in VARIANTS}
    return dict(model=name, tokens=args.decode, ms_per_token=per_token)


def print_decode(res):
    ms = res["ms_per_token"]
    print(f"\n{res['model']} decode, ms per token, {res['tokens']} tokens a round (median [min-max] "
          f"over rounds of each round's median token): "
          + "; ".join(f"{v} {spread(ms[v], fmt='{:.3f}')}" for v, _, _ in VARIANTS))
    ratio = [a / b for a, b in zip(ms["mlx_rmsnorm"], ms["fuse"])]
    ratio_b = [a / b for a, b in zip(ms["mx.fast"], ms["fuse"])]
    print(f"  plugin / fuse {spread(ratio, fmt='{:.3f}')}; built-in / fuse {spread(ratio_b, fmt='{:.3f}')}")


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
    p.add_argument("--decode", type=int, default=0, help="also time generating this many tokens")
    p.add_argument("--no-train", action="store_true", help="skip the training steps (with --decode)")
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
        # the fused path too: patch(fuse=True) leaves blocks of fewer rows
        # (32 here) than _fuse.min_rows() to their own code
        _fuse.set_min_rows(0)

    on_gpu = mx.is_available(mx.gpu) and mlx_rmsnorm.has_cuda_kernels()
    mx.set_default_device(mx.gpu if on_gpu else mx.cpu)
    if not on_gpu:
        # on a CPU stream patch() alone runs MLX's own norm: the plugin rounds
        # would time the built-in against itself
        mlx_rmsnorm.route_cpu(True)
    print(f"device: {mx.default_device()} | bf16, compiled step (value_and_grad + AdamW) | "
          f"{args.batch}x{args.seq} tokens | vocab {args.vocab} | {args.rounds} rounds x "
          f"{args.steps_per_round} steps per variant (+{args.warmup} warm-up a round), interleaved")
    results = []
    t0 = time.perf_counter()
    for name in names:
        if args.decode:
            res = bench_decode(name, args)
            print_decode(res)
            results.append(res)
            sys.stdout.flush()
        for mode in ([] if args.no_train else modes):
            t1 = time.perf_counter()
            res = bench(name, mode == "frozen", args)
            res["seconds"] = time.perf_counter() - t1
            print_result(res)
            results.append(res)
            sys.stdout.flush()
    print_table([r for r in results if "round_ms" in r])
    print(f"\n{time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=str(mx.default_device()), args=vars(args), results=results),
                      f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
