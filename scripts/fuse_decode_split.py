"""Where a decode token's time goes under patch() and patch(fuse=True): the
host time to build the token's graph (the model call), the time of its
mx.eval, and their sum, for variants that take one thing away from fuse at a
time:

  patch()            the plugin's norms, MLX's adds
  fuse               the blocks rewritten (_fuse.py), the fused add_rms_norm
  fuse, composed     the rewritten blocks with the fused op replaced by its
                     composition (MLX's add, then the patched rms_norm)
  fuse, no checks    the rewritten blocks without their per-call checks
                     (_fuse._why_not) and counting
  patch(), class written
                     patch(), with one attribute of the model's block class
                     written before every token: what a switch to or from
                     fuse does to the interpreter (a class's attributes
                     changed), and nothing else

--switch token: the variants decode token by token in turn, each on its own
KV cache, the order rotating every token, so every token follows an
unpatch() and a patch() (the generation benchmark's loop until it changed).
--switch round (default): each variant decodes its tokens in one run, after
one switch and two untimed tokens, the variants' order rotating every round
(what a user runs: patch() once). A row is the median [min-max] over rounds
of each round's median token. A Qwen3-0.6B- or gpt2-medium-shaped model with
random bf16 weights (the generation benchmark's MODELS).

    python3 scripts/fuse_decode_split.py [--model qwen3-0.6b] [--rounds 5] [--tokens 48] [--switch round]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

import mlx_rmsnorm
from mlx_rmsnorm import _ext, _fuse, _patching
from mlx_rmsnorm.bench.generation import build_model

# (the fused ops' compositions: this folder is on sys.path when run as a script)
from checkpoint_memory import composed_add_layer_norm, composed_add_rms_norm  # noqa: E402


SAVED = (_ext.add_rms_norm, _ext.add_layer_norm, _fuse._why_not, _fuse._counts)


class _NoCount(dict):
    def __missing__(self, key):
        return 0

    def __setitem__(self, key, value):
        pass


def use(variant: str) -> None:
    _ext.add_rms_norm, _ext.add_layer_norm, _fuse._why_not, _fuse._counts = SAVED
    mlx_rmsnorm.unpatch()
    mlx_rmsnorm.patch(fuse=not variant.startswith("patch()"))
    if variant == "fuse, composed":
        _ext.add_rms_norm, _ext.add_layer_norm = composed_add_rms_norm, composed_add_layer_norm
    elif variant == "fuse, no checks":
        _fuse._why_not = lambda *a: None
        _fuse._counts = _NoCount()


VARIANTS = ("patch()", "fuse", "fuse, composed", "fuse, no checks", "patch(), class written")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--prompt", type=int, default=2048, help="the generation benchmark's prompt")
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--quick", action="store_true", help="toy model (CPU)")
    p.add_argument("--switch", choices=("token", "round"), default="round",
                   help="switch variants before every token, or once a round")
    a = p.parse_args()
    from mlx_lm.models.cache import make_prompt_cache

    if mx.default_device() == mx.cpu:
        _patching.route_cpu(True)  # there the blocks fuse only when routed (as the tests run them)
    model = build_model(a.model, a.vocab, a.quick)
    prompt = mx.random.randint(0, a.vocab, (1, a.prompt), key=mx.random.key(1))
    k = len(VARIANTS)
    rows = {v: {"build": [], "eval": [], "token": []} for v in VARIANTS}
    for r in range(a.rounds + 1):  # the first round warms up
        state = {}
        for v in VARIANTS:
            use(v)
            cache = make_prompt_cache(model)
            tok = mx.argmax(model(prompt, cache=cache)[:, -1], axis=-1)
            mx.eval(tok)
            state[v] = dict(cache=cache, tok=tok, build=[], eval=[])
        block_cls = type(model.layers[0])

        def token(v: str) -> None:
            st = state[v]
            if v == "patch(), class written":
                block_cls._mlx_rmsnorm_probe = time.perf_counter()  # a class attribute write, nothing else
            t0 = time.perf_counter()
            tok = mx.argmax(model(st["tok"][:, None], cache=st["cache"])[:, -1], axis=-1)
            t1 = time.perf_counter()
            mx.eval(tok)
            t2 = time.perf_counter()
            st["tok"] = tok
            st["build"].append(t1 - t0)
            st["eval"].append(t2 - t1)

        if a.switch == "token":
            for i in range(a.tokens):
                for j in range(k):
                    v = VARIANTS[(r + i + j) % k]
                    use(v)
                    token(v)
        else:
            for j in range(k):
                v = VARIANTS[(r + j) % k]
                use(v)
                for _ in range(2):  # untimed: the interpreter settles after the switch
                    token(v)
                del state[v]["build"][:], state[v]["eval"][:]
                for _ in range(a.tokens):
                    token(v)
        if r:
            for v in VARIANTS:
                st = state[v]
                rows[v]["build"].append(statistics.median(st["build"]))
                rows[v]["eval"].append(statistics.median(st["eval"]))
                rows[v]["token"].append(statistics.median([b + e for b, e in zip(st["build"], st["eval"])]))
    use("patch()")
    mlx_rmsnorm.unpatch()
    if hasattr(type(model.layers[0]), "_mlx_rmsnorm_probe"):
        del type(model.layers[0])._mlx_rmsnorm_probe
    print(f"device {mx.default_device()}, {a.model}{' (toy)' if a.quick else ''}, {a.tokens} tokens "
          f"a round after a {a.prompt}-token prompt, {a.rounds} rounds, variants switched every {a.switch}; "
          "us, median [min-max] over rounds")
    cell = lambda xs: f"{statistics.median(xs) * 1e6:8.1f} [{min(xs) * 1e6:.1f}-{max(xs) * 1e6:.1f}]"
    print(f"{'variant':22} {'build':>24} {'eval':>24} {'token':>24} {'token / patch() token':>22}")
    base = rows["patch()"]["token"]
    for v in VARIANTS:
        ratio = [t / b for t, b in zip(rows[v]["token"], base)]
        print(f"{v:22} {cell(rows[v]['build']):>24} {cell(rows[v]['eval']):>24} {cell(rows[v]['token']):>24} "
              f"{statistics.median(ratio):8.3f} [{min(ratio):.3f}-{max(ratio):.3f}]")


if __name__ == "__main__":
    main()
