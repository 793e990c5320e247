"""`python -m mlx_rmsnorm ...` runs another program with the plugin patched
in: a script, a module, and a real mlx-lm entry point (`mlx_lm lora` on a
tiny random Llama saved with its tokenizer). The report counts the RMSNorm
primitives in the gradient graphs: ours with the wrapper, none without it
(so the count can tell them apart)."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

REPORT = re.compile(
    r"mlx_rmsnorm report: patched=(\w+) gradient_graphs=(\d+) RMSNormPlugin=(\d+) "
    r"RMSNormPluginVJP=(\d+) builtin_RMSNorm=(\d+) builtin_RMSNormVJP=(\d+)")


def run(args, cwd, env_extra=None, timeout=600):
    # The suite's MLX_RMSNORM_ROUTE_CPU (conftest) stays: on a CPU stream
    # patch() runs MLX's own norm without it, and there is nothing to count.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MLX_RMSNORM_") or k == "MLX_RMSNORM_ROUTE_CPU"}
    # One GPU for the child: with two visible, `mlx_lm lora` itself fails
    # (cudaMemcpy(...) failed: invalid argument in mx.array(batch), MLX 0.32.4
    # and mlx-lm 0.32.2 on a 2-GPU H200 machine, with or without the plugin);
    # CUDA_VISIBLE_DEVICES=0 fixes it. A value the caller set is kept.
    env.setdefault("CUDA_VISIBLE_DEVICES", "0")
    env.update(env_extra or {})
    env["PYTHONPATH"] = str(cwd)
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                       cwd=cwd, env=env, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def report(r):
    m = REPORT.search(r.stderr)
    assert m, r.stderr[-2000:]
    patched, *counts = m.groups()
    return patched == "True", dict(zip(
        ["graphs", "plugin", "plugin_vjp", "builtin", "builtin_vjp"], map(int, counts)))


TRAIN = textwrap.dedent("""
    import sys
    import mlx.core as mx, mlx.nn as nn
    model = nn.Sequential(nn.Linear(8, 16), nn.RMSNorm(16), nn.Linear(16, 1))
    loss = lambda m, x: m(x).square().mean()
    step = nn.value_and_grad(model, loss)
    for _ in range(2):
        l, g = step(model, mx.random.normal((4, 8)))
        mx.eval(l, g)
    print("args", sys.argv[1:], "patched", mx.fast.rms_norm.__module__ != "mlx.core.fast"
          and "mlx_rmsnorm" in sys.modules and sys.modules["mlx_rmsnorm"].is_patched())
