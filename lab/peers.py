"""QuACK's RMSNorm and LayerNorm and torch's copy, timed on this GPU at the
long-row shapes of ``bench --large-n``: the peers' figures from the same
machine and run as ours, so that ours / QuACK is a ratio on one GPU.

Needs torch and quack-kernels (with nvidia-cutlass-dsl; docs/NOTES.md, "The
peers on this GPU", says how they get onto the GPU machine):

    python3 -m lab.peers --out peers.json [--shapes 4096x32768,...]
    python -m mlx_rmsnorm.bench --large-n --peers peers.json

or, for a bench --large-n run made before on the same GPU, its lines again
with QuACK's figures and the ratio (no GPU needed):

    python3 -m lab.peers --against bench_bfloat16_large-n.json --out peers.json

or, for Nsight Compute, one contender called three times a shape, untimed:

    ncu -k regex:'(?i)norm' python3 -m lab.peers --profile 'rms_norm fwd' --shapes 1024x131072

Each figure is triton's ``do_bench`` median (CUDA events; --rounds rounds,
interleaved over the contenders, median and [min-max] of the rounds), as
the peers time themselves: QuACK's public calls as a torch user makes them
(``rmsnorm_fwd``; ``rmsnorm_bwd`` with its sum of the gw partials;
``layernorm_fwd`` / ``layernorm_bwd`` with gw and gb; LayerNorm's w and b in
fp32, which QuACK requires), and torch's ``neg(x)`` / ``add(x, g)`` as the
copy of the forward's and the backward's bytes. Each contender runs once
before timing (QuACK compiles its kernels then; those seconds are printed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

# The shapes of mlx_rmsnorm.bench.large_n.SHAPES (not imported: this runs
# under torch, where MLX need not be).
SHAPES = [(8192, 16384), (4096, 24576), (4096, 32768), (2048, 65536), (1024, 131072), (512, 262144)]
EPS = 1e-6
# The figures of a shape, by name: (op, direction) of the bench's rows, and the copies.
NAMES = ("copy fwd", "copy bwd", "rms_norm fwd", "rms_norm bwd", "layer_norm fwd", "layer_norm bwd")


def contenders(m, n, dtype):
    """{name: fn()} at one shape, on fresh inputs."""
    import torch
    from quack.rmsnorm import layernorm_bwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fwd

    gen = torch.Generator(device="cuda").manual_seed(m * 131 + n)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)
    g = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)
    w = (1 + 0.1 * torch.randn(n, device="cuda", generator=gen)).to(dtype)
    w32, b32 = w.float(), 0.1 * (w.float() - 1)
    _, _, rstd = rmsnorm_fwd(x, w, eps=EPS, store_rstd=True)
    _, ln_rstd, ln_mean = layernorm_fwd(x, w32, b32, eps=EPS, return_rstd=True, return_mean=True)
    return {
        "copy fwd": lambda: torch.neg(x),
        "copy bwd": lambda: torch.add(x, g),
        "rms_norm fwd": lambda: rmsnorm_fwd(x, w, eps=EPS),
        "rms_norm bwd": lambda: rmsnorm_bwd(x, w, g, rstd),
        "layer_norm fwd": lambda: layernorm_fwd(x, w32, b32, eps=EPS),
        "layer_norm bwd": lambda: layernorm_bwd(x, w32, g, ln_rstd, ln_mean, has_bias=True),
    }


def check(m, n, dtype):
    """QuACK's rms_norm and layer_norm forward against torch's at a small
    shape of the same N: a figure of a kernel that computes something else
    would mean nothing."""
    import torch
    from quack.rmsnorm import layernorm_fwd, rmsnorm_fwd

    x = torch.randn(4, n, device="cuda", dtype=dtype)
    w = (1 + 0.1 * torch.randn(n, device="cuda")).to(dtype)
    y = rmsnorm_fwd(x, w, eps=EPS)[0].float()
    xf = x.float()
    ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()
    ln = layernorm_fwd(x, w.float(), None, eps=EPS).float()
    ln_ref = torch.nn.functional.layer_norm(xf, (n,), w.float(), None, EPS)
    for name, got, want in (("rms_norm", y, ref), ("layer_norm", ln, ln_ref)):
        err = (got - want).abs().max().item()
        if not err < 0.1:
            raise SystemExit(f"QuACK's {name} at N = {n} differs from torch's by {err}")


def run_shape(m, n, dtype, rounds):
    """{name: [us of each round]} at one shape."""
    import torch
    from triton.testing import do_bench

    fns = contenders(m, n, dtype)
    for name, fn in fns.items():  # QuACK compiles here
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        took = time.perf_counter() - t0
        if took > 1:
            print(f"  {m}x{n} {name}: first call {took:.1f} s", flush=True)
    us = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            us[name].append(1e3 * do_bench(fn, warmup=10, rep=60, return_mode="median"))
    del fns
    torch.cuda.empty_cache()
    return us


def against(bench_json, peers_json):
    """bench --large-n's lines of a run (its JSON) with QuACK's figures of
    the same GPU (lab.peers' JSON) and ours / QuACK; an error where the two
    files are of different GPUs."""
    import mlx.core as mx

    from mlx_rmsnorm.bench import large_n

    with open(bench_json) as fh:
        data = json.load(fh)
    peers = large_n.peers_here(peers_json, data["device"])
    if peers is None:
        raise SystemExit(f"{peers_json} is not of {bench_json}'s GPU ({data['device']})")
    print(f"{bench_json} ({data['device']}, chain {data.get('chain')}) against QuACK of {peers_json}")
    for r in data["rows"]:
        r.update(large_n.quack_of((r["M"], r["N"]), r["op"], r["direction"], getattr(mx, r["dtype"]),
                                  peers))
        print(large_n.format_row(r))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="peers.json", help="the figures as JSON, for bench --peers")
    p.add_argument("--against", metavar="BENCH_JSON", default=None,
                   help="time nothing: print this bench --large-n run's lines with --out's figures")
    p.add_argument("--shapes", default="", help="MxN,... (default: bench --large-n's)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of do_bench a figure")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--profile", metavar="NAME", default=None,
                   help="time nothing: call NAME (e.g. 'rms_norm fwd') three times a shape, "
                        "for Nsight Compute (the set-up launches QuACK's forwards once first)")
    args = p.parse_args(argv)
    if args.against:
        return against(args.against, args.out)
    if args.profile is not None and args.profile not in NAMES:
        raise SystemExit(f"--profile: one of {', '.join(repr(n) for n in NAMES)}")

    import quack
    import torch

    dtype = getattr(torch, args.dtype)
    shapes = ([tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
              if args.shapes else SHAPES)
    if args.profile is not None:  # (before the timing run's header: nothing is timed)
        for m, n in shapes:
            fn = contenders(m, n, dtype)[args.profile]
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
        return 0
    gpu = torch.cuda.get_device_name()
    print(f"device: {gpu}, torch {torch.__version__}, quack {getattr(quack, '__version__', '?')}, "
          f"dtype {args.dtype}, {len(shapes)} shapes, {args.rounds} rounds of do_bench (median)",
          flush=True)
    figures = {}
    for m, n in shapes:
        check(m, n, dtype)
        us = run_shape(m, n, dtype, args.rounds)
        figures[f"{m}x{n}"] = {name: dict(us=statistics.median(v), us_min=min(v), us_max=max(v))
                               for name, v in us.items()}
        for name in NAMES:
            f = figures[f"{m}x{n}"][name]
            print(f"{m:>6}x{n:<7} {name:<15} {f['us']:8.1f} us [{f['us_min']:.1f}-{f['us_max']:.1f}]",
                  flush=True)
    with open(args.out, "w") as fh:
        json.dump(dict(gpu=gpu, torch=torch.__version__, quack=getattr(quack, "__version__", None),
                       dtype=args.dtype, rounds=args.rounds, figures=figures), fh, indent=1)
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
