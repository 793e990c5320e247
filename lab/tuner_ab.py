"""A kernel change against a base revision, each tuner alone, in one device call.

The tuners (cuda/cli/tune_*.cu: every candidate plan row of a row length
timed by CUDA events, beside the copy ceiling) are built here, on the CPU
machine, twice: from the working tree ("new") and from BASE's cuda/ ("base",
`git archive`). Each binary carries its own launch.cu and bandwidth.cu and
is gzipped (about 0.8 MB), so both sides travel with .device and the
prebuilt extension within the device tool's carry limit:

    python -m lab.tuner_ab pack BASE [--tuners tune_backward,tune_forward] [--out results/tuner-ab]

On the GPU machine (`bash scripts/gpu_run.sh tune-ab`, carrying
results/tuner-ab) each tuner runs per row length, base and new
interleaved (base new, then new base, ...), and the table gives per shape
and candidate the median us of each side and new / base:

    python -m lab.tuner_ab run [--dir results/tuner-ab] [--n 32768,131072,262144] [--rounds 2] [--iters 20]

Each tuner checks its candidates against the first of its own build; a
"DIFFER" there, or a tuner that fails or times out, fails the run (a side
that failed once is not run again: a hang costs one timeout, not one per
row length and round). Their values against each other are the GPU tests'
business.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIDES = ("base", "new")
ARCH = "90"  # the tuners are Hopper tools (clusters, TMA), as CI builds them


def _nvcc_command(nvcc: str, cuda: Path, tuner: str, out: Path) -> list[str]:
    """One nvcc call: the tuner and the two sources of the kernels library
    it calls (the planner's launch, the copy ceiling), from one tree."""
    return [nvcc, "-std=c++17", "-O3", f"-I{cuda}", f"-I{cuda / 'cli'}", "--expt-relaxed-constexpr",
            f"-gencode=arch=compute_{ARCH},code=sm_{ARCH}", "-o", str(out),
            str(cuda / "cli" / f"{tuner}.cu"), str(cuda / "launch.cu"), str(cuda / "bandwidth.cu")]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def pack(base: str, tuners: list[str], out: Path, nvcc: str = "nvcc", jobs: int = 2) -> dict:
    """Builds every tuner for both sides into out (gzipped) and writes
    out/manifest.json; returns the manifest."""
    base_commit = _git("rev-parse", "--verify", f"{base}^{{commit}}")
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"base": Path(tmp) / "base", "new": ROOT}
        trees["base"].mkdir()
        archive = subprocess.run(["git", "archive", base_commit, "cuda"], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(trees["base"], filter="data")
        for tuner in tuners:
            for side, tree in trees.items():
                if not (tree / "cuda" / "cli" / f"{tuner}.cu").is_file():
                    raise SystemExit(f"lab.tuner_ab: no cuda/cli/{tuner}.cu in the {side} tree")
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        builds = [(tuner, side) for tuner in tuners for side in SIDES]

        def build(item):
            tuner, side = item
            binary = Path(tmp) / f"{side}_{tuner}"
            cmd = _nvcc_command(nvcc, trees[side] / "cuda", tuner, binary)
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"lab.tuner_ab: {side} {tuner} did not build:\n{done.stderr[-2000:]}")
            with open(binary, "rb") as src, gzip.open(out / f"{side}_{tuner}.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            print(f"built {side} {tuner}", flush=True)

        with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
            list(pool.map(build, builds))
    manifest = {
        "base": {"rev": base, "commit": base_commit},
        "new": {"commit": _git("rev-parse", "HEAD"),
                "dirty": bool(_git("status", "--porcelain", "--", "cuda"))},
        "tuners": tuners,
        "arch": f"sm_{ARCH}",
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


# A tuner's table: a shape line ("MxN  copy ceiling (...)  us ..."), then one
# line per candidate ("  {block,group,...}  grid [units]  us  GB/s  %  check").
_SHAPE = re.compile(r"^(\d+x\d+)\s+(copy ceiling \([^)]*\))\s+(.*)$")
_CANDIDATE = re.compile(r"^\s+(\{[^}]*\})\s+(.*)$")


def _first_decimal(fields: str) -> float | None:
    """The us column: the first field with a decimal point (grid and units
    are integers, us is printed %.1f)."""
    for token in fields.split():
        if "." in token:
            try:
                return float(token)
            except ValueError:
                return None
    return None


def parse(text: str) -> list[dict]:
    """[{shape, candidate, us, differ}] of one tuner's output; a candidate
    that does not fit has no row."""
    rows, shape = [], None
    for line in text.splitlines():
        if m := _SHAPE.match(line):
            shape = m.group(1)
            rows.append({"shape": shape, "candidate": m.group(2), "us": _first_decimal(m.group(3)),
                         "differ": False})
        elif (m := _CANDIDATE.match(line)) and shape and "does not fit" not in line:
            us = _first_decimal(m.group(2))
            if us is not None:
                rows.append({"shape": shape, "candidate": m.group(1), "us": us, "differ": "DIFFER" in line})
    return rows


def summarize(results: dict) -> tuple[list[str], bool]:
    """results: {(tuner, side): [rows of every run]} -> the table's lines
    and whether every check held."""
    ok = True
    lines = [f"{'tuner':<14} {'shape':<12} {'candidate':<40} {'base us':>9} {'new us':>9} {'new/base':>8}"]
    for tuner in dict.fromkeys(t for t, _ in results):  # in the order they ran
        keys = []  # (shape, candidate) in the tuner's order
        samples: dict = {}
        for side in SIDES:
            for row in results.get((tuner, side), []):
                key = (row["shape"], row["candidate"])
                if key not in samples:
                    keys.append(key)
                    samples[key] = {s: [] for s in SIDES}
                samples[key][side].append(row["us"])
                ok &= not row["differ"]
        for shape, candidate in keys:
            med = {s: statistics.median(v) if v else None for s, v in samples[(shape, candidate)].items()}
            b, n = med["base"], med["new"]
            ratio = f"{n / b:8.3f}" if b and n else f"{'-':>8}"
            fmt = lambda v: f"{v:9.1f}" if v is not None else f"{'-':>9}"  # noqa: E731
            lines.append(f"{tuner:<14} {shape:<12} {candidate:<40} {fmt(b)} {fmt(n)} {ratio}")
    return lines, ok


def run(directory: Path, n_list: list[int], rounds: int, iters: int, timeout: int, log: Path | None) -> int:
    manifest = json.loads((directory / "manifest.json").read_text())
    bins = Path(tempfile.mkdtemp(prefix="tuner-ab-"))
    for side in SIDES:
        for tuner in manifest["tuners"]:
            path = bins / f"{side}_{tuner}"
            with gzip.open(directory / f"{side}_{tuner}.gz", "rb") as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
            path.chmod(0o755)
    print(f"base {manifest['base']['rev']} ({manifest['base']['commit'][:10]}) against new "
          f"{manifest['new']['commit'][:10]}{' (cuda/ edited)' if manifest['new']['dirty'] else ''}, "
          f"{manifest['arch']}, {rounds} round(s) of {iters} iterations", flush=True)
    results: dict = {}
    failed = []
    broken = set()  # (tuner, side) that failed once: not run again
    out = open(log, "w") if log else None
    try:
        for tuner in manifest["tuners"]:
            for n in n_list:
                for r in range(rounds):
                    for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                        if (tuner, side) in broken:
                            continue  # (its later runs would fail alike, a hang costing a timeout each)
                        try:
                            done = subprocess.run([str(bins / f"{side}_{tuner}"), str(iters), str(n)],
                                                  capture_output=True, text=True, timeout=timeout)
                            text, rc = done.stdout + done.stderr, done.returncode
                        except subprocess.TimeoutExpired as e:
                            text, rc = (e.stdout or b"").decode(errors="replace"), "timeout"
                        if out:
                            out.write(f"== {tuner} {side} N={n} round {r + 1} (exit {rc})\n{text}\n")
                            out.flush()
                        if rc != 0:
                            last = next((ln for ln in reversed(text.splitlines()) if ln.strip()), "")
                            failed.append(f"{side} {tuner} N={n} round {r + 1}: exit {rc}: {last[-200:]}")
                            broken.add((tuner, side))
                        results.setdefault((tuner, side), []).extend(parse(text))
                print(f"{tuner} N={n} done", flush=True)
    finally:
        if out:
            out.close()
        shutil.rmtree(bins, ignore_errors=True)
    lines, ok = summarize(results)
    print("\n".join(lines))
    for f in failed:
        print(f"FAILED: {f}")
    if not ok:
        print("FAILED: a candidate DIFFERs from its tuner's first (the log has the line)")
    return 0 if ok and not failed else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    pk = sub.add_parser("pack", help="build both sides' tuners here (nvcc, no GPU)")
    pk.add_argument("base", help="the revision to compare against (e.g. main)")
    pk.add_argument("--tuners", default="tune_backward,tune_forward")
    pk.add_argument("--out", type=Path, default=ROOT / "results" / "tuner-ab")
    pk.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"))
    pk.add_argument("--jobs", type=int, default=2)
    rn = sub.add_parser("run", help="run both sides interleaved (the GPU machine)")
    rn.add_argument("--dir", type=Path, default=ROOT / "results" / "tuner-ab")
    rn.add_argument("--n", default="32768,131072,262144", help="row lengths, comma-separated")
    rn.add_argument("--rounds", type=int, default=2)
    rn.add_argument("--iters", type=int, default=20)
    rn.add_argument("--timeout", type=int, default=60, help="seconds a tuner run may take")
    rn.add_argument("--log", type=Path, help="every run's whole output")
    a = p.parse_args(argv)
    if a.command == "pack":
        tuners = [t for t in a.tuners.split(",") if t]
        manifest = pack(a.base, tuners, a.out, a.nvcc, a.jobs)
        print(f"packed {', '.join(tuners)}: base {manifest['base']['commit'][:10]}, new "
              f"{manifest['new']['commit'][:10]} into {a.out}")
        return 0
    if a.rounds < 1 or a.iters < 1:
        p.error("--rounds and --iters are at least 1")
    try:
        n_list = [int(v) for v in a.n.split(",") if v]
    except ValueError:
        p.error(f"--n wants row lengths like 32768,131072, got {a.n!r}")
    if not (a.dir / "manifest.json").is_file():
        p.error(f"no {a.dir}/manifest.json: pack first (python -m lab.tuner_ab pack BASE) and carry the folder")
    return run(a.dir, n_list, a.rounds, a.iters, a.timeout, a.log)


if __name__ == "__main__":
    sys.exit(main())
