"""Host cost: the time outside the kernels, where a decode token (host-bound)
spends what the plugin adds. Four measurements, one a subcommand:

  calls   per call, tiny tensors (GPU work negligible), many calls per
          mx.eval: the time to build the lazy graph and the time of its
          mx.eval, in us per call, per shape and contender (the norms, their
          backward, MLX's x + g, a block's add + norm unfused and fused)
  step    a decode step's graph through a Qwen3-shaped model (28 blocks,
          small widths): the time to build one token's graph, the steps
          built back to back and evaluated together after the timer;
          --profile adds cProfile's Python calls per block call and the time
          of the fused block's checks (_fuse._why_not)
  block   one rewritten block against mlx-lm's original, attention and MLP
          replaced by identities: what is left is the norms, the adds and
          the rewrite's own Python (its checks, its counting, the fused op's
          call), block by block what patch(fuse=True) adds to a token's
          build; --decode keeps the row limit (_fuse.min_rows()), so at the
          block's one row it runs the original behind its row test
  decode  where a decode token's time goes: its build (the model call), its
          mx.eval and their sum, per variant (below), the variants taking
          turns every token (--switch token, the generation benchmark's
          loop) or a run each a round (--switch round); --batch B decodes B
          sequences at once

The variants (step and decode; --variants, a ;-separated list):

  built-in            MLX's norms (unpatched)
  patch()             the plugin's norms, MLX's adds
  fuse                patch(fuse=True) as it ships: blocks of fewer than
                      _fuse.min_rows() rows (a decode step) run their own code
  fuse, op at decode  the rewritten blocks at every row count (min rows 0),
                      the fused add_rms_norm / add_layer_norm
  fuse, composed      the same with the fused op replaced by its composition
                      (MLX's add, then the patched norm)

Contenders and variants interleave (rounds, or a random order for block);
medians per round, median [min-max] over rounds. On a CPU device the plugin
is routed there (mlx_rmsnorm.route_cpu(True)), as the tests route it, so
that the plugin's ops and the fused blocks run.

    python -m lab.host_cost calls [--shapes 8x1024,1x1x16x128] [--calls 50] [--repeats 10]
    python -m lab.host_cost step [--rounds 7] [--steps 100] [--profile]
    python -m lab.host_cost block [--model qwen3-0.6b|llama-3-8b|gpt2-medium] [--rounds 80] [--decode]
    python -m lab.host_cost decode [--model qwen3-0.6b] [--rounds 5] [--tokens 48] [--switch token]
        [--batch 1] [--variants "patch();fuse"] [--prompt 2048] [--quick]

The GPU machine's step host runs calls and step (scripts/gpu_run.sh), step
minsize runs calls against a -Os build (by path, from /tmp: this module
imports nothing of the repository but mlx_rmsnorm).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import timeit

import mlx.core as mx

import mlx_rmsnorm
from mlx_rmsnorm import _ext, _fuse

EPS = 1e-5


# --- the variants ----------------------------------------------------------------------


def composed_add_rms_norm(x, r, w, eps, *args, **kwargs):
    """add_rms_norm as MLX's add, then the (patched) norm."""
    h = x + r
    return mx.fast.rms_norm(h, w, eps), h


def composed_add_layer_norm(x, r, w, b, eps):
    h = x + r
    return mx.fast.layer_norm(h, w, b, eps), h


# name -> (patch: None unpatched, else its fuse argument; min rows: None as
# shipped, else the value; the fused ops composed)
VARIANTS = {
    "built-in": (None, None, False),
    "patch()": (False, None, False),
    "fuse": (True, None, False),
    "fuse, op at decode": (True, 0, False),
    "fuse, composed": (True, 0, True),
}
_SHIPPED = (_ext.add_rms_norm, _ext.add_layer_norm, _fuse.min_rows())


def use(variant: str) -> None:
    """Set `variant` up (after undoing the last one)."""
    fuse, rows, composed = VARIANTS[variant]
    _ext.add_rms_norm, _ext.add_layer_norm = _SHIPPED[:2]
    _fuse.set_min_rows(_SHIPPED[2] if rows is None else rows)
    mlx_rmsnorm.unpatch()
    if fuse is not None:
        mlx_rmsnorm.patch(fuse=fuse)
    if composed:
        _ext.add_rms_norm, _ext.add_layer_norm = composed_add_rms_norm, composed_add_layer_norm


