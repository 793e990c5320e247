"""The generation benchmark (python -m mlx_rmsnorm.bench --generate, or
python -m mlx_rmsnorm.bench.generation): its quick mode runs toy mlx-lm
models on the CPU, labels them as toys, writes its CSV, and the greedy token
check fails where the two contenders really disagree."""

import csv
import subprocess
import sys

import pytest

pytest.importorskip("mlx_lm")

from mlx_rmsnorm import bench, is_patched
from mlx_rmsnorm.bench import generation


def test_quick_run_writes_rows(tmp_path, capsys):
    assert bench.main(["--generate", "--quick", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "generate.csv")))
    # toys are called toys: the quick models are not Qwen3-0.6B and Llama-3-8B
    assert [(r["model"], r["phase"]) for r in rows] == [
        (f"{arch} toy, 2 layers, hidden 64", p) for arch in ("qwen3", "llama", "gpt2")
        for p in ("prefill", "decode")]
    for r in rows:
        for key in ("builtin", "ours", "fuse"):
            assert 0 < float(r[f"{key}_min"]) <= float(r[f"{key}_ms"]) <= float(r[f"{key}_max"])
        for key in ("ratio", "fuse_ratio", "fuse_vs_ours"):
            assert float(r[f"{key}_min"]) <= float(r[key]) <= float(r[f"{key}_max"])
        # the per-round ratios are those of the rows' own rounds: their
        # medians sit within the spread of the medians' quotient's factors
        assert float(r["fuse_vs_ours_min"]) <= float(r["ours_max"]) / float(r["fuse_min"])
    out = capsys.readouterr().out
    assert "greedy tokens:" in out and "qwen3 toy, 2 layers, hidden 64 decode" in out
    assert not is_patched()  # the benchmark leaves the process as it found it


def test_token_check():
    ref, margins = [5, 7, 9], [1.0, 0.01, 1.0]
    assert generation.check_tokens(ref, margins, [5, 7, 9], "same") is None
    # parting at a near-tie (margin 0.01) is rounding, and says where
    assert generation.check_tokens(ref, margins, [5, 8, 1], "tie") == 1
    with pytest.raises(SystemExit, match="no tie"):
        generation.check_tokens(ref, margins, [6, 7, 9], "real")


def test_unknown_model():
    with pytest.raises(SystemExit, match="unknown model"):
        generation.main(["--models", "gpt-5", "--quick"])


def test_full_size_labels_are_the_model_names():
    assert generation.label("qwen3-0.6b", quick=False) == "qwen3-0.6b"
    assert generation.label("llama-3-8b", quick=True) == "llama toy, 2 layers, hidden 64"
    assert generation.label("gpt2-medium", quick=True) == "gpt2 toy, 2 layers, hidden 64"


def test_runs_as_a_module(tmp_path):
    """python -m mlx_rmsnorm.bench.generation takes what the old module did."""
    proc = subprocess.run([sys.executable, "-m", "mlx_rmsnorm.bench.generation", "--quick",
                           "--models", "llama-3-8b", "--rounds", "1", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RuntimeWarning" not in proc.stderr
    rows = list(csv.DictReader(open(tmp_path / "generate.csv")))
    assert [r["model"] for r in rows] == ["llama toy, 2 layers, hidden 64"] * 2


def test_turns_orders_the_contenders():
    # every token: a switch before each, the order rotating every token
    assert list(generation.turns("abc", 1, 2, "token")) == [
        (c, True, True) for c in "bcacab"]
    # once a round: a run each (order rotated by the round), the first
    # WARM_TOKENS of a run untimed, one switch at its start
    w = generation.WARM_TOKENS
    got = list(generation.turns("ab", 1, 3, "round"))
    assert got == [(c, i == 0, i >= w) for c in "ba" for i in range(w + 3)]
