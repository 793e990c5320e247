"""Where a decode token's time goes under patch() and patch(fuse=True): the
host time to build the token's graph (the model call), the time of its
mx.eval, and their sum, for variants that take one thing away from fuse at a
time:

  patch()            the plugin's norms, MLX's adds
  fuse               patch(fuse=True) as it ships: blocks of fewer than
                     _fuse.MIN_ROWS rows (a decode step) run their own code
  fuse, op at decode the rewritten blocks at every row count (MIN_ROWS 0),
                     the fused add_rms_norm
  fuse, composed     the same with the fused op replaced by its composition
                     (MLX's add, then the patched rms_norm)
  fuse, no checks    the same without the per-call checks (_fuse._why_not)
                     and counting

--switch token (default): the variants decode token by token in turn, each on
its own KV cache, the order rotating every token, so every token follows an
unpatch() and a patch() (the generation benchmark's loop). --switch round:
each variant decodes its tokens in one run, after one switch and two untimed
tokens, the variants' order rotating every round (what a user runs: patch()
once); the order is the generation benchmark's (generation.turns). --batch B
decodes B sequences at once (B rows a block). A row is the median [min-max]
over rounds of each round's median token. A Qwen3-0.6B- or gpt2-medium-shaped
model with random bf16 weights (the generation benchmark's MODELS).

    python3 scripts/fuse_decode_split.py [--model qwen3-0.6b] [--rounds 5] [--tokens 48] [--switch token]
        [--batch 1] [--variants "patch();fuse"]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

import mlx_rmsnorm
from mlx_rmsnorm import _ext, _fuse, _patching
from mlx_rmsnorm.bench.generation import build_model, turns

# (the fused ops' compositions: this folder is on sys.path when run as a script)
from checkpoint_memory import composed_add_layer_norm, composed_add_rms_norm  # noqa: E402


SAVED = (_ext.add_rms_norm, _ext.add_layer_norm, _fuse._why_not, _fuse._counts, _fuse.MIN_ROWS)


class _NoCount(dict):
    def __missing__(self, key):
        return 0

    def __setitem__(self, key, value):
        pass


def use(variant: str) -> None:
    _ext.add_rms_norm, _ext.add_layer_norm, _fuse._why_not, _fuse._counts, _fuse.MIN_ROWS = SAVED
    mlx_rmsnorm.unpatch()
    mlx_rmsnorm.patch(fuse=variant != "patch()")
    if variant not in ("patch()", "fuse"):
        _fuse.MIN_ROWS = 0
    if variant == "fuse, composed":
        _ext.add_rms_norm, _ext.add_layer_norm = composed_add_rms_norm, composed_add_layer_norm
    elif variant == "fuse, no checks":
        _fuse._why_not = lambda *a: None
        _fuse._counts = _NoCount()


VARIANTS = ("patch()", "fuse", "fuse, op at decode", "fuse, composed", "fuse, no checks")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--prompt", type=int, default=2048, help="the generation benchmark's prompt")
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--quick", action="store_true", help="toy model (CPU)")
    p.add_argument("--switch", choices=("token", "round"), default="token",
                   help="switch variants before every token, or once a round")
    p.add_argument("--batch", type=int, default=1, help="sequences decoded at once")
    p.add_argument("--variants", default=";".join(VARIANTS), help="a ;-separated list, patch() first")
    a = p.parse_args()
    variants = [v.strip() for v in a.variants.split(";")]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or variants[0] != "patch()":
        raise SystemExit(f"--variants: a ;-separated list of {VARIANTS}, patch() first")
    from mlx_lm.models.cache import make_prompt_cache

    if mx.default_device() == mx.cpu:
        _patching.route_cpu(True)  # there the blocks fuse only when routed (as the tests run them)
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
    use("patch()")
    mlx_rmsnorm.unpatch()
    print(f"device {mx.default_device()}, {a.model}{' (toy)' if a.quick else ''}, {a.tokens} tokens "
          f"(batch {a.batch}) a round after a {a.prompt}-token prompt, {a.rounds} rounds, variants switched every {a.switch}; "
          "us, median [min-max] over rounds")
    cell = lambda xs: f"{statistics.median(xs) * 1e6:8.1f} [{min(xs) * 1e6:.1f}-{max(xs) * 1e6:.1f}]"
    print(f"{'variant':22} {'build':>24} {'eval':>24} {'token':>24} {'token / patch() token':>22}")
    base = rows["patch()"]["token"]
    for v in variants:
        ratio = [t / b for t, b in zip(rows[v]["token"], base)]
        print(f"{v:22} {cell(rows[v]['build']):>24} {cell(rows[v]['eval']):>24} {cell(rows[v]['token']):>24} "
              f"{statistics.median(ratio):8.3f} [{min(ratio):.3f}-{max(ratio):.3f}]")


if __name__ == "__main__":
    main()
