"""The benchmarks' code paths on the CPU: the mlx_rmsnorm.bench package in
quick mode writes CSV, JSON and a plot with sane columns, its contenders
compute what their names say, its repeats are interleaved, its sections come
from the registry and its help speaks to users; examples/bench_train_step.py
trains tiny mlx-lm models with the built-in and the plugin and sees the
plugin's primitives in the patched rounds only. No timing is asserted."""

import csv
import importlib.util
import json
import os
import statistics
import subprocess
import sys

import mlx.core as mx
import pytest
from conftest import TOL, random, rel_err, to_numpy

import mlx_rmsnorm
from mlx_rmsnorm import bench
from mlx_rmsnorm.bench import cli, core, registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_STEP = os.path.join(ROOT, "examples", "bench_train_step.py")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    assert bench.main(["--quick", "--out", str(out)]) == 0
    return out


def test_quick_run_writes_csv_json_png(quick_run):
    base = os.path.join(quick_run, "bench_bfloat16")
    with open(base + ".csv") as f:
        rows = list(csv.DictReader(f))
    with open(base + ".json") as f:
        data = json.load(f)
    with open(base + ".png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert data["sections"] == bench.SECTIONS and len(data["rows"]) == len(rows)
    expected = {(k, "x".join(map(str, s))) for k, s in bench.cases(bench.SECTIONS, quick=True)}
    assert {(r["kind"], r["shape"]) for r in rows} == expected
    for r in data["rows"]:
        assert len(r["samples_us"]) == r["repeats"] == data["repeats"]
        assert r["us_min"] <= r["us_q1"] <= r["us"] <= r["us_q3"] <= r["us_max"]
        assert r["us"] == statistics.median(r["samples_us"])
        assert r["us_single_min"] <= r["us_single"] <= r["us_single_max"]
        assert r["timing"] == ("build+eval" if r["kind"] == "decode" else "eval")
        assert r["pct_ceiling_min"] <= r["pct_ceiling_max"]
        if r["impl"].startswith("ceiling"):
            assert r["pct_ceiling"] == pytest.approx(100)
        else:
            assert r["pct_ceiling"] == pytest.approx(100 * r["ceiling_us"] / r["us"])
            assert r["speedup_min"] <= r["speedup_max"]


ON_CPU = not (mx.is_available(mx.gpu) and mlx_rmsnorm.has_cuda_kernels())


@pytest.mark.skipif(not ON_CPU, reason="the CPU default")
def test_no_arguments_on_a_cpu_run_the_quick_cases_and_say_so(tmp_path, capsys):
    assert bench.main(["--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    first = out.splitlines()[0]
    assert first.startswith("CPU run: the quick cases (11 tiny shapes") and "--full" in first
    with open(tmp_path / "bench_bfloat16.json") as f:
        data = json.load(f)
    assert data["quick"] is True and data["repeats"] == 3
    assert {(r["kind"], r["shape"]) for r in data["rows"]} == {
        (k, "x".join(map(str, s))) for k, s in bench.cases(bench.SECTIONS, quick=True)}
    # a readable device name in the JSON and the plot title, not DeviceType.cpu
    assert data["device"].startswith("CPU (") and "DeviceType" not in out + data["device"]
    # the progress bar moved through every round of every case (tqdm, stderr)
    total = 11 * (3 + 1)  # cases x (repeats + the warm-up round)
    assert f"{total}/{total}" in err and "case 11/11: decode 1x8x128" in err
    # the CPU path has one backward algorithm: no naive row beside auto
    assert not any(r["impl"] == "ours naive" for r in data["rows"])
    assert any(r["impl"] == "ours auto" for r in data["rows"])


def test_progress_moves_every_round(monkeypatch):
    rounds = []
    sets = [(mx.zeros((2,)), mx.zeros((2,)))]
    core.time_interleaved([lambda x, g: x] * 3, sets, calls=1, repeats=4, singles=0,
                           on_round=lambda: rounds.append(1))
    assert len(rounds) == 5  # the warm-up round and 4 timed ones


def test_naive_row_only_on_the_gpu():
    w = mx.ones((8,))
    assert ("bwd", "ours naive") in {(d, i) for d, i, _ in bench.contenders("table", w, gpu=True)}
    assert ("bwd", "ours naive") not in {(d, i) for d, i, _ in bench.contenders("table", w, gpu=False)}


def test_help_speaks_to_users(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    # every section is listed with what it times, the defaults marked
    for name, spec in registry.SECTION_SPECS.items():
        line = next(l.strip() for l in text.splitlines() if l.strip().split(" ")[0] in (name, name + "*"))
        assert line[len(name):].lstrip().startswith("*") == spec.default, line
    for flag in ("--quick", "--full", "--training", "--no-sweep", "--sections", "--shapes",
                 "--dtype", "--calls", "--repeats", "--singles", "--out", "--generate", "--fused"):
        assert flag in text
    # no words of the code's insides (a newcomer has no "seed" either)
    for word in ("SECTION_SPECS", "functions below", "seed"):
        assert word not in text, word


def test_a_section_is_a_module_and_a_line():
    """The registry gathers the SECTIONS of the modules it names, in order,
    and a run's sections, tables and plot follow that order."""
    import importlib

    gathered = {}
    for name in registry.MODULES:
        gathered.update(importlib.import_module(f"mlx_rmsnorm.bench.{name}").SECTIONS)
    assert list(registry.SECTION_SPECS) == list(gathered)
    assert list(registry.SECTION_SPECS)[:4] == ["table", "sweep", "training", "decode"]
    assert bench.SECTIONS == ["table", "sweep", "training", "decode"]
    assert {"ln_training", "ln_table"} <= set(registry.SECTION_SPECS) - set(bench.SECTIONS)
    assert all(isinstance(s, core.Section) and s.about for s in registry.SECTION_SPECS.values())


def test_every_shape_has_ours_builtin_and_ceiling(quick_run):
    with open(os.path.join(quick_run, "bench_bfloat16.json")) as f:
        rows = json.load(f)["rows"]
    directions = {"table": {"fwd", "bwd"}, "sweep": {"fwd", "bwd"}, "decode": {"fwd"},
                  "training": {"fwd", "bwd", "bwd_gx"}}
    for kind, shape in bench.cases(bench.SECTIONS, quick=True):
        label = "x".join(map(str, shape))
        mine = [r for r in rows if (r["kind"], r["shape"]) == (kind, label)]
        assert {r["direction"] for r in mine} == directions[kind]
        for d in directions[kind]:
            impls = {r["impl"] for r in mine if r["direction"] == d}
            assert "mx.fast" in impls and any(i.startswith("ours") for i in impls)
            b = next(r for r in mine if r["direction"] == d and r["impl"] == "mx.fast")
            ours = [r for r in mine if r["direction"] == d and r["impl"].startswith("ours")]
            for o in ours:
                assert o["speedup_vs_builtin"] == pytest.approx(b["us"] / o["us"])
                assert o["ceiling_us"] == b["ceiling_us"]


@pytest.mark.parametrize("argv, sections, suffix", [
    (["--training"], ["training", "decode"], "_training-decode"),
    (["--no-sweep"], ["table"], "_table"),
    (["--sections", "decode"], ["decode"], "_decode"),
])
def test_modes_pick_their_sections(tmp_path, argv, sections, suffix):
    assert bench.main(argv + ["--quick", "--repeats", "2", "--out", str(tmp_path)]) == 0
    base = os.path.join(tmp_path, "bench_bfloat16" + suffix)
    with open(base + ".json") as f:
        data = json.load(f)
    assert data["sections"] == sections
    assert {r["kind"] for r in data["rows"]} == set(sections)
    assert os.path.getsize(base + ".png") > 0 and os.path.getsize(base + ".csv") > 0


def test_full_run_covers_the_training_and_decode_shapes():
    cases = bench.cases(["training", "decode"], quick=False)
    training = {s for k, s in cases if k == "training"}
    assert {(m, n) for m in (4096, 8192, 16384, 32768)
            for n in (896, 1024, 2048, 2560, 3584, 4096, 5120, 8192)} <= training
    assert {(m, n) for m in (65536, 131072, 262144) for n in (64, 128, 256)} <= training
    assert len(training) == 41
    decode = {s for k, s in cases if k == "decode"}
    assert {(r, n) for r in (1, 8, 64) for n in (1024, 2048, 4096, 8192)} <= decode
    assert {(r, h, 128) for r in (1, 8, 64) for h in (8, 32)} <= decode
    assert [k for k, _ in bench.cases(bench.SECTIONS, quick=False)].count("table") == 9


def test_shapes_option_replaces_every_sections_shapes(tmp_path):
    assert cli.parse_shapes("8192x4096, 1x8x128") == [(8192, 4096), (1, 8, 128)]
    for bad in ("8192", "0x128", "ax4", ""):
        with pytest.raises(SystemExit, match="--shapes"):
            cli.parse_shapes(bad)
    assert bench.cases(["training", "decode"], quick=False, shapes=[(64, 256)]) == [
        ("training", (64, 256)), ("decode", (64, 256))]
    assert bench.main(["--sections", "training", "--shapes", "32x96", "--repeats", "1",
                       "--calls", "2", "--singles", "1", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "bench_bfloat16_training.json") as f:
        rows = json.load(f)["rows"]
    assert {r["shape"] for r in rows} == {"32x96"}


@pytest.mark.parametrize("kind", ["table", "training", "decode"])
def test_contenders_compute_what_they_are_named(kind):
    """A benchmark that timed the wrong computation would be worse than none:
    each contender against the float64-backed built-in of its direction."""
    dtype = mx.float32
    x, g = random((24, 96), dtype, 1), random((24, 96), dtype, 2)
    w = random((96,), dtype, 3, scale=0.1, offset=1.0)
    y_ref = mx.fast.rms_norm(x, w, core.EPS)
    gx_ref, gw_ref = mx.vjp(lambda x, w: mx.fast.rms_norm(x, w, core.EPS), [x, w], [g])[1]
    with mx.stream(mx.cpu):
        for direction, impl, fn in bench.contenders(kind, w):
            out = fn(x, g)
            if impl.startswith("ceiling"):
                ref = -x if direction == "fwd" else x + g
                assert mx.array_equal(out, ref), (direction, impl)
            elif direction == "fwd":
                assert rel_err(out, to_numpy(y_ref)) <= TOL[dtype], impl
            elif direction == "bwd":
                gx, gw = out
                assert rel_err(gx, to_numpy(gx_ref)) <= TOL[dtype], impl
                assert rel_err(gw, to_numpy(gw_ref)) <= TOL[dtype], impl
            else:  # gx only: the weight is not differentiated
                assert direction == "bwd_gx" and len(out) == 1
                assert rel_err(out[0], to_numpy(gx_ref)) <= TOL[dtype], impl
    names = {(d, i) for d, i, _ in bench.contenders(kind, w)}
    assert ("fwd", "mx.fast") in names and ("fwd", "ceiling (-x)") in names


def test_ours_is_reached_through_mx_vjp_in_training():
    """The training section times what mx.grad runs: the plugin's forward
    primitive differentiated by MLX, not rms_norm_vjp called directly."""
    from conftest import graph_text

    x, g = random((8, 32), mx.float32, 1), random((8, 32), mx.float32, 2)
    w = mx.ones((32,))
    figs = {(d, i): f for d, i, f in bench.contenders("training", w)}
    for d in ("bwd", "bwd_gx"):
        text = graph_text(figs[d, "ours"](x, g)[0])
        assert "RMSNormPluginVJP" in text
        assert "RMSNormPlugin" not in graph_text(figs[d, "mx.fast"](x, g)[0])
        # the built-in column stays MLX's own under patch() too
        with mlx_rmsnorm.patched():
            assert "RMSNormPlugin" not in graph_text(figs[d, "mx.fast"](x, g)[0])
            assert "RMSNormPlugin" not in graph_text(figs["fwd", "mx.fast"](x, g))


def test_repeats_are_interleaved_round_robin():
    calls = []

    def figure(name):
        def fn(x, g):
            calls.append(name)
            return x
        return fn

    sets = [(mx.zeros((2,)), mx.zeros((2,)))]
    samples = core.time_interleaved([figure(n) for n in "abc"], sets, calls=2, repeats=3, singles=1)
    # per round: each figure's many-calls sample (2 calls), then one single each
    rounds = [calls[i:i + 9] for i in range(0, len(calls), 9)]
    assert len(rounds) == 4  # warm-up + 3
    for r, seq in enumerate(rounds):
        order = [("abc" * 2)[(r + j) % 3] for j in range(3)]
        assert seq == [n for n in order for _ in range(2)] + order
    for s in samples.values():  # the warm-up round is dropped
        assert len(s["many"]) == len(s["build"]) == 3 and len(s["single"]) == 3


def test_chained_calls_take_the_previous_output_as_x():
    """--chain: call i + 1's x is call i's output of x's shape and dtype (here
    the second of two), g rotates over the sets as without the chain; an
    unchained eval hands every call its set's own x."""
    seen = []

    def fn(x, g):
        seen.append((x, g))
        return [mx.zeros((3,)), x + g]  # a gw-like output first, then "gx"

    sets = [(mx.array([1.0, 2.0]), mx.array([10.0, 10.0])), (mx.array([5.0, 5.0]), mx.array([1.0, 1.0]))]
    core.sample_many(fn, sets, calls=4, chain=True)
    xs = [x.tolist() for x, _ in seen]
    assert xs == [[1.0, 2.0], [11.0, 12.0], [12.0, 13.0], [22.0, 23.0]]
    assert [g.tolist() for _, g in seen] == [s[1].tolist() for s in sets + sets]
    seen.clear()
    core.sample_many(fn, sets, calls=4)
    assert [x.tolist() for x, _ in seen] == [s[0].tolist() for s in sets + sets]
    with pytest.raises(ValueError, match="chained figure"):
        core.sample_many(lambda x, g: x.sum(), sets, calls=2, chain=True)
    assert core.per_eval(20, True) == "20 chained calls per eval"


def test_stats_of_known_values():
    st = core.stats([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (st["med"], st["min"], st["max"], st["q1"], st["q3"]) == (3.0, 1.0, 5.0, 2.0, 4.0)


# ------------------------------------------------------------- train step

@pytest.fixture(scope="module")
def train_step():
    pytest.importorskip("mlx_lm")
    spec = importlib.util.spec_from_file_location("bench_train_step", TRAIN_STEP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_step_quick_run(tmp_path, train_step):
    """The whole script, as the GPU run calls it, at --quick size (Qwen3 with
    QK-norm: 2 layers x 4 norms + the final one), both norm modes."""
    out = tmp_path / "train.json"
    # as a user runs it: without the suite's CPU routing and fuse row limit
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLX_RMSNORM_ROUTE_CPU", "MLX_RMSNORM_FUSE_MIN_ROWS")}
    proc = subprocess.run([sys.executable, TRAIN_STEP, "--quick", "--model", "qwen3-0.6b",
                           "--json", str(out)], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "speedup built-in / plugin" in proc.stdout
    # a bar per case that moves every round (2 rounds x each variant), on stderr
    rounds = 2 * len(train_step.VARIANTS)
    assert "qwen3-0.6b, norms frozen" in proc.stderr and f"{rounds}/{rounds}" in proc.stderr
    results = json.loads(out.read_text())["results"]
    assert [r["norms"] for r in results] == ["trained", "frozen"]
    for r in results:
        assert r["norm_calls"] == 9
        fwd, bwd = r["plugin_nodes"]["mlx_rmsnorm"]
        assert fwd >= 9 and bwd >= 9
        assert r["plugin_nodes"]["mx.fast"] == [0, 0]
        assert min(r["plugin_nodes"]["fuse"]) >= 9  # fused add + norm counted
        assert len(r["round_ms"]["mx.fast"]) == len(r["round_ms"]["mlx_rmsnorm"]) == 2
        assert len(r["speedup"]) == 2 and all(s > 0 for s in r["speedup"])
        assert r["norm_ms"]["mlx_rmsnorm"] > 0 and r["norm_ms"]["mx.fast"] > 0


def test_compiled_step_keeps_the_norm_it_was_traced_with(train_step):
    """Why the script builds a step function per variant: mx.compile caches the
    traced graph, so patching after the first call changes nothing, and the
    graph check catches a round that would time the wrong norm."""
    model, _ = train_step.build_model("qwen3-0.6b", 97, quick=True, frozen=False)
    opt = train_step.optim.AdamW(learning_rate=1e-5)
    opt.init(model.trainable_parameters())
    x = mx.random.randint(0, 97, (2, 9), key=mx.random.key(0))
    n_norms = len(train_step.record_norm_calls(model, x[:, :-1]))
    assert n_norms == 9
    try:
        mlx_rmsnorm.unpatch()
        step, state = train_step.make_step(model, opt)
        mx.eval(step(x[:, :-1], x[:, 1:]), state)
        mlx_rmsnorm.patch()
        step(x[:, :-1], x[:, 1:])
        with pytest.raises(SystemExit, match="RMSNormPluginVJP"):
            train_step.check_graph(model, plugin=True, n_norms=n_norms)
        mx.eval(state)
        fresh, state = train_step.make_step(model, opt)  # traced under the patch
        fresh(x[:, :-1], x[:, 1:])
        fwd, bwd = train_step.check_graph(model, plugin=True, n_norms=n_norms)
        assert fwd >= n_norms and bwd >= n_norms
        mx.eval(state)
    finally:
        mlx_rmsnorm.unpatch()


@pytest.mark.parametrize("op", ["RMSNorm", "LayerNorm"])
def test_fused_contenders_compute_what_they_are_named(op):
    """bench --fused: every contender of each op against MLX's own composition
    (x + r, then mx.fast's norm, differentiated by mx.vjp)."""
    from mlx_rmsnorm.bench import fused

    dtype = mx.float32
    x, r, gy, gh = (random((24, 96), dtype, s) for s in (1, 2, 3, 4))
    w = random((96,), dtype, 5, scale=0.1, offset=1.0)
    b = (0.1 * (w - 1)).astype(dtype)  # the bias fused_contenders makes
    params = [w, b] if op == "LayerNorm" else [w]
    norm = mx.fast.layer_norm if op == "LayerNorm" else mx.fast.rms_norm
    h = x + r
    y_ref = norm(h, *params, core.EPS)
    grads = mx.vjp(lambda h, *p: norm(h, *p, core.EPS), [h, *params], [gy])[1]
    ref_bwd = [grads[0] + gh, *grads[1:]]
    with mx.stream(mx.cpu):
        figs = fused.fused_contenders(w, op)
        for direction, impl, fn in figs:
            if impl.startswith("copy"):
                continue
            if direction == "fwd":
                y, h_out = fn(x, r, None)
                assert mx.array_equal(h_out, h), impl
                assert rel_err(y, to_numpy(y_ref)) <= TOL[dtype], impl
            else:
                out = [a for a in fn(h, gy, gh) if a is not None]
                assert len(out) == len(ref_bwd), impl
                for a, ref in zip(out, ref_bwd):
                    assert rel_err(a, to_numpy(ref)) <= TOL[dtype], impl
    assert {i for _, i, _ in figs} >= {"fused", fused.FUSED_BASELINE, "MLX add + our norm"}


def test_layer_norm_sections_show_our_rms_norm_beside_ours(tmp_path, capsys):
    """LayerNorm moves what RMSNorm moves: its tables carry our RMSNorm on the
    same tensors and ours / it."""
    assert bench.main(["--sections", "ln_table", "--quick", "--repeats", "1", "--calls", "2",
                       "--singles", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "our RMSNorm" in out and "/ RMS" in out
    with open(tmp_path / "bench_bfloat16_ln_table.json") as f:
        rows = json.load(f)["rows"]
    for direction in ("fwd", "bwd", "bwd_gx"):
        assert {r["impl"] for r in rows if r["direction"] == direction} >= {"ours", core.OUR_RMS_NORM}


def test_large_n_contenders_compute_what_they_are_named():
    """bench --large-n: every op and direction, ours and the built-in beside
    it, against mx.fast's own composition (x + r first for the add ops,
    mx.vjp for the backward)."""
    from mlx_rmsnorm.bench import large_n

    dtype = mx.float32
    x, g = random((16, 160), dtype, 1), random((16, 160), dtype, 2)
    w = random((160,), dtype, 3, scale=0.1, offset=1.0)
    b = (0.1 * (w - 1)).astype(dtype)  # the bias large_n.contenders makes
    refs = {"rms_norm": (mx.fast.rms_norm, [w]), "layer_norm": (mx.fast.layer_norm, [w, b])}
    with mx.stream(mx.cpu):
        figs = large_n.contenders(w)
        theirs = large_n.builtins(w)
        every = {(op, d) for op in large_n.OPS for d in ("fwd", "bwd")}
        assert {(op, d) for op, d, _ in figs} >= every and {(op, d) for op, d, _ in theirs} == every
        for op, direction, fn in figs + theirs:
            if op.startswith("ceiling"):
                continue
            norm, params = refs[op.removeprefix("add_")]
            if direction == "fwd" and op.startswith("add_"):  # (y, h): h = x + r, r = g
                y, h = fn(x, g)
                assert mx.array_equal(h, x + g), op
                assert rel_err(y, to_numpy(norm(x + g, *params, core.EPS))) <= TOL[dtype], op
            elif direction == "fwd":
                assert rel_err(fn(x, g), to_numpy(norm(x, *params, core.EPS))) <= TOL[dtype], op
            else:  # add ops: h = x, g_y = g, g_h = x; gx = norm's gx + g_h
                grads = mx.vjp(lambda h, *p: norm(h, *p, core.EPS), [x, *params], [g])[1]
                if op.startswith("add_"):
                    grads = [grads[0] + x, *grads[1:]]
                out = [a for a in fn(x, g) if a is not None]
                assert len(out) == len(grads), op
                for a, ref in zip(out, grads):
                    assert rel_err(a, to_numpy(ref)) <= TOL[dtype], op


def test_large_n_prints_a_line_per_shape_op_and_direction(tmp_path, capsys):
    """The log's lines carry MxN, the op, the direction and NN% (one row per
    line); QuACK's H200 figure only where it was measured (bf16 table shapes)."""
    import re

    from mlx_rmsnorm.bench import large_n

    assert bench.main(["--sections", "large-n", "--quick", "--repeats", "1", "--calls", "2",
                       "--singles", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    line = re.compile(r"^\s*(\d+)x(\d+)\s+(\w+)\s+(fwd|bwd)\s+ours .* (\d+)%")
    seen = {(m.group(1, 2), m.group(3), m.group(4)) for m in map(line.match, out.splitlines()) if m}
    shapes = {(str(m), str(n)) for m, n in large_n.QUICK}
    assert seen == {(s, op, d) for s in shapes for op in large_n.OPS for d in ("fwd", "bwd")}
    rows_text = [ln for ln in out.splitlines() if line.match(ln)]
    assert not any("QuACK" in ln for ln in rows_text)  # the quick shapes are not QuACK's
    with open(tmp_path / "bench_bfloat16_large-n.json") as f:
        rows = json.load(f)["rows"]
    for r in rows:
        assert r["ceiling_us"] > 0 and r["pct_ceiling"] == pytest.approx(100 * r["ceiling_us"] / r["us"])
        assert r["builtin_us"] > 0 and r["x_builtin_min"] <= r["x_builtin"] <= r["x_builtin_max"]
    assert all("built-in" in ln for ln in rows_text)
    assert large_n.quack_us((4096, 32768), "rms_norm", "bwd") == 354
    assert large_n.quack_us((8192, 16384), "layer_norm", "fwd") is None  # not measured
    assert large_n.quack_us((4096, 32768), "add_rms_norm", "fwd") is None


def test_large_n_ratio_to_quack_only_on_the_gpu_it_was_measured_on():
    """QuACK's figures are an H200's: another GPU's line prints them without
    an ours / QuACK ratio."""
    from mlx_rmsnorm.bench import large_n

    r = {"shape": "4096x32768", "op": "rms_norm", "direction": "bwd", "us": 300.0, "us_min": 290.0,
         "us_max": 310.0, "ceiling_us": 270.0, "pct_ceiling": 90.0, "builtin_us": 600.0,
         "x_builtin": 2.0, "quack_us": 354}
    assert "ours/QuACK 0.85" in large_n.format_row(r, on_h200=True)
    other = large_n.format_row(r, on_h200=False)
    assert "QuACK  354 us" in other and "ours/QuACK" not in other and "no ratio" in other


def test_large_n_takes_quack_figures_of_this_gpu_from_lab_peers(tmp_path):
    """lab.peers' JSON of this GPU gives QuACK's figure and the ratio on every
    GPU; a file of another GPU is not used (the H200 table stays)."""
    from mlx_rmsnorm.bench import large_n

    path = tmp_path / "peers.json"
    fig = lambda us: {"us": us, "us_min": us - 1, "us_max": us + 1}  # noqa: E731
    path.write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "figures": {"4096x32768": {
        "copy fwd": fig(170.0), "copy bwd": fig(250.0), "rms_norm fwd": fig(180.0),
        "rms_norm bwd": fig(400.0), "layer_norm fwd": fig(300.0), "layer_norm bwd": fig(500.0)}}}))
    assert large_n.peers_here(str(path), "NVIDIA H200") is None
    peers = large_n.peers_here(str(path), "NVIDIA H100 80GB HBM3")
    assert peers == {(4096, 32768): {("rms_norm", "fwd"): 180.0, ("rms_norm", "bwd"): 400.0,
                                     ("layer_norm", "fwd"): 300.0, ("layer_norm", "bwd"): 500.0}}
    here = large_n.quack_of((4096, 32768), "rms_norm", "bwd", mx.bfloat16, peers)
    assert here == {"quack_us": 400.0, "quack_here": True}
    # a shape the file lacks falls back to the H200 table; no figure for the add ops
    assert large_n.quack_of((2048, 65536), "rms_norm", "bwd", mx.bfloat16, peers) == {
        "quack_us": 382, "quack_here": False}
    assert large_n.quack_of((4096, 32768), "add_rms_norm", "bwd", mx.bfloat16, peers)["quack_us"] is None
    assert large_n.quack_of((4096, 32768), "rms_norm", "bwd", mx.float16, peers)["quack_us"] is None
    r = {"shape": "4096x32768", "op": "rms_norm", "direction": "bwd", "us": 300.0, "us_min": 290.0,
         "us_max": 310.0, "ceiling_us": 270.0, "pct_ceiling": 90.0, "builtin_us": 600.0,
         "x_builtin": 2.0, **here}
    line = large_n.format_row(r, on_h200=False)
    assert "QuACK  400.0 us (torch, this GPU; ours/QuACK 0.75)" in line
