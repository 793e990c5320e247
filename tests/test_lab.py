"""The lab (lab/, not in the wheel) as the GPU machine's steps and the docs
call it: scripts/gpu_run.sh's steps are its run_* functions, each listed by
--help with its description, and a name that is no step is refused before
anything runs; the lab's command lines parse; lab.cuda_calls's timelines
(its busy time, gaps and host calls inside them; its scenarios at the
benchmarks' --quick sizes, measured and reported through a fake of the CUPTI
library) and its library (built, answering without a GPU)."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU_RUN = os.path.join(ROOT, "scripts", "gpu_run.sh")


def _run(*args, **kwargs):
    return subprocess.run(list(args), capture_output=True, text=True, cwd=ROOT, timeout=120, **kwargs)


def _fake_device_root(tmp_path):
    """A folder for gpu_run.sh to run in: a .device/setup.sh whose nvidia-smi
    answers, and no repository (steps that build fail there)."""
    root = tmp_path / "root"
    (root / ".device").mkdir(parents=True)
    (root / ".device" / "setup.sh").write_text("nvidia-smi() { echo fake GPU; }\n")
    return root


def test_gpu_run_lists_every_step_with_its_description():
    text = open(GPU_RUN).read()
    functions = re.findall(r"^run_([a-z_]+)\(\) ", text, re.M)
    assert len(functions) == len(set(functions)) >= 29
    # each step's description is the "#:" line right above its function
    described = re.findall(r"^#: .+\nrun_([a-z_]+)\(\) ", text, re.M)
    assert described == functions
    out = _run("bash", GPU_RUN, "--help")
    assert out.returncode == 0, out.stderr
    listed = re.findall(r"^   ([a-z-]+) +\S", out.stdout, re.M)
    assert listed == [f.replace("_", "-") for f in functions]
    assert "Build and tools" in out.stdout and "scripts/gpu_distributed_check.sh" in out.stdout


def test_gpu_run_refuses_an_unknown_step_first(tmp_path):
    out = _run("bash", GPU_RUN, "build", "nosuch", env=dict(os.environ, OUT=str(tmp_path / "out")))
    assert out.returncode == 2
    assert "unknown step 'nosuch'" in out.stdout and " bench-ln " in out.stdout
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


def test_gpu_run_packs_its_logs_without_plots_or_data(tmp_path):
    """PACK=FILE: the logs under OUT, and only those, in one archive, also
    when a step fails (here the standalone build, in a root with no cuda/)."""
    import tarfile

    root = _fake_device_root(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    for name in ("tests.log", "bench/large-n.png", "bench/large-n.json", "bench/large-n.csv"):
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text("x")
    pack = tmp_path / "logs.tgz"
    run = subprocess.run(["bash", GPU_RUN, "cli"], capture_output=True, text=True, cwd=root, timeout=120,
                         env=dict(os.environ, OUT=str(out), PACK=str(pack)))
    assert run.returncode == 1 and "failed: cli" in run.stdout, run.stdout + run.stderr
    with tarfile.open(pack) as tar:
        names = sorted(n for n in tar.getnames() if not tar.getmember(n).isdir())
    assert names == ["./tests.log"]


@pytest.mark.parametrize("module", ["lab.sweep", "lab.host_cost", "lab.cuda_calls", "lab.memory_check",
                                    "lab.sanitize_cases", "lab.decode_kernels", "lab.cpu_speed",
                                    "lab.weight_reads", "lab.peers", "lab.peers_wheels", "lab.tuner_ab",
                                    "lab.bench_ab"])
def test_lab_command_lines_parse(module):
    out = _run(sys.executable, "-m", module, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage:")


def test_bench_ab_tables_a_committed_run():
    """lab.bench_ab on the logs of an A/B run (docs/h100/2026-12-07-2cb9e6e):
    per table and shape, the tree's build first, each build's chained runs
    then its side-by-side run, us and ours / our RMSNorm."""
    logs = os.path.join(ROOT, "docs", "h100", "2026-12-07-2cb9e6e", "ab")
    out = _run(sys.executable, "-m", "lab.bench_ab", logs)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    bwd = lines.index("ln_training, backward (gx and gw)")
    assert lines[bwd + 1].split() == ["shape", "tree", "A", "B"]
    row = next(line for line in lines[bwd:] if line.split()[0] == "8192x4096").split()
    assert row[1:7] == ["112.5", "(1.14)", "106.0", "(1.12)", "90.4", "(1.07)"]
    assert row[7:13] == ["94.9", "(0.98)", "96.4", "(0.98)", "91.1", "(1.05)"]


def test_gpu_run_bench_ab_wants_patches(tmp_path):
    """The bench-ab step without AB_PATCHES says so and fails, building nothing."""
    root = _fake_device_root(tmp_path)
    run = subprocess.run(["bash", GPU_RUN, "bench-ab"], capture_output=True, text=True, cwd=root, timeout=120,
                         env=dict(os.environ, OUT=str(tmp_path / "out"), AB_PATCHES=""))
    assert run.returncode == 1 and "AB_PATCHES: no patch files" in run.stdout, run.stdout + run.stderr
    assert not (tmp_path / "out" / "ab").exists()


def test_peers_times_the_shapes_of_bench_large_n():
    """lab.peers keeps its own copy of the shapes (it runs where MLX may not
    be installed): the same as bench --large-n's, or its figures miss rows."""
    from lab import peers
    from mlx_rmsnorm.bench import large_n

    assert peers.SHAPES == large_n.SHAPES


