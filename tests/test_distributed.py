"""Data-parallel training across processes: examples/train_distributed.py run
by `mlx.launch -n 2 --backend ring` on localhost (two CPU processes), checked
against itself, a rerun, the built-in RMSNorm and one process training on the
full batch. Skipped when the ring backend cannot start here.

Three launches (patched with --compare, patched again, built-in), each 8 SGD
steps of a tiny float32 transformer on 2 x 4 sequences of 32 tokens, with the
embedding's gradient as a GEMM (--gemm-embedding-grad: MLX's scatter-add adds
with atomics on CUDA, so reruns there would differ for a reason not ours).

The same checks on two GPUs with NCCL (scripts/gpu_distributed_check.sh):
    MLX_RMSNORM_DIST_BACKEND=nccl MLX_RMSNORM_DIST_DEVICE=gpu pytest tests/test_distributed.py
MLX_ENABLE_TF32=0 is set for the ranks: float32 matmuls stay float32, so the
float32 tolerances below hold on a GPU too.

Why SGD: the comparison with the full batch measures summation order, and a
plain gradient step passes a gradient perturbation on at its own size. AdamW
divides each update by the root of its second moment, so a gradient entry
near zero moves its parameter by about the learning rate whatever its last
bits are (examples/train_transformer.py's docstring shows the drift); its
divergence says nothing about whether the sharding is right.
"""

import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "train_distributed.py")
BACKEND = os.environ.get("MLX_RMSNORM_DIST_BACKEND", "ring")
DEVICE = os.environ.get("MLX_RMSNORM_DIST_DEVICE", "cpu")
WORLD = 2
BATCH, SEQ, STEPS = 4, 32, 8  # per rank: 4 sequences of 32 tokens
CONFIG = ["--device", DEVICE, "--model", "transformer", "--dims", "64", "--layers", "2",
          "--heads", "4", "--vocab", "128", "--seq", str(SEQ), "--batch", str(BATCH),
          "--steps", str(STEPS), "--optimizer", "sgd", "--lr", "0.05",
          "--precision", "float32", "--backend", BACKEND, "--gemm-embedding-grad",
          *os.environ.get("MLX_RMSNORM_DIST_ARGS", "").split()]  # e.g. --no-compile
U = 2.0**-24  # unit roundoff of float32
LAUNCH_TIMEOUT = 180


def launcher():
    """mlx.launch next to this interpreter, or the same entry point through it."""
    exe = os.path.join(os.path.dirname(sys.executable), "mlx.launch")
    if os.access(exe, os.X_OK):
        return [exe]
    return [sys.executable, "-c", "import sys; from mlx._distributed_utils.launch import main; "
            "sys.argv[0] = 'mlx.launch'; sys.exit(main())"]


def free_port_pair():
    """A port p with p and p + 1 free on localhost (the ring listens on one
    port per rank, counting up from --starting-port; NCCL's rank 0 on one)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", p))
                b.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports on 127.0.0.1")


def launch(args, cwd):
    """Runs `mlx.launch -n 2 --backend ring -- python ...` on localhost (or
    nccl). The launcher exits 0 even when a rank fails, so callers read the
    ranks' files."""
    if shutil.which("bash") is None:
        pytest.skip("mlx.launch runs every rank through /bin/bash")
    port = ["--starting-port" if BACKEND == "ring" else "--nccl-port", str(free_port_pair())]
    cmd = launcher() + ["-n", str(WORLD), "--backend", BACKEND, *port, "--", sys.executable] + args
    env = dict(os.environ, PYTHONUNBUFFERED="1", MLX_ENABLE_TF32="0")
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # the ranks share its process group
    try:
        out, _ = proc.communicate(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"mlx.launch did not finish in {LAUNCH_TIMEOUT} s:\n{out[-4000:]}")
    return out


@pytest.fixture(scope="module")
def ring_usable(tmp_path_factory):
    """Skips the module unless two ranks of the backend connect on localhost."""
    import mlx.core as mx

    if not mx.distributed.is_available(BACKEND):
        pytest.skip(f"this MLX build has no {BACKEND} backend")
    d = tmp_path_factory.mktemp("probe")
    probe = (f"import mlx.core as mx; mx.set_default_device(mx.{DEVICE}); "
             f"g = mx.distributed.init(strict=True, backend='{BACKEND}'); "
             "print('rank', g.rank(), 'of', g.size(), mx.distributed.all_sum(mx.array(1.0)).item())")
    out = launch(["-c", probe], str(d))
    if out.count(f"of {WORLD} {float(WORLD)}") != WORLD:
        pytest.skip(f"mlx.launch --backend {BACKEND} did not start {WORLD} connected ranks "
                    f"here:\n{out[-2000:]}")


