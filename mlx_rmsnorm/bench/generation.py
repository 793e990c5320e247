"""Generation benchmark: mlx-lm models generating with MLX's built-in
mx.fast.rms_norm, with mlx_rmsnorm.patch() and with patch(fuse=True), in
interleaved rounds in one process.

    python -m mlx_rmsnorm.bench --generate [--quick] [--out DIR]
    python -m mlx_rmsnorm.bench.generation [--models qwen3-0.6b,llama-3-8b,gpt2-medium]
        [--rounds 7] [--prompt 2048] [--tokens 64] [--vocab 32768] [--quick]

What mlx-lm's generate does, without its sampler and detokenizer: the prompt
in one eval (prefill, filling the KV cache), then greedy decoding, one eval
per token. Random weights in bf16, nothing downloaded:
  qwen3-0.6b   Qwen3-0.6B's shape: hidden 1024, 28 layers, 16/8 heads of 128
               (QK-norm: 4 norm calls a layer), tied embeddings
  llama-3-8b   Llama-3-8B's shape: hidden 4096, 32 layers, 32/8 heads, 14336
  gpt2-medium  GPT-2 medium's shape: hidden 1024, 24 layers, 16 heads, LayerNorm
               with weight and bias (fuse: add_layer_norm), positions to 4096
The vocabulary is --vocab (the real ones are 151936, 128256 and 50257): it
sizes only the embedding and the head, which the norm never sees. --quick
(what `python -m mlx_rmsnorm.bench` runs on a CPU) builds toy models of the
same architectures instead, 2 layers of hidden 64, and labels them so ("qwen3 toy,
2 layers, hidden 64"): the same code paths in seconds, no figure of the real
models.

Contenders: the built-in, patch(), and patch(fuse=True) (the residual add
fused into the norm where mlx_rmsnorm.fused_architectures() lists the model).
Each round, every contender prefills its own KV cache, then the contenders
decode in turn, one token each, the order rotating every token (the machine's
drift, which moved a Llama token between 6.8 and 8.0 ms from one stretch of
seconds to the next, then falls on all of them alike; switching before every
token biased none of them: docs/NOTES.md, Fused residual add). --switch
round: each contender decodes its tokens in one run instead, after one
switch and two untimed tokens, the order rotating every round (what a user
runs, patch() once; the drift then falls on the contenders unevenly within a
round, and its spread is wider). A row gives ms (median
[min-max] over rounds of each round's figure: the prefill, the median decode
step) and the ratios built-in / plugin, built-in / fused and plugin / fused
(median [min-max] of per-round ratios). The greedy tokens of every contender
and round must be the built-in's first round's; where they part, the built-in's margin between
its two best logits at that step must be within bf16 rounding (a near-tie),
or the run fails.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time

import mlx.core as mx

MODELS = {
    "qwen3-0.6b": ("qwen3", dict(
        model_type="qwen3", hidden_size=1024, num_hidden_layers=28, intermediate_size=3072,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
        max_position_embeddings=40960, tie_word_embeddings=True, rope_theta=1000000.0)),
    "llama-3-8b": ("llama", dict(
        model_type="llama", hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
        num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5,
        max_position_embeddings=8192, tie_word_embeddings=False, rope_theta=500000.0)),
    "gpt2-medium": ("gpt2", dict(
        model_type="gpt2", n_ctx=1024, n_embd=1024, n_head=16, n_layer=24,
        n_positions=4096, layer_norm_epsilon=1e-5)),
}
# --quick: the same code paths at sizes a CPU runs in seconds
QUICK_SHAPES = {
    "qwen3-0.6b": dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "llama-3-8b": dict(hidden_size=64, num_hidden_layers=2, intermediate_size=160,
                       num_attention_heads=4, num_key_value_heads=2),
    "gpt2-medium": dict(n_embd=64, n_layer=2, n_head=4),
}
# (name, patch(), fuse): the built-in, patch(), patch(fuse=True) (the
# residual add fused into the norm, mlx_rmsnorm/_fuse.py)
VARIANTS = (("mx.fast", False, False), ("mlx_rmsnorm", True, False), ("fuse", True, True))
# Two logits within this of each other are a tie at bf16 resolution (8 bits
# of mantissa: 2^-7 relative at logits of magnitude ~1-4).
TIE = 0.05
# --switch round: tokens each contender decodes untimed after its switch
WARM_TOKENS = 2


def label(name, quick):
    """What a row calls the model: its name at full size; at --quick size
    what it is, a toy of the same architecture."""
    if not quick:
        return name
    shape = QUICK_SHAPES[name]
    layers = shape.get("num_hidden_layers", shape.get("n_layer"))
    hidden = shape.get("hidden_size", shape.get("n_embd"))
    return f"{MODELS[name][0]} toy, {layers} layers, hidden {hidden}"


def build_model(name, vocab, quick):
    import importlib

    module_name, config = MODELS[name]
    module = importlib.import_module(f"mlx_lm.models.{module_name}")
    config = dict(config, vocab_size=vocab, **(QUICK_SHAPES[name] if quick else {}))
    mx.random.seed(0)
    model = module.Model(module.ModelArgs(**config))
    model.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())
    return model


def prefill(model, prompt):
    """(seconds, KV cache, logits, greedy token) of the prompt in one eval."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    t0 = time.perf_counter()
    logits = model(prompt[None], cache=cache)[:, -1]
    tok = mx.argmax(logits, axis=-1)
    mx.eval(tok)
    return time.perf_counter() - t0, cache, logits, tok