""")


def test_script(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    r = run(["-m", "mlx_rmsnorm", "--report", "train.py", "a", "--b"], tmp_path)
    assert "args ['a', '--b'] patched True" in r.stdout
    patched, c = report(r)
    assert patched and c["graphs"] == 2
    assert c["plugin"] == 2 and c["plugin_vjp"] == 2 and c["builtin"] == c["builtin_vjp"] == 0


@pytest.mark.parametrize("form", [["-m", "trainmod"], ["trainmod"]])
def test_module(tmp_path, form):
    (tmp_path / "trainmod.py").write_text(TRAIN)
    r = run(["-m", "mlx_rmsnorm", "--report", *form, "x"], tmp_path)
    assert "args ['x'] patched True" in r.stdout
    _, c = report(r)
    assert c["plugin_vjp"] == 2 and c["builtin"] == 0


def test_without_wrapper_the_report_sees_the_builtin(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    # The variable alone, as the README has it: the .pth installed beside
    # the package (./run.sh writes it for its editable install too) imports
    # mlx_rmsnorm at start-up, which installs the report; nothing patches.
    r = run(["train.py"], tmp_path, {"MLX_RMSNORM_REPORT": "1"})
    pth_here = any(os.path.isfile(os.path.join(d, "mlx_rmsnorm_autopatch.pth")) for d in sys.path)
    if pth_here:
        assert "patched False" in r.stdout
        patched, c = report(r)
        assert not patched and c["graphs"] == 2 and c["plugin"] == c["plugin_vjp"] == 0
    r = run(["-c", "import mlx_rmsnorm; exec(open('train.py').read())"], tmp_path,
            {"MLX_RMSNORM_REPORT": "1"})
    patched, c = report(r)
    assert not patched and c["graphs"] == 2 and c["plugin"] == c["plugin_vjp"] == 0
    # The built-in is one primitive on the GPU; on the CPU MLX expands it
    # into elementary ops, which the report does not name.
    import mlx.core as mx

    if mx.default_device() == mx.gpu:
        assert c["builtin"] == 2 and c["builtin_vjp"] == 2


def test_env_var_patches_at_import(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    r = run(["-c", "import mlx_rmsnorm; exec(open('train.py').read())"], tmp_path,
            {"MLX_RMSNORM_PATCH": "1", "MLX_RMSNORM_REPORT": "1"})
    patched, c = report(r)
    assert patched and c["plugin_vjp"] == 2 and c["builtin_vjp"] == 0


def test_children_see_one_gpu(tmp_path, monkeypatch):
    # run() pins the child processes (mlx_lm among them) to one device unless
    # the caller chose one; see run() for why.
    show = ["-c", "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'))"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert run(show, tmp_path).stdout.split() == ["0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert run(show, tmp_path).stdout.split() == ["1"]


def test_usage_errors(tmp_path):
    # The suite's MLX_RMSNORM_ROUTE_CPU (conftest) stays: on a CPU stream
    # patch() runs MLX's own norm without it, and there is nothing to count.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MLX_RMSNORM_") or k == "MLX_RMSNORM_ROUTE_CPU"}
    for args in ([], ["--bogus", "x"], ["-m"]):
        r = subprocess.run([sys.executable, "-m", "mlx_rmsnorm", *args], capture_output=True,
                           text=True, env=env, cwd=tmp_path)
        assert r.returncode == 2 and "usage: python -m mlx_rmsnorm" in r.stderr


def make_tiny_llama(path):
    """A random 2-layer Llama with a character tokenizer, as `mlx_lm` loads
    a checkpoint folder (config.json, model.safetensors, tokenizer files)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama
    from tokenizers import Tokenizer, models, pre_tokenizers

    chars = "abcdefghijklmnopqrstuvwxyz ."
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    config = dict(model_type="llama", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                  num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5,
                  vocab_size=len(vocab), tie_word_embeddings=True)
    (path / "config.json").write_text(json.dumps(config))
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs(**config))
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    data = path / "data"
    data.mkdir()
    for split in ("train", "valid"):
        line = json.dumps({"text": "the quick brown fox jumps over the lazy dog."})
        (data / f"{split}.jsonl").write_text((line + "\n") * 4)


def test_mlx_lm_lora_through_the_wrapper(tmp_path):
    pytest.importorskip("mlx_lm")
    pytest.importorskip("tokenizers")
    model = tmp_path / "model"
    model.mkdir()
    make_tiny_llama(model)
    r = run(["-m", "mlx_rmsnorm", "--report", "mlx_lm", "lora", "--model", str(model), "--train",
             "--data", str(model / "data"), "--iters", "2", "--batch-size", "2", "--num-layers", "1",
             "--steps-per-report", "1", "--steps-per-eval", "100", "--val-batches", "1",
             "--adapter-path", str(tmp_path / "adapters")], tmp_path, {"NO_COLOR": "1"})
    assert (tmp_path / "adapters" / "adapters.safetensors").is_file()  # it really trained
    patched, c = report(r)
    # The LoRA gradient flows back through the final norm and the top layer's
    # two norms: our backward primitive there, no built-in primitive anywhere.
    assert patched and c["graphs"] >= 1
    assert c["plugin"] > 0 and c["plugin_vjp"] > 0
    assert c["builtin"] == 0 and c["builtin_vjp"] == 0


def test_help_lists_every_fused_architecture():
    import mlx_rmsnorm

    r = subprocess.run([sys.executable, "-m", "mlx_rmsnorm", "--help"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "usage" not in r.stderr
    listed = " ".join(r.stdout.split())
    names = mlx_rmsnorm.fused_architectures()
    assert "gpt2" in names and "phimoe" in names  # LayerNorm blocks too, not only RMSNorm ones
    assert ", ".join(names) in listed, r.stdout