def fuses(variant: str) -> bool:
    """Whether a block of one row runs fused under `variant`."""
    fuse, rows, _ = VARIANTS[variant]
    return bool(fuse) and rows == 0


def parse_variants(text: str, first: str = "") -> list[str]:
    variants = [v.strip() for v in text.split(";") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants or (first and variants[0] != first):
        raise SystemExit(f"--variants: a ;-separated list of {'; '.join(VARIANTS)}"
                         + (f", {first} first" if first else ""))
    return variants


def route_to_cpu() -> None:
    """On a CPU device the plugin runs only when routed (as the tests run it)."""
    if mx.default_device() == mx.cpu:
        mlx_rmsnorm.route_cpu(True)


def cell(xs: list[float], scale: float = 1.0) -> str:
    return f"{statistics.median(xs) * scale:8.1f} [{min(xs) * scale:.1f}-{max(xs) * scale:.1f}]"


# --- calls: per call ----------------------------------------------------------------------


def calls(a: argparse.Namespace) -> int:
    def vjp(norm, with_w, x, w, g):
        if with_w:
            return lambda: mx.vjp(lambda x, w: norm(x, w, EPS), [x, w], [g])[1]
        return lambda: mx.vjp(lambda x: norm(x, w, EPS), [x], [g])[1]

    for text in a.shapes.split(","):
        shape = tuple(int(v) for v in text.split("x"))
        n = shape[-1]
        x = mx.random.normal(shape).astype(mx.bfloat16)
        g = mx.random.normal(shape).astype(mx.bfloat16)
        w = mx.ones((n,), mx.bfloat16)
        mx.eval(x, g, w)
        cases = {
            "fwd builtin": lambda: mx.fast.rms_norm(x, w, EPS),
            "fwd ours": lambda: mlx_rmsnorm.rms_norm(x, w, EPS),
            "bwd builtin": vjp(mx.fast.rms_norm, True, x, w, g),
            "bwd ours": vjp(mlx_rmsnorm.rms_norm, True, x, w, g),
            "gx-only builtin": vjp(mx.fast.rms_norm, False, x, w, g),
            "gx-only ours": vjp(mlx_rmsnorm.rms_norm, False, x, w, g),
            "rms_norm_vjp direct": lambda: mlx_rmsnorm.rms_norm_vjp(x, w, g, EPS),
            "x + g": lambda: x + g,
            # a decoder block's residual add + norm, unfused (patch()) and fused
            "add+norm ours": lambda: (lambda h: [mlx_rmsnorm.rms_norm(h, w, EPS), h])(x + g),
            "fused add ours": lambda: list(mlx_rmsnorm.add_rms_norm(x, g, w, EPS)),
        }
        res = {k: ([], []) for k in cases}
        for rep in range(a.repeats + 2):
            for name, fn in cases.items():  # interleaved
                t0 = time.perf_counter()
                outs = [fn() for _ in range(a.calls)]
                t1 = time.perf_counter()
                mx.eval(outs)
                t2 = time.perf_counter()
                if rep >= 2:
                    res[name][0].append((t1 - t0) / a.calls * 1e6)
                    res[name][1].append((t2 - t1) / a.calls * 1e6)
        print(f"{text} bf16, {a.calls} calls per eval, us per call: median [min-max] of {a.repeats}")
        print(f"{'case':22} {'build':>22} {'eval':>22}")
        for name, (b, e) in res.items():
            f = lambda v: f"{statistics.median(v):6.2f} [{min(v):5.2f}-{max(v):5.2f}]"  # noqa: E731
            print(f"{name:22} {f(b):>22} {f(e):>22}")
    return 0


# --- step: a decode step's graph ------------------------------------------------------------


def step(a: argparse.Namespace) -> int:
    from mlx_lm.models import qwen3
    from mlx_lm.models.cache import make_prompt_cache

    variants = parse_variants(a.variants)
    model = qwen3.Model(qwen3.ModelArgs(
        model_type="qwen3", hidden_size=256, num_hidden_layers=28, intermediate_size=512,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6, vocab_size=1024,
        max_position_embeddings=4096, rope_theta=1e6, tie_word_embeddings=True))
    mx.eval(model.parameters())
    route_to_cpu()

    def build_us():
        # steps built back to back, evaluated together afterwards: no eval runs
        # beside the timer (on the CPU it would share the cores)
        cache = make_prompt_cache(model)
        mx.eval(model(mx.array([[1, 2, 3, 4]]), cache=cache))
        token, times, outs = mx.array([[5]]), [], []
        for _ in range(a.steps):
            t = time.perf_counter()
            outs.append(model(token, cache=cache))
            times.append(time.perf_counter() - t)
        mx.eval(outs)
        return statistics.median(times) * 1e6

    results = {v: [] for v in variants}
    for _ in range(a.rounds):
        for v in variants:
            use(v)
            _fuse.reset_counts()
            results[v].append(build_us())
            assert (_fuse.counts()["fused"] > 0) == fuses(v), (v, _fuse.counts())
    use("built-in")
    print(f"device {mx.default_device()}, 28 Qwen3 blocks, one token a step, {a.steps} steps a round, "
          f"{a.rounds} rounds; us to build one step's graph, median [min-max] over rounds")
    for v, xs in results.items():
        print(f"  {v:18s} {cell(xs)}")

    if a.profile:
        import cProfile
        import pstats

        block, x = model.layers[0], mx.random.normal((1, 1, 256))
        for v in variants:
            if VARIANTS[v][0] is None:
                continue
            use(v)
            for _ in range(50):
                block(x)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(1000):
                block(x)
            prof.disable()
            stats = pstats.Stats(prof)
            checks = sum(s[3] for k, s in stats.stats.items() if k[2] == "_why_not")
            print(f"  {v:18s} {stats.total_calls / 1000:.0f} Python calls a block call, "
                  f"{stats.total_tt / 1000 * 1e6:.1f} us under cProfile, of which the fused "
                  f"block's checks {checks / 1000 * 1e6:.2f} us")
        use("built-in")
    return 0


# --- block: one rewritten block -------------------------------------------------------------


def block(a: argparse.Namespace) -> int:
    import mlx.nn as nn

    from mlx_rmsnorm.bench.generation import build_model

    class Identity(nn.Module):
        def __call__(self, x, *args, **kwargs):
            return x

    mlx_rmsnorm.route_cpu(True)
    # the fused path at the block's one row (else it runs the original)
    use("fuse" if a.decode else "fuse, op at decode")
    blk = build_model(a.model, 256, quick=True).layers[0]
    for name in ("self_attn", "attn", "mlp"):
        if name in blk:
            setattr(blk, name, Identity())
    x = mx.ones((1, 1, 64), mx.bfloat16)
    mx.eval(x)
    rewrite = type(blk).__call__
    variants = {"original": rewrite.__wrapped__, "rewrite": rewrite}
    _fuse.reset_counts()
    rewrite(blk, x)
    path = "fallback:few rows (decode)" if a.decode else "fused"
    assert _fuse.counts() == {path: 1}, _fuse.counts()  # the path that is timed
    us: dict[str, list[float]] = {v: [] for v in variants}
    order = list(variants)
    for _ in range(a.rounds):
        random.shuffle(order)
        for v in order:
            fn = variants[v]
            t = min(timeit.repeat(lambda: fn(blk, x), number=a.number, repeat=2))
            us[v].append(t / a.number * 1e6)
    use("built-in")
    print(f"{a.model} block{' (decode path)' if a.decode else ''}, attention and MLP identity, "
          f"{a.rounds} interleaved timings of {a.number} calls; us a call")
    for v, xs in us.items():
        print(f"{v:9} best {min(xs):6.2f}  median {statistics.median(xs):6.2f}")
    return 0


# --- decode: a token's build and eval by variant ----------------------------------------------


def decode(a: argparse.Namespace) -> int:
    from mlx_lm.models.cache import make_prompt_cache

    from mlx_rmsnorm.bench.generation import build_model, turns

    variants = parse_variants(a.variants, first="patch()")
    route_to_cpu()
    model = build_model(a.model, a.vocab, a.quick)
    prompt = mx.random.randint(0, a.vocab, (a.batch, a.prompt), key=mx.random.key(1))
    rows = {v: {"build": [], "eval": [], "token": []} for v in variants}
    for r in range(a.rounds + 1):  # the first round warms up
        state = {}
        for v in variants:
            use(v)
            cache = make_prompt_cache(model)
            tok = mx.argmax(model(prompt, cache=cache)[:, -1], axis=-1)
            mx.eval(tok)
            state[v] = dict(cache=cache, tok=tok, build=[], eval=[])

        def token(v: str, timed: bool) -> None:
            st = state[v]
            t0 = time.perf_counter()
            tok = mx.argmax(model(st["tok"][:, None], cache=st["cache"])[:, -1], axis=-1)
            t1 = time.perf_counter()
            mx.eval(tok)
            t2 = time.perf_counter()
            st["tok"] = tok
            if timed:
                st["build"].append(t1 - t0)
                st["eval"].append(t2 - t1)

        for v, switch_first, timed in turns(variants, r, a.tokens, a.switch):
            if switch_first:
                use(v)
            token(v, timed)
        if r:
            for v in variants:
                st = state[v]
                rows[v]["build"].append(statistics.median(st["build"]))
                rows[v]["eval"].append(statistics.median(st["eval"]))
                rows[v]["token"].append(statistics.median([b + e for b, e in zip(st["build"], st["eval"])]))
    use("built-in")
    print(f"device {mx.default_device()}, {a.model}{' (toy)' if a.quick else ''}, {a.tokens} tokens "
          f"(batch {a.batch}) a round after a {a.prompt}-token prompt, {a.rounds} rounds, variants switched "
          f"every {a.switch}; us, median [min-max] over rounds")
    print(f"{'variant':22} {'build':>24} {'eval':>24} {'token':>24} {'token / patch() token':>22}")
    base = rows["patch()"]["token"]
    for v in variants:
        ratio = [t / b for t, b in zip(rows[v]["token"], base)]
        print(f"{v:22} {cell(rows[v]['build'], 1e6):>24} {cell(rows[v]['eval'], 1e6):>24} "
              f"{cell(rows[v]['token'], 1e6):>24} "
              f"{statistics.median(ratio):8.3f} [{min(ratio):.3f}-{max(ratio):.3f}]")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.host_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("calls", help="per call: build and eval of many calls per eval")
    c.add_argument("--shapes", default="8x1024", help="comma list of shapes, dims joined by x")
    c.add_argument("--calls", type=int, default=50)
    c.add_argument("--repeats", type=int, default=10)
    s = sub.add_parser("step", help="a decode step's graph through 28 Qwen3 blocks")
    s.add_argument("--rounds", type=int, default=7)
    s.add_argument("--steps", type=int, default=100)
    s.add_argument("--variants", default="built-in;patch();fuse, op at decode", help="a ;-separated list")
    s.add_argument("--profile", action="store_true")
    b = sub.add_parser("block", help="one rewritten block against the original")
    b.add_argument("--model", default="qwen3-0.6b", help="the generation benchmark's MODELS")
    b.add_argument("--rounds", type=int, default=80)
    b.add_argument("--number", type=int, default=1000, help="calls a timing")
    b.add_argument("--decode", action="store_true", help="keep the row limit: the decode path")
    d = sub.add_parser("decode", help="a decode token's build and eval by variant")
    d.add_argument("--model", default="qwen3-0.6b")
    d.add_argument("--rounds", type=int, default=5)
    d.add_argument("--tokens", type=int, default=48)
    d.add_argument("--prompt", type=int, default=2048, help="the generation benchmark's prompt")
    d.add_argument("--vocab", type=int, default=32768)
    d.add_argument("--quick", action="store_true", help="toy model (CPU)")
    d.add_argument("--switch", choices=("token", "round"), default="token",
                   help="switch variants before every token, or once a round")
    d.add_argument("--batch", type=int, default=1, help="sequences decoded at once")
    d.add_argument("--variants", default="patch();fuse;fuse, op at decode;fuse, composed",
                   help="a ;-separated list, patch() first")
    a = p.parse_args(argv)
    return {"calls": calls, "step": step, "block": block, "decode": decode}[a.what](a)


if __name__ == "__main__":
    sys.exit(main())
