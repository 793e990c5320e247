"""The generation benchmark (python -m mlx_rmsnorm.bench --generate): its
quick mode runs tiny mlx-lm models on the CPU, writes its CSV, and the greedy
token check fails where the two contenders really disagree."""

import csv

import pytest

pytest.importorskip("mlx_lm")

from mlx_rmsnorm import bench, bench_generate, is_patched


def test_quick_run_writes_rows(tmp_path, capsys):
    assert bench.main(["--generate", "--quick", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "generate.csv")))
    assert [(r["model"], r["phase"]) for r in rows] == [
        (m, p) for m in bench_generate.MODELS for p in ("prefill", "decode")]
    for r in rows:
        assert 0 < float(r["builtin_min"]) <= float(r["builtin_ms"]) <= float(r["builtin_max"])
        assert 0 < float(r["ours_min"]) <= float(r["ours_ms"]) <= float(r["ours_max"])
        assert float(r["ratio_min"]) <= float(r["ratio"]) <= float(r["ratio_max"])
    out = capsys.readouterr().out
    assert "greedy tokens:" in out and "decode" in out
    assert not is_patched()  # the benchmark leaves the process as it found it


def test_token_check():
    ref, margins = [5, 7, 9], [1.0, 0.01, 1.0]
    assert bench_generate.check_tokens(ref, margins, [5, 7, 9], "same") is None
    # parting at a near-tie (margin 0.01) is rounding, and says where
    assert bench_generate.check_tokens(ref, margins, [5, 8, 1], "tie") == 1
    with pytest.raises(SystemExit, match="no tie"):
        bench_generate.check_tokens(ref, margins, [6, 7, 9], "real")


def test_unknown_model():
    with pytest.raises(SystemExit, match="unknown model"):
        bench_generate.main(["--models", "gpt-5", "--quick"])