def run_training(tmp_path, name, *extra):
    d = tmp_path / name
    d.mkdir()
    out = launch([SCRIPT, *CONFIG, "--json", str(d / "rank{rank}.json"),
                  "--save-npz", str(d / "rank{rank}.npz"), *extra], str(d))
    results = []
    for r in range(WORLD):
        path = d / f"rank{r}.json"
        assert path.exists(), f"rank {r} wrote no results ({name}):\n{out[-4000:]}"
        results.append(json.loads(path.read_text()))
        results[-1]["params"] = dict(np.load(d / f"rank{r}.npz"))
    return results, out


@pytest.fixture(scope="module")
def runs(ring_usable, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dp")
    return {
        "plugin": run_training(tmp, "plugin", "--compare"),
        "rerun": run_training(tmp, "rerun"),
        "builtin": run_training(tmp, "builtin", "--builtin"),
    }


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


def test_ranks_hold_bitwise_identical_parameters(runs):
    for name, (results, out) in runs.items():
        r0, r1 = results
        assert r0["world"] == r1["world"] == WORLD
        assert r0["patched"] == r1["patched"] == (name != "builtin")  # mx.fast.rms_norm was ours
        assert r0["digest"] == r1["digest"], (name, out[-2000:])
        assert r0["ranks_identical"] and r1["ranks_identical"]  # the in-run all_sum check agrees
        assert same_bits(r0["params"], r1["params"]), name
        assert r0["losses"] == r1["losses"]  # every rank saw the same averaged loss


def test_two_runs_give_bitwise_identical_parameters(runs):
    a, b = runs["plugin"][0][0], runs["rerun"][0][0]
    differ = [k for k in a["params"] if a["params"][k].tobytes() != b["params"][k].tobytes()]
    assert not differ, f"parameters that differ between two runs: {differ}"
    assert a["digest"] == b["digest"]
    assert a["losses"] == b["losses"]


def summation_order_tolerance(ref_losses):
    """Largest |loss difference| at each step allowed between 2 ranks on
    half-batches and 1 process on the full batch, in float32.

    Both compute the same function of the same data; only the grouping of
    the sums over the batch differs (per row, every op sees the same
    inputs). The loss is the mean of n = 2 x 4 x 32 = 256 non-negative
    per-token losses: one process sums all n, the ranks sum n/2 each and
    all_sum adds the two halves (then / 2, exact). Each computed sum of
    non-negative terms is within gamma_n = n u / (1 - n u) of the exact one
    (Higham, Accuracy and Stability, 2nd ed., sec. 4.2), so the two differ by
    at most 2 gamma_n L at equal parameters: 3.1e-5 L for n = 256. Each
    gradient is such a regrouped sum over the same n tokens, and a plain SGD
    step moves the parameters by lr x gradient, so every step adds at most
    one more perturbation of that relative size to the difference: allow
    2 gamma_n L_0 (k + 1) at step k. On a GPU the library may also pick a
    different matmul kernel for half the rows, regrouping inner sums of at
    most 4 x 64 = 256 = n terms: the same kind of error, the same order.
    (Measured on 2 CPU cores: 1.9e-6 at L = 5.6, 4 ulps, flat over the steps,
    against a bound of 1.7e-4 at step 0; summing the gradients instead of
    averaging them moves step 1 by 4.3e-2, training on the wrong rows moves
    step 0 by 4.7e-2.)"""
    n = WORLD * BATCH * SEQ
    gamma = n * U / (1 - n * U)
    return [2 * gamma * abs(ref_losses[0]) * (k + 1) for k in range(len(ref_losses))]


def test_loss_curve_matches_one_process_on_the_full_batch(runs):
    r0 = runs["plugin"][0][0]
    ours, ref = r0["losses"], r0["reference_losses"]
    assert len(ours) == len(ref) == STEPS
    tol = summation_order_tolerance(ref)
    for k, (a, b, t) in enumerate(zip(ours, ref, tol)):
        assert abs(a - b) <= t, (k, a, b, t, ours, ref)
    # the bound is far below what a wrong shard would show: the loss moves
    # by more than the whole tolerance from step to step
    assert max(tol) < 0.1 * max(abs(x - y) for x, y in zip(ref, ref[1:]))
    assert ref[-1] < ref[0] and ours[-1] < ours[0]  # it learns


def test_patched_and_builtin_agree(runs):
    """The project's usual float32 agreement of a few training steps
    (tests/test_mlx_lm.py: 1e-4 relative per step) and normwise on every
    final parameter; the two RMSNorms are exact but round differently."""
    ours, builtin = runs["plugin"][0][0], runs["builtin"][0][0]
    for a, b in zip(ours["losses"], builtin["losses"]):
        assert abs(a - b) <= 1e-4 * abs(b), (ours["losses"], builtin["losses"])
    assert ours["params"].keys() == builtin["params"].keys()
    for k, b in builtin["params"].items():
        a = ours["params"][k].astype(np.float64)
        b = b.astype(np.float64)
        assert np.max(np.abs(a - b)) <= 1e-4 * np.max(np.abs(b)), k