def test_peers_profile_names_a_contender():
    """lab.peers --profile NAME (calls for Nsight Compute) refuses a name it
    does not time, in one line, before it imports torch."""
    out = _run(sys.executable, "-m", "lab.peers", "--profile", "rms_norm forward")
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        "--profile: one of 'copy fwd', 'copy bwd', 'rms_norm fwd', 'rms_norm bwd', "
        "'layer_norm fwd', 'layer_norm bwd'"]


def test_peers_against_prints_a_bench_run_with_quack_of_its_gpu(tmp_path):
    """lab.peers --against: a bench --large-n run's lines with QuACK's
    figures of the same GPU and the ratio; refused for another GPU's."""
    import json

    row = dict(kind="large_n", op="rms_norm", direction="bwd", shape="4096x32768", M=4096, N=32768,
               dtype="bfloat16", us=300.0, us_min=290.0, us_max=310.0, ceiling_us=270.0,
               pct_ceiling=90.0, builtin_us=600.0, x_builtin=2.0)
    bench = tmp_path / "bench_bfloat16_large-n.json"
    bench.write_text(json.dumps(dict(device="NVIDIA H100 80GB HBM3", chain=False, rows=[row])))
    fig = {"us": 400.0, "us_min": 399.0, "us_max": 401.0}
    peers = tmp_path / "peers.json"
    for gpu, rc in (("NVIDIA H100 80GB HBM3", 0), ("NVIDIA H200", 1)):
        peers.write_text(json.dumps(dict(gpu=gpu, figures={"4096x32768": {"rms_norm bwd": fig}})))
        out = _run(sys.executable, "-m", "lab.peers", "--against", str(bench), "--out", str(peers))
        assert out.returncode == rc, out.stderr
    peers.write_text(json.dumps(dict(gpu="NVIDIA H100 80GB HBM3",
                                     figures={"4096x32768": {"rms_norm bwd": fig}})))
    out = _run(sys.executable, "-m", "lab.peers", "--against", str(bench), "--out", str(peers))
    assert "QuACK  400.0 us (torch, this GPU; ours/QuACK 0.75)" in out.stdout


