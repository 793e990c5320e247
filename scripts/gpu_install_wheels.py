#!/usr/bin/env python3
"""Wheels for the offline install check on the GPU machine (gpu_install_check.sh),
run by hand: `prepare` here before the device run; that script runs `restore`.

    python3 scripts/gpu_install_wheels.py prepare [DIR]          # here, with PyPI
    python3 scripts/gpu_install_wheels.py restore DIR OUT [CUDA]  # there

The isolated build needs its build requirements as wheels (the machine has no
index): setuptools and nanobind, and for the nvcc-from-pip build the CUDA 13.0
compiler wheels (nvidia-cuda-nvcc, -nvvm, -crt, -cccl, -runtime). Those are
~100 MB, more than a device run can carry beside MLX, so `prepare` stores them
"thin": every file over 1 MiB of the nvcc and nvvm wheels is left out of the zip (its RECORD line, with
sha256 and size, stays). `restore` puts each left-out file back from the
machine's own CUDA 13.0 toolkit, found by size and sha256 -- the same release
ships byte-identical binaries (nvcc, ptxas, nvlink, cudafe++, fatbinary, cicc
compared here) -- and writes ordinary wheels whose files all match the PyPI
RECORD. A file with no identical copy is reported; only libnvvm.so.4, which
nvcc does not use (cicc links NVVM statically), may stay out.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import zipfile

BUILD = ["setuptools", "nanobind"]
NVCC = [
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-cccl==13.0.85",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
]
THIN_OVER = 1 << 20
THIN = ("nvidia_cuda_nvcc-", "nvidia_nvvm-")  # the others are small: carried whole
MAY_STAY_OUT = {"nvidia/cu13/lib/libnvvm.so.4"}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux_2_12_x86_64", "manylinux2014_x86_64"]


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _record(z: zipfile.ZipFile) -> tuple[str, list[list[str]]]:
    name = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
    return name, list(csv.reader(io.StringIO(z.read(name).decode())))


def prepare(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    platform_args = [a for p in PLATFORMS for a in ("--platform", p)]
    common = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", *platform_args]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *common, "-d", out, *BUILD],
                   check=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *common, "-d", tmp, *NVCC],
                       check=True)
        for whl in sorted(os.listdir(tmp)):
            with zipfile.ZipFile(os.path.join(tmp, whl)) as z, \
                    zipfile.ZipFile(os.path.join(out, whl + ".thin"), "w", zipfile.ZIP_DEFLATED) as t:
                left = 0
                for info in z.infolist():
                    if (whl.startswith(THIN) and info.file_size > THIN_OVER
                            and not info.filename.endswith("RECORD")):
                        left += info.file_size
                        continue
                    t.writestr(info, z.read(info))
            print(f"{whl}: {left / 2**20:.0f} MiB left out")
    total = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"{out}: {total / 2**20:.1f} MiB")


def _index_by_size(root: str) -> dict[int, list[str]]:
    index: dict[int, list[str]] = {}
    for d, _, names in os.walk(root, followlinks=True):
        for n in names:
            p = os.path.join(d, n)
            if os.path.isfile(p) and not os.path.islink(p):
                index.setdefault(os.path.getsize(p), []).append(p)
    return index


def restore(src: str, out: str, cuda_root: str) -> int:
    os.makedirs(out, exist_ok=True)
    index = _index_by_size(os.path.realpath(cuda_root))
    problems = 0
    for f in sorted(os.listdir(src)):
        path = os.path.join(src, f)
        if not f.endswith(".whl.thin"):
            continue
        with zipfile.ZipFile(path) as t:
            record_name, rows = _record(t)
            have = set(t.namelist())
            kept_rows = []
            with zipfile.ZipFile(os.path.join(out, f[: -len(".thin")]), "w", zipfile.ZIP_DEFLATED) as w:
                for row in rows:
                    if not row or row[0] == record_name:
                        continue
                    name, hash_, size = row[0], row[1], int(row[2] or 0)
                    if name in have:
                        w.writestr(t.getinfo(name), t.read(name))
                        kept_rows.append(row)
                        continue
                    want = hash_.split("=", 1)[1]
                    data = None
                    for cand in index.get(size, []):
                        blob = open(cand, "rb").read()
                        if _digest(blob) == want:
                            data, origin = blob, cand
                            break
                    if data is None:
                        if name in MAY_STAY_OUT:
                            print(f"  {name}: no identical copy in {cuda_root}; left out (nvcc does not use it)")
                            continue
                        print(f"  {name}: NO identical copy in {cuda_root}")
                        problems += 1
                        continue
                    # Stored, not deflated: a temporary wheel, written fast. The
                    # mode as the PyPI wheels have it (pip wants a regular file's
                    # type bits to keep the executable bit).
                    info = zipfile.ZipInfo(name, date_time=(2025, 1, 1, 0, 0, 0))
                    info.external_attr = (0o100744 if "/bin/" in name else 0o100644) << 16
                    w.writestr(info, data)
                    kept_rows.append(row)
                    print(f"  {name}: from {origin}")
                buf = io.StringIO()
                csv.writer(buf, lineterminator="\n").writerows(kept_rows + [[record_name, "", ""]])
                w.writestr(t.getinfo(record_name), buf.getvalue())
    return problems


def main(argv: list[str]) -> int:
    if len(argv) >= 1 and argv[0] == "prepare":
        prepare(argv[1] if len(argv) > 1 else ".device/install-wheels")
        return 0
    if len(argv) >= 3 and argv[0] == "restore":
        return 1 if restore(argv[1], argv[2], argv[3] if len(argv) > 3 else "/usr/local/cuda") else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