def decode_step(model, cache, tok):
    """(seconds, logits, greedy token) of one token in one eval."""
    t0 = time.perf_counter()
    logits = model(tok[:, None], cache=cache)[:, -1]
    tok = mx.argmax(logits, axis=-1)
    mx.eval(tok, logits)
    return time.perf_counter() - t0, logits, tok


def _use(plugin, fuse):
    import mlx_rmsnorm

    mlx_rmsnorm.unpatch()  # patch() alone would leave an earlier fuse on
    if plugin:
        mlx_rmsnorm.patch(fuse=fuse)


def turns(contenders, r, tokens, switch):
    """(contender, switch to it first, timed) in the order the contenders
    decode in round r: ``switch`` "token", one token each in turn, the order
    rotating every token; "round", each its tokens in one run after
    WARM_TOKENS untimed ones, the order rotating every round."""
    k = len(contenders)
    if switch == "token":
        for i in range(tokens):
            for j in range(k):
                yield contenders[(r + i + j) % k], True, True
    else:
        for j in range(k):
            for i in range(WARM_TOKENS + tokens):
                yield contenders[(r + j) % k], i == 0, i >= WARM_TOKENS


def check_tokens(reference, margins, tokens, label):
    for i, (a, b) in enumerate(zip(reference, tokens)):
        if a != b:
            if margins[i] > TIE:
                raise SystemExit(f"{label}: greedy token {i} is {b}, the built-in's {a} "
                                 f"(its top-2 margin {margins[i]:.3g} is no tie)")
            return i  # a near-tie: the rest follows another context
    return None


def bench(name, args, progress, model=None):
    """{variant: [(prefill s, median decode step s)] a round}, and where the
    greedy tokens parted at near-ties; ``model``: one built by the caller
    (examples/bench_train_step.py --decode) instead of MODELS[name]. In a
    round each contender prefills its own KV cache, then the contenders decode token by token in turn (the
    order rotating every token; args.switch "round": a run each), each on its own cache: a round's figures
    are taken over the same seconds of the machine's drift, so the per-round
    ratios compare like with like."""
    import mlx_rmsnorm

    if model is None:
        model = build_model(name, args.vocab, args.quick)
    prompt = mx.random.randint(0, args.vocab, (args.prompt,), key=mx.random.key(1))
    mx.eval(prompt)
    rounds = {v: [] for v, _, _ in VARIANTS}
    reference = None
    parted = []
    k = len(VARIANTS)
    rotated = lambda i: [VARIANTS[(i + j) % k] for j in range(k)]
    switch = getattr(args, "switch", "token")
    for r in range(args.rounds + 1):  # the first round warms up
        state = {}
        for variant, plugin, fuse in rotated(r):
            _use(plugin, fuse)
            seconds, cache, logits, tok = prefill(model, prompt)
            state[variant] = dict(prefill=seconds, cache=cache, logits=logits, tok=tok,
                                  steps=[], tokens=[], margins=[])
        def step(variant, timed):
            st = state[variant]
            top2 = mx.topk(st["logits"].astype(mx.float32), 2, axis=-1)
            st["tokens"].append(st["tok"].item())
            st["margins"].append(abs((top2[0, 1] - top2[0, 0]).item()))
            seconds, st["logits"], st["tok"] = decode_step(model, st["cache"], st["tok"])
            if timed:
                st["steps"].append(seconds)

        for (variant, plugin, fuse), switch_first, timed in turns(VARIANTS, r, args.tokens, switch):
            if switch_first:
                _use(plugin, fuse)
            step(variant, timed)
        for variant, _, _ in VARIANTS:
            st = state[variant]
            if reference is None:
                reference = (st["tokens"], st["margins"])
            else:
                where = check_tokens(*reference, st["tokens"], f"{name} {variant} round {r}")
                if where is not None:
                    parted.append(where)
            if r:
                rounds[variant].append((st["prefill"], statistics.median(st["steps"])))
        progress.update(k)
    mlx_rmsnorm.unpatch()
    del model, state
    mx.clear_cache()
    return rounds, parted


