"""QuACK's wheels onto the GPU machine, which has no package index and takes
at most 64 MiB a call (the working tree included): what ``lab.peers`` needs.

Here (with network), once:

    python3 -m lab.peers_wheels pack results/peers

downloads the wheels below for the machine's Python (3.12, x86_64) and
splits them into two folders of at most --carry bytes each: results/peers/1
holds the first part of the one wheel larger than a call (the CUTLASS DSL's
CUDA 12 libraries, 89 MB, packed again as tar.xz: 61 MB); results/peers/2
its rest and every other wheel. On one warm GPU machine (it goes back after
~30 s idle: send the second call at once):

    call 1, carry results/peers/1:  mkdir -p /tmp/peers-1 && cp results/peers/1/* /tmp/peers-1/
    call 2, carry results/peers/2:
        PEERS_PARTS="/tmp/peers-1 results/peers/2" OUT=/tmp/o bash scripts/gpu_run.sh peers
    call 3, carry .device and results/prebuilt (no room for them before):
        OUT=/tmp/o bash scripts/gpu_run.sh bench-large-n ...

where the peers step runs ``python3 -m lab.peers_wheels unpack`` (the
parts joined, the wheel zipped back), installs the wheels with pip
--no-index --no-deps and runs ``lab.peers`` into OUT/peers.json, which
bench-large-n of a later call with the same OUT prints beside ours.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

# What the machine's image lacks (it has torch 2.11, triton 3.6, einops,
# protobuf; its cuda-bindings 13.3 is replaced by the 13.0 that
# nvidia-cutlass-dsl 4.7 was measured with, docs/NOTES.md, Measuring).
WHEELS = [
    "nvidia-cutlass-dsl==4.7.0", "nvidia-cutlass-dsl-libs-base==4.7.0",
    "nvidia-cutlass-dsl-libs-core==4.7.0", "nvidia-cutlass-dsl-libs-cu12==4.7.0",
    "quack-kernels==0.6.5", "apache-tvm-ffi==0.1.12", "torch-c-dlpack-ext==0.1.5",
    "cuda-python==13.0.3", "cuda-bindings==13.0.3", "nvidia-cuda-nvdisasm==13.5.37",
]
# A call's carry: 64 MiB less the working tree (~8 MB) and some room.
CARRY = 58_000_000
PART = ".tar.xz.part"


def download(folder):
    """The wheels of WHEELS for CPython 3.12 on x86_64 Linux, into folder."""
    os.makedirs(folder, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--platform", "manylinux_2_28_x86_64",
                    "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
                    "-d", folder, *WHEELS], check=True)


def pack(wheels, out, carry=CARRY):
    """The wheels in folder `wheels` as out/1 and out/2, each at most `carry`
    bytes: a wheel larger than `carry` is repacked as tar.xz (its files, not
    the zip) and cut in two, the first part in out/1, the rest in out/2
    beside every other wheel. One such wheel at most (two calls)."""
    names = sorted(glob.glob(os.path.join(wheels, "*.whl")))
    big = [w for w in names if os.path.getsize(w) > carry]
    if len(big) > 1:
        raise SystemExit(f"more than one wheel over {carry} bytes: {big}")
    first, second = os.path.join(out, "1"), os.path.join(out, "2")
    for d in (first, second):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    for w in names:
        if w not in big:
            shutil.copy(w, second)
    for w in big:
        base = os.path.basename(w)
        with tempfile.TemporaryDirectory() as tmp:
            with zipfile.ZipFile(w) as z:
                z.extractall(os.path.join(tmp, "files"))
            packed = os.path.join(tmp, "packed")
            with tarfile.open(packed, "w:xz") as tar:
                for entry in sorted(os.listdir(os.path.join(tmp, "files"))):
                    tar.add(os.path.join(tmp, "files", entry), arcname=entry)
            with open(packed, "rb") as f:
                head, rest = f.read(carry), f.read()
        with open(os.path.join(first, base + PART + "1"), "wb") as f:
            f.write(head)
        with open(os.path.join(second, base + PART + "2"), "wb") as f:
            f.write(rest)
    for d in (first, second):
        size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(d, "*")))
        if size > carry:
            raise SystemExit(f"{d} holds {size} bytes, more than a call carries ({carry})")
        print(f"{d}: {size / 1e6:.1f} MB, {len(os.listdir(d))} files")


def unpack(folders, into):
    """The wheels again in folder `into`, from the folders that pack made
    (in any order): each split wheel joined and zipped back, the others
    copied."""
    os.makedirs(into, exist_ok=True)
    files = [p for d in folders for p in sorted(glob.glob(os.path.join(d, "*")))]
    for p in files:
        if p.endswith(".whl"):
            shutil.copy(p, into)
    for p in files:
        if not p.endswith(PART + "1"):
            continue
        base = os.path.basename(p)[: -len(PART + "1")]
        rest = [q for q in files if os.path.basename(q) == base + PART + "2"]
        if not rest:
            raise SystemExit(f"{base}: the second part is in none of {folders}")
        with tempfile.TemporaryDirectory() as tmp:
            packed = os.path.join(tmp, "packed")
            with open(packed, "wb") as out:
                for part in (p, rest[0]):
                    with open(part, "rb") as f:
                        shutil.copyfileobj(f, out)
            with tarfile.open(packed, "r:xz") as tar:
                tar.extractall(os.path.join(tmp, "files"), filter="data")
            root = os.path.join(tmp, "files")
            # stored, not compressed: pip reads either, and this is faster
            with zipfile.ZipFile(os.path.join(into, base), "w", zipfile.ZIP_STORED) as z:
                for dirpath, _, filenames in sorted(os.walk(root)):
                    for name in sorted(filenames):
                        path = os.path.join(dirpath, name)
                        z.write(path, os.path.relpath(path, root))
    print(f"{into}: {', '.join(sorted(os.listdir(into)))}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    pk = sub.add_parser("pack", help="download the wheels and split them into OUT/1 and OUT/2")
    pk.add_argument("out")
    pk.add_argument("--wheels", default=None, help="use these downloaded wheels (default: download)")
    pk.add_argument("--carry", type=int, default=CARRY, help="bytes a call may carry")
    up = sub.add_parser("unpack", help="join the parts into wheels (on the GPU machine)")
    up.add_argument("folders", nargs="+")
    up.add_argument("--into", required=True)
    args = p.parse_args(argv)
    if args.command == "pack":
        wheels = args.wheels or os.path.join(args.out, "wheels")
        if args.wheels is None:
            download(wheels)
        pack(wheels, args.out, args.carry)
    else:
        unpack(args.folders, args.into)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
