"""Host cost of a decode step's graph under the built-in, patch() and
patch(fuse=True): the time to build the lazy graph of one token through a
Qwen3-shaped model (28 blocks, small widths), the steps built back to back
and evaluated together after the timer.
Variants interleaved, median per round, median [min-max] over rounds.

    python3 scripts/fuse_host_cost.py [--rounds 7] [--steps 100] [--profile]
--profile adds cProfile's count of Python calls per block call and the time
of the fused block's own checks (_fuse._why_not), per variant. (The fused
op alone against MLX's add + our rms_norm, to build and to evaluate:
scripts/host_overhead.py, rows "add+norm ours" and "fused add ours".)
By hand, on the GPU machine or a CPU one (on the CPU the plugin is routed
there, as the tests do, so that the fused blocks run).
"""

import argparse
import statistics
import time

import mlx.core as mx
from mlx_lm.models import qwen3
from mlx_lm.models.cache import make_prompt_cache

import mlx_rmsnorm
from mlx_rmsnorm import _fuse, _patching

p = argparse.ArgumentParser()
p.add_argument("--rounds", type=int, default=7)
p.add_argument("--steps", type=int, default=100)
p.add_argument("--profile", action="store_true")
args = p.parse_args()

model = qwen3.Model(qwen3.ModelArgs(
    model_type="qwen3", hidden_size=256, num_hidden_layers=28, intermediate_size=512,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6, vocab_size=1024,
    max_position_embeddings=4096, rope_theta=1e6, tie_word_embeddings=True))
mx.eval(model.parameters())
if mx.default_device() == mx.cpu:
    _patching.route_cpu(True)
_fuse.MIN_ROWS = 0  # the fused blocks at a decode step's one row (as shipped they run their own code)
VARIANTS = {"built-in": None, "patch()": False, "patch(fuse=True)": True}


def build_us():
    # steps built back to back, evaluated together afterwards: no eval runs
    # beside the timer (on the CPU it would share the cores)
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([[1, 2, 3, 4]]), cache=cache))
    token, times, outs = mx.array([[5]]), [], []
    for _ in range(args.steps):
        t = time.perf_counter()
        outs.append(model(token, cache=cache))
        times.append(time.perf_counter() - t)
    mx.eval(outs)
    return statistics.median(times) * 1e6


results = {v: [] for v in VARIANTS}
for _ in range(args.rounds):
    for name, fuse in VARIANTS.items():
        mlx_rmsnorm.unpatch()
        if fuse is not None:
            mlx_rmsnorm.patch(fuse=fuse)
        _fuse.reset_counts()
        results[name].append(build_us())
        assert (_fuse.counts()["fused"] > 0) == bool(fuse), (name, _fuse.counts())
mlx_rmsnorm.unpatch()
print(f"device {mx.default_device()}, 28 Qwen3 blocks, one token a step, {args.steps} steps a round, "
      f"{args.rounds} rounds; us to build one step's graph, median [min-max] over rounds")
for name, xs in results.items():
    print(f"  {name:18s} {statistics.median(xs):8.1f} [{min(xs):.1f}-{max(xs):.1f}]")

if args.profile:
    import cProfile
    import pstats

    block, x = model.layers[0], mx.random.normal((1, 1, 256))
    for name, fuse in list(VARIANTS.items())[1:]:
        mlx_rmsnorm.unpatch()
        mlx_rmsnorm.patch(fuse=fuse)
        for _ in range(50):
            block(x)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(1000):
            block(x)
        prof.disable()
        stats = pstats.Stats(prof)
        checks = sum(v[3] for k, v in stats.stats.items() if k[2] == "_why_not")
        print(f"  {name:18s} {stats.total_calls / 1000:.0f} Python calls a block call, "
              f"{stats.total_tt / 1000 * 1e6:.1f} us under cProfile, of which the fused "
              f"block's checks {checks / 1000 * 1e6:.2f} us")
    mlx_rmsnorm.unpatch()