def spread(med, lo, hi):
    return f"{med:.3f} [{lo:.3f}-{hi:.3f}]"


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m mlx_rmsnorm.bench.generation", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help=f"comma list from {','.join(MODELS)}")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (+1 warm-up; 7, --quick 2)")
    p.add_argument("--prompt", type=int, default=None, help="prompt tokens (one prefill eval; 2048, --quick 32)")
    p.add_argument("--tokens", type=int, default=None, help="decode steps a round (64, --quick 4)")
    p.add_argument("--vocab", type=int, default=None, help="(32768, --quick 256)")
    p.add_argument("--quick", action="store_true", help="tiny models, a few tokens (CI, CPU); "
                   "the options above, where given, still apply")
    p.add_argument("--switch", choices=("token", "round"), default="token",
                   help="contenders take turns before every token (default) or once a round")
    p.add_argument("--out", default="bench-results", help="folder for the CSV")
    args = p.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad:
        raise SystemExit(f"unknown model(s) {bad}; choose from {list(MODELS)}")
    defaults = dict(rounds=2, prompt=32, tokens=4, vocab=256) if args.quick else \
        dict(rounds=7, prompt=2048, tokens=64, vocab=32768)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    device = mx.default_device()
    print(f"generation: device {device}, bf16, prompt {args.prompt} tokens in one eval, "
          f"{args.tokens} greedy tokens one eval each, {args.rounds} interleaved rounds (+1 warm-up)")
    total = len(models) * (args.rounds + 1) * len(VARIANTS)
    try:  # a bar that moves at every round of every contender
        from tqdm import tqdm

        progress = tqdm(total=total, desc="generate", unit="round", file=sys.stderr)
    except ImportError:  # progress is a nicety, never a requirement
        progress = _NoProgress()
    rows = []
    for name in models:
        rounds, parted = bench(name, args, progress)
        b, o, f = rounds["mx.fast"], rounds["mlx_rmsnorm"], rounds["fuse"]
        for i, phase in enumerate(("prefill", "decode")):
            row = dict(model=label(name, args.quick), phase=phase)
            for key, r in (("builtin", b), ("ours", o), ("fuse", f)):
                v = [x[i] * 1e3 for x in r]
                row.update({f"{key}_ms": statistics.median(v), f"{key}_min": min(v), f"{key}_max": max(v)})
            # each round's plugin (or fused) figure against the built-in's of that
            # round, and the fused one against patch()'s
            for key, base, r in (("ratio", b, o), ("fuse_ratio", b, f), ("fuse_vs_ours", o, f)):
                v = [bb[i] / oo[i] for bb, oo in zip(base, r)]
                row.update({key: statistics.median(v), f"{key}_min": min(v), f"{key}_max": max(v)})
            row["tokens_parted_at"] = min(parted) if parted else ""
            rows.append(row)
    progress.close()
    width = max(len(r["model"]) for r in rows)
    print(f"\n{'model':{width}} {'phase':8} {'mx.fast ms':>24} {'patch() ms':>24} {'built-in/ours':>22} "
          f"{'patch(fuse=True) ms':>24} {'built-in/fuse':>22} {'patch()/fuse':>22}")
    for r in rows:
        cell = lambda k: spread(r[k], r[k.replace("_ms", "") + "_min"], r[k.replace("_ms", "") + "_max"])
        print(f"{r['model']:{width}} {r['phase']:8} {cell('builtin_ms'):>24} {cell('ours_ms'):>24} "
              f"{cell('ratio'):>22} {cell('fuse_ms'):>24} {cell('fuse_ratio'):>22} "
              f"{cell('fuse_vs_ours'):>22}")
    parted = [r for r in rows if r["tokens_parted_at"] != ""]
    print("greedy tokens: " + ("the same in every round" if not parted else
          "; ".join(f"{r['model']} parted at a near-tie, step {r['tokens_parted_at']}" for r in parted[::2])))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "generate.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"results: {path}")
    return 0


class _NoProgress:
    def update(self, n):
        pass

    def close(self):
        pass


if __name__ == "__main__":
    sys.exit(main())