def test_gpu_run_peers_needs_no_mlx_and_joins_the_parts_first(tmp_path):
    """The peers step alone runs without .device (a call carrying QuACK's
    wheels has no room for it): it joins PEERS_PARTS, installs the wheels,
    then times; with a step that needs MLX the run still wants .device."""
    root = tmp_path / "root"
    root.mkdir()
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls.txt"
    for tool in ("python3", "nvidia-smi"):
        (fake / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\n')
        (fake / tool).chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PATH=f"{fake}:{os.environ['PATH']}",
               PEERS_PARTS="/tmp/peers-1 results/peers/2")
    run = subprocess.run(["bash", GPU_RUN, "peers"], capture_output=True, text=True, cwd=root,
                         timeout=120, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [ln for ln in calls.read_text().splitlines() if ln.startswith("python3 -m")]
    assert lines[0] == "python3 -m lab.peers_wheels unpack /tmp/peers-1 results/peers/2 --into /tmp/peers-wheels"
    assert lines[1].startswith("python3 -m pip install -q --no-index --no-deps")
    assert lines[2] == f"python3 -m lab.peers --out {out}/peers.json"
    run = subprocess.run(["bash", GPU_RUN, "peers", "cli"], capture_output=True, text=True, cwd=root,
                         timeout=120, env=env)
    assert run.returncode == 1 and ".device/setup.sh" in run.stderr, run.stdout + run.stderr


def test_peers_wheels_split_a_wheel_over_two_calls_and_join_it_back(tmp_path):
    """lab.peers_wheels: a wheel larger than a call goes into two folders of
    at most a call each (tar.xz, cut), the other wheels beside its second
    part; unpack gives a wheel of the same files and bytes, and the others
    as they were. More than two calls' worth is refused."""
    import zipfile

    from lab import peers_wheels

    rng = __import__("random").Random(7)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    big = {"pkg/lib/libbig.so": rng.randbytes(30000), "pkg/__init__.py": b"x = 1\n",
           "pkg-1.0.dist-info/RECORD": b"pkg/__init__.py,,\n"}
    with zipfile.ZipFile(wheels / "pkg-1.0-py3-none-any.whl", "w") as z:
        for name, data in big.items():
            z.writestr(name, data)
    (wheels / "small-1.0-py3-none-any.whl").write_bytes(b"PK small")
    peers_wheels.pack(str(wheels), str(tmp_path / "out"), carry=20000)
    one, two = tmp_path / "out" / "1", tmp_path / "out" / "2"
    assert sorted(p.name for p in one.iterdir()) == ["pkg-1.0-py3-none-any.whl.tar.xz.part1"]
    assert sorted(p.name for p in two.iterdir()) == ["pkg-1.0-py3-none-any.whl.tar.xz.part2",
                                                     "small-1.0-py3-none-any.whl"]
    assert all(sum(p.stat().st_size for p in d.iterdir()) <= 20000 for d in (one, two))
    into = tmp_path / "into"
    peers_wheels.unpack([str(two), str(one)], str(into))
    assert (into / "small-1.0-py3-none-any.whl").read_bytes() == b"PK small"
    with zipfile.ZipFile(into / "pkg-1.0-py3-none-any.whl") as z:
        assert {n: z.read(n) for n in z.namelist()} == big
    with pytest.raises(SystemExit, match="more than a call carries"):
        peers_wheels.pack(str(wheels), str(tmp_path / "out2"), carry=12000)


def test_weight_reads_counts_each_variants_bytes():
    """lab.weight_reads on the CPU stream at a tiny shape: every op and way
    of holding w and b has a row, and its bytes are x (and the residual) in,
    y (and h) out, y in fp32 for the fp32 weights."""
    import mlx.core as mx

    import mlx_rmsnorm
    from lab import weight_reads

    prev = mlx_rmsnorm._ext._set_route_cpu(True)
    try:
        rows = weight_reads.run_shape((8, 256), calls=2, repeats=1, device=mx.cpu)
    finally:
        mlx_rmsnorm._ext._set_route_cpu(prev)
    bf16 = 8 * 256 * 2
    want = {("layer_norm", "w, b as x"): 2 * bf16, ("layer_norm", "w as x, no b"): 2 * bf16,
            ("layer_norm", "w, b fp32"): 3 * bf16, ("add_layer_norm", "w, b as x"): 4 * bf16,
            ("add_layer_norm", "w as x, no b"): 4 * bf16, ("add_layer_norm", "w, b fp32"): 5 * bf16}
    assert {(op, name): nbytes for _, op, name, _, nbytes, *_ in rows} == want


def test_cuda_calls_timeline_of_one_eval():
    """Busy time is the union of the GPU's activities; a gap lies between
    the last-ending activity and the next, and the host time inside it goes
    to the calls that overlap it (their union, for calls of two threads) and
    the rest to none."""
    from lab import cuda_calls

    records = [("kernel", 100, 110, 0, "A"), ("kernel", 105, 120, 0, "B"), ("memset", 130, 140, 64, "memset"),
               ("runtime", 122, 135, 0, "cudaGraphLaunch"), ("driver", 90, 121, 0, "cuEventSynchronize")]
    t = cuda_calls.eval_timeline(80, 150, records)
    assert (t["lead"], t["span"], t["busy"], t["idle"], t["tail"], t["gaps"]) == (20, 40, 30, 10, 10, 1)
    assert t["wall"] == t["lead"] + t["span"] + t["tail"]
    n, ns, longest, host = t["pairs"][("B", "[memset]")]
    assert (n, ns, longest) == (1, 10, 10)
    assert host == {"run:cudaGraphLaunch": 8, "dri:cuEventSynchronize": 1, cuda_calls.NO_CALL: 1}
    assert t["moves"] == {"memset": 1} and t["move_bytes"] == {"memset": 64}
    assert t["kernel_ns"] == {"A": 10, "B": 15}


def test_cuda_calls_sequence_names_what_ran_beside():
    """One eval's activities by start, in us from the first; each lists the
    earlier ones still running when it started, and for how long."""
    from lab import cuda_calls

    records = [("kernel", 5000, 9000, 0, "walk"), ("kernel", 1000, 4000, 0, "walk"),
               ("kernel", 4000, 6000, 0, "colsum"), ("runtime", 0, 500, 0, "cudaGraphLaunch")]
    lines = cuda_calls.sequence((0, 10000, records), 20)
    assert len(lines) == 3
    assert lines[0].split()[:4] == ["#0", "0.0", "3.0", "3.0"]
    assert lines[1].split()[:5] == ["#1", "3.0", "5.0", "2.0", "colsum"] and "beside" not in lines[1]
    assert lines[2].split()[:5] == ["#2", "4.0", "8.0", "4.0", "walk"] and lines[2].endswith("beside #1 1.0")


def test_cuda_calls_short_kernel_names():
    from lab import cuda_calls

    name = "void mlx::core::cu::rms_norm_small<__nv_bfloat16, 128, 4, true, 8>(const T1 *, float (*)(int), long)"
    assert cuda_calls.short(name, 60) == "rms_norm_small<bf16, 128, 4, true, 8>"
    assert cuda_calls.short("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", 20) == "nvjet_sm9...oopA_NTN"


def test_cuda_calls_library_builds_and_answers_without_a_gpu(tmp_path, monkeypatch):
    """The CUPTI library builds here where CUPTI's headers are (no GPU: the
    driver never injects it), and its functions answer through Counter."""
    from lab import cuda_calls

    try:
        cuda_calls._cupti_dirs()
    except SystemExit as e:
        pytest.skip(str(e))
    monkeypatch.setattr(cuda_calls, "LIB", str(tmp_path / "cuda_calls.so"))
    monkeypatch.setattr(cuda_calls, "TIMELINE", str(tmp_path / "timeline.tsv"))
    cuda_calls.build(cuda_calls.LIB)
    counter = cuda_calls.Counter()
    counter.reset()
    t0 = counter.now()
    assert 0 < t0 <= counter.now()
    assert counter.read() == {} and counter.timeline() == []


class _FakeCounter:
    """lab.cuda_calls.Counter without CUPTI (no GPU here): each eval, the
    time between two now() calls, gets two kernels and a gap with a graph
    launch inside; under patch() the gap is 5 us longer and a memset runs
    beside the second kernel."""

    def __init__(self):
        self.t, self.opened, self.records = 0, None, []

    def reset(self):
        self.records = []

    def now(self):
        import mlx_rmsnorm

        self.t += 1_000_000
        if self.opened is None:
            self.opened = self.t
        else:
            a, gap = self.opened, 15_000 if mlx_rmsnorm.is_patched() else 10_000
            self.records += [("kernel", a + 1000, a + 50_000, 0, "void gemm(int)"),
                             ("runtime", a + 50_500, a + 50_000 + gap, 0, "cudaGraphLaunch"),
                             ("kernel", a + 50_000 + gap, a + 90_000 + gap, 0, "void norm<float>(int)")]
            if mlx_rmsnorm.is_patched():
                self.records.append(("memset", a + 70_000, a + 71_000, 256, "memset"))
            self.opened = None
        return self.t

    def read(self):
        import mlx_rmsnorm

        memsets = 5 if mlx_rmsnorm.is_patched() else 0
        return {"dri:cuGraphLaunch": (5, 50_000), "dri:cuMemsetD8Async": (memsets, 1000 * memsets)}

    def timeline(self):
        return list(self.records)


@pytest.mark.parametrize("name", ["trainstep-llama8b-frozen", "prefill128-llama3-8b", "prefill128-qwen3-0.6b"])
def test_cuda_calls_timeline_scenarios_build_and_report_on_the_cpu(name):
    """The timeline scenarios, at the benchmarks' --quick sizes, built and
    run under their contenders (the plugin routed to the CPU), measured and
    reported through a counter that fakes the CUPTI library."""
    import io

    import mlx_rmsnorm
    from lab import cuda_calls

    (make, evals, contenders, timeline), = cuda_calls.scenarios([name], quick=True).values()
    assert timeline and contenders[0] == "builtin"
    was = mlx_rmsnorm.route_cpu(True)
    try:
        res = cuda_calls.measure(make(), evals, _FakeCounter(), contenders, timeline=True)
    finally:
        mlx_rmsnorm.route_cpu(was)
    assert not mlx_rmsnorm.is_patched()
    assert all(len(res[c]["evals"]) == len(res[c]["times"]) == 2 * evals for c in contenders)
    out = io.StringIO()
    cuda_calls.report_timeline(name, res, evals, out, 60, contenders)
    text = out.getvalue()
    slower = contenders[1]
    assert text.startswith(f"## {name}: timeline of builtin against {slower}, 10 and 10 evals")
    assert re.search(r"^    idle inside the span +10\.0 +15\.0 +\+5\.0$", text, re.M)
    assert re.search(r"^memset \(bytes\) +0 +256 +\+256$", text, re.M)
    assert re.search(r"^ +15\.0 us +1\.0x +longest +15\.0 us +gemm -> norm<float> +\| run:cudaGraphLaunch 14\.5, "
                     r"\(in no CUDA call\) 0\.5$", text, re.M)
    assert re.search(r"^dri:cuMemsetD8Async +0\.00 +1\.00 ", text, re.M)  # counts differ
    assert f"## {slower} - builtin, per eval: wall " in text
    assert "##   idle gaps +5.0 us, the host meanwhile in: run:cudaGraphLaunch +5.0" in text


# Tuner output as cuda/cli/tune_backward.cu and tune_forward.cu print it.
_TUNE_BACKWARD = """\
(only N = 131072)
shape        candidate                   grid units        us    GB/s  % ceil check vs first
1024x131072  copy ceiling (x+g)                         189.0    4261     100
             {512,512,4,2,async,x8}      1056   132     210.5    3826    89.8 reference
             {1024,1024,2,2,async,x8}      528    66     220.0    3661    85.9 gx 0.0e+00 gw 0.0e+00 ok
             {512,512,2,2,async,x16} does not fit
"""
_TUNE_FORWARD = """\
shape        candidate                                  grid        us    GB/s  % ceil check vs first
1024x131072  copy ceiling (x -> y)                               131.0    4098     100
             {512,512,4,1,async,c8,m2}                  1056     145.8    3682    89.8 reference
             {256,256,8,1,async,c8,m2}                  1056     144.8    3708    90.5 max rel 1.0e-03 DIFFER
"""


def test_tuner_ab_reads_both_tuners_tables():
    from lab import tuner_ab

    rows = tuner_ab.parse(_TUNE_BACKWARD)
    assert [(r["candidate"], r["us"]) for r in rows] == [
        ("copy ceiling (x+g)", 189.0), ("{512,512,4,2,async,x8}", 210.5), ("{1024,1024,2,2,async,x8}", 220.0)]
    assert {r["shape"] for r in rows} == {"1024x131072"} and not any(r["differ"] for r in rows)
    forward = tuner_ab.parse(_TUNE_FORWARD)
    assert [r["us"] for r in forward] == [131.0, 145.8, 144.8] and forward[2]["differ"]

    slower = _TUNE_BACKWARD.replace("210.5", "231.5")
    lines, ok = tuner_ab.summarize({("tune_backward", "base"): rows + rows,
                                    ("tune_backward", "new"): tuner_ab.parse(slower) * 2})
    assert ok
    row = next(line for line in lines if "{512,512,4,2,async,x8}" in line).split()
    assert row[-3:] == ["210.5", "231.5", "1.100"]
    _, ok = tuner_ab.summarize({("tune_forward", "base"): forward, ("tune_forward", "new"): forward})
    assert not ok  # a candidate that differs from its tuner's first fails the run


def test_tuner_ab_packs_both_sides_and_runs_them_interleaved(tmp_path):
    """pack with a stand-in nvcc (it writes, as the tuner, a script printing
    a table whose times depend on the side), then run: the table of medians,
    new / base, each side run per round, the order alternating."""
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(
        "#!/bin/bash\n"
        "while [ $# -gt 0 ]; do [ \"$1\" = -o ] && out=$2; shift; done\n"
        "cat > \"$out\" <<'TUNER'\n"
        "#!/bin/bash\n"
        "echo \"$(basename $0) $*\" >> \"$TUNER_AB_CALLS\"\n"
        "case \"$(basename $0)\" in new_*) [ -n \"$TUNER_AB_BREAK_NEW\" ] && { echo \"cuda error\"; exit 3; } ;; esac\n"
        "us=200.0; case \"$(basename $0)\" in new_*) us=180.0 ;; esac\n"
        "echo \"${2}x${2}  copy ceiling (x+g)   150.0   100 100\"\n"
        "echo \"             {512,512,4,2,async,x8}  1056 132 $us 3000 90.0 reference\"\n"
        "TUNER\n"
        "chmod +x \"$out\"\n")
    nvcc.chmod(0o755)
    out = tmp_path / "ab"
    packed = _run(sys.executable, "-m", "lab.tuner_ab", "pack", "HEAD", "--out", str(out), "--nvcc", str(nvcc),
                  "--tuners", "tune_backward")
    assert packed.returncode == 0, packed.stderr
    assert sorted(p.name for p in out.iterdir()) == ["base_tune_backward.gz", "manifest.json",
                                                     "new_tune_backward.gz"]
    calls = tmp_path / "calls"
    ran = _run(sys.executable, "-m", "lab.tuner_ab", "run", "--dir", str(out), "--n", "4096,8192",
               "--rounds", "2", "--log", str(tmp_path / "runs.log"),
               env=dict(os.environ, TUNER_AB_CALLS=str(calls)))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert re.search(r"tune_backward +4096x4096 +\{512,512,4,2,async,x8\} +200\.0 +180\.0 +0\.900", ran.stdout)
    assert [line.split()[0] for line in calls.read_text().splitlines()] == [
        "base_tune_backward", "new_tune_backward", "new_tune_backward", "base_tune_backward"] * 2
    assert "== tune_backward new N=8192 round 2 (exit 0)" in (tmp_path / "runs.log").read_text()

    # a side that fails once is not run again (a hang would cost a timeout a run)
    calls.unlink()
    broken = _run(sys.executable, "-m", "lab.tuner_ab", "run", "--dir", str(out), "--n", "4096,8192",
                  env=dict(os.environ, TUNER_AB_CALLS=str(calls), TUNER_AB_BREAK_NEW="1"))
    assert broken.returncode == 1
    assert "FAILED: new tune_backward N=4096 round 1: exit 3: cuda error" in broken.stdout
    assert broken.stdout.count("FAILED") == 1
    assert [line.split()[0] for line in calls.read_text().splitlines()] == [
        "base_tune_backward", "new_tune_backward", "base_tune_backward", "base_tune_backward",
        "base_tune_backward"]

    missing = _run(sys.executable, "-m", "lab.tuner_ab", "run", "--dir", str(tmp_path / "none"))
    assert missing.returncode == 2 and "pack first" in missing.stderr


def test_tuner_ab_refuses_bad_input_in_one_line(tmp_path):
    # no manifest: it says to pack first; a bad --n or --rounds: the argument
    empty = _run(sys.executable, "-m", "lab.tuner_ab", "run", "--dir", str(tmp_path))
    assert empty.returncode == 2 and "pack first (python -m lab.tuner_ab pack BASE)" in empty.stderr
    (tmp_path / "manifest.json").write_text("{}")
    bad_n = _run(sys.executable, "-m", "lab.tuner_ab", "run", "--dir", str(tmp_path), "--n", "32k")
    assert bad_n.returncode == 2 and "--n wants row lengths like 32768,131072, got '32k'" in bad_n.stderr
    bad_rounds = _run(sys.executable, "-m", "lab.tuner_ab", "run", "--dir", str(tmp_path), "--rounds", "0")
    assert bad_rounds.returncode == 2 and "--rounds and --iters are at least 1" in bad_rounds.stderr
