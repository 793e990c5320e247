"""patch(fuse=True)'s contract with the code it replaces: a fused block
computes what the original computes as the original would compute it now,
or the original runs (a wrapper on mx.fast or on a helper
installed after patching, Gemma's 1 + w, float16 Gemma 2); the rewrite is
installed when mlx-lm's model modules are imported; without mlx-lm a
warning; _fuse's state set through its functions."""

import contextlib
import os
import subprocess
import sys

import mlx.core as mx
import pytest

import mlx_rmsnorm
from mlx_rmsnorm import _fuse
from mlx_rmsnorm._autopatch import primitive_counts

pytest.importorskip("mlx_lm.models")
from mlx_lm.models import gemma3_text  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from lab.tiny import LAYER_NORM, make, patched_and_fused, tokens  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GEMMA = ["gemma", "gemma2", "gemma3_text"]


@pytest.fixture(autouse=True)
def _restore():
    _fuse.reset_counts()
    rows = _fuse.min_rows()
    yield
    mlx_rmsnorm.unpatch()
    _fuse.set_min_rows(rows)


def close(a, b, rel=2e-5):
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    return float(mx.abs(a - b).max()) <= rel * float(mx.abs(b).max())


def _scaling(inner, calls):
    """A wrapper of mx.fast.rms_norm / layer_norm that counts its calls and
    changes the values (so that a call that bypasses it shows)."""

    def wrapper(*args, **kwargs):
        calls.append(1)
        return 1.5 * inner(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def _scaling_on_mx_fast(fn, inner, calls):
    """mx.fast.<fn> is _scaling(inner, calls) inside the block, inner after it."""
    setattr(mx.fast, fn, _scaling(inner, calls))
    try:
        yield
    finally:
        setattr(mx.fast, fn, inner)


@pytest.mark.parametrize("name", ["llama", "gemma", "gemma2", "gemma3_text", "gpt2", "stablelm"])
def test_wrapper_on_mx_fast_after_patch_sees_every_norm_call(name):
    # The original blocks look mx.fast.rms_norm up at every call (through
    # their norms): a wrapper installed after patch(fuse=True) is called for
    # every norm, and the blocks run their own code, as under patch()
    fn = "layer_norm" if name in LAYER_NORM else "rms_norm"
    model = make(name)
    x, _ = tokens()
    calls = []
    with mlx_rmsnorm.patched():
        routed = getattr(mx.fast, fn)
        with _scaling_on_mx_fast(fn, routed, calls):
            want = model(x)
            mx.eval(want)
    every = len(calls)
    assert every > len(model.layers)
    calls.clear()
    mlx_rmsnorm.patch(fuse=True)
    with _scaling_on_mx_fast(fn, routed, calls):
        got = model(x)
        mx.eval(got)
    assert len(calls) == every
    assert mx.array_equal(got, want)
    assert _fuse.counts() == {f"fallback:mx.fast.{fn} replaced": len(model.layers)}
    # patch()'s function back: the blocks fuse again
    _fuse.reset_counts()
    mx.eval(model(x))
    assert _fuse.counts() == {"fused": len(model.layers)}


def test_builtin_on_mx_fast_under_fuse_runs_the_original():
    # mx.fast.rms_norm set back to MLX's own while the rewrite is on: the
    # blocks compute what MLX's own norm computes
    from mlx_rmsnorm import _patching

    model = make("llama")
    x, _ = tokens()
    mlx_rmsnorm.patch(fuse=True)
    try:
        mx.fast.rms_norm = _patching.BUILTIN
        got = model(x)
        mx.eval(got)
    finally:
        mx.fast.rms_norm = _patching.ROUTED_RMS_NORM
    assert _fuse.counts() == {"fallback:mx.fast.rms_norm replaced": len(model.layers)}
    mlx_rmsnorm.unpatch()
    assert mx.array_equal(got, model(x))


def test_clip_residual_replaced_after_patch_is_called(monkeypatch):
    # gemma3_text's block calls its module's clip_residual by name at every
    # call: one replaced after patch(fuse=True) runs (max |fused - unpatched|
    # was 5.4 when the rewrite ignored it)
    model = make("gemma3_text")
    x, _ = tokens()
    real = gemma3_text.clip_residual
    calls = []

    def clip(a, b):
        calls.append(1)
        return real(a, 0.5 * b)

    mlx_rmsnorm.patch(fuse=True)
    monkeypatch.setattr(gemma3_text, "clip_residual", clip)
    got = model(x)
    mx.eval(got)
    assert len(calls) == 2 * len(model.layers)
    assert _fuse.counts() == {"fallback:clip_residual replaced": len(model.layers)}
    mlx_rmsnorm.unpatch()
    with mlx_rmsnorm.patched():
        want = model(x)
    assert mx.array_equal(got, want)


@pytest.mark.parametrize("name", GEMMA)
def test_gemma_prefill_fuses_as_patch_computes_in_bfloat16(name):
    # Gemma's norm scales by 1.0 + weight in the weight's dtype (bf16 here);
    # the fused blocks pass that very sum, so they differ from patch() by the
    # fusion alone (bit for bit on the CPU); the fp32 1 + w did not
    _fuse.set_min_rows(0)
    model = make(name, mx.bfloat16)
    x, _ = tokens()
    want, got = patched_and_fused(model, x)
    assert primitive_counts(got)["AddRMSNormPlugin"] == len(model.layers)
    assert _fuse.counts() == {"fused": len(model.layers)}
    assert close(got, want), float(mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max())


def _generate(model, prompt, steps=8):
    cache = make_prompt_cache(model)
    logits = model(prompt, cache=cache)
    out = [logits[:, -1]]
    for _ in range(steps):
        y = mx.argmax(logits[:, -1], axis=-1)
        logits = model(y[:, None], cache=cache)
        out.append(logits[:, -1])
    return mx.stack(out)



def _generated_patched_and_fused(model, prompt):
    """(want, got): _generate(model, prompt) under patch() and under
    patch(fuse=True), each evaluated inside its block."""
    with mlx_rmsnorm.patched():
        want = _generate(model, prompt)
        mx.eval(want)
    with mlx_rmsnorm.patched(fuse=True):
        got = _generate(model, prompt)
        mx.eval(got)
    return want, got


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("name", GEMMA)
def test_gemma_decode_is_patch_bit_for_bit(name, dtype):
    # Below the row limit (a decode step) a fused model runs what patch()
    # runs: Gemma's norms too (the fp32 1 + w replacement of the norm, not
    # gated by the row limit, made every bf16 step differ)
    _fuse.set_min_rows(_fuse.DEFAULT_MIN_ROWS)
    model = make(name, dtype)
    prompt = tokens()[0][:1]
    want, got = _generated_patched_and_fused(model, prompt)
    assert mx.array_equal(got, want)
    assert set(_fuse.counts()) == {"fallback:few rows (decode)"}


@pytest.mark.parametrize("name", GEMMA)
def test_gemma_fused_prefill_then_decode_is_patch(name):
    # prompt fused (16 rows >= the limit), decode steps not: the whole
    # generation computes what patch()'s does
    _fuse.set_min_rows(16)
    model = make(name, mx.bfloat16)
    prompt = tokens()[0][:1]
    want, got = _generated_patched_and_fused(model, prompt)
    assert _fuse.counts()["fused"] == len(model.layers)
    assert close(got, want)


def test_gemma2_fuses_in_float16():
    # gemma2's adds are plain (no clip_residual, which is gemma3_text's):
    # the fused add rounds h = x + r to float16 as MLX's add does
    model = make("gemma2", mx.float16)
    x, _ = tokens()
    want, got = patched_and_fused(model, x)
    assert _fuse.counts() == {"fused": len(model.layers)}
    assert primitive_counts(got)["AddRMSNormPlugin"] == len(model.layers)
    assert close(got, want)


def test_float16_gemma3_says_clip_residual():
    model = make("gemma3_text", mx.float16)
    x, _ = tokens()
    want, got = patched_and_fused(model, x)
    assert mx.array_equal(got, want)  # its own code, as under patch()
    assert _fuse.counts() == {"fallback:float16 (clip_residual)": len(model.layers)}


# --- installation when the model modules are imported --------------------------------

LAZY = """
import sys
import mlx_rmsnorm
from mlx_rmsnorm import _fuse
def loaded():
    return sorted(m for m in sys.modules if m == "mlx_lm" or m.startswith("mlx_lm."))
def fused(cls):
    return getattr(cls.__dict__["__call__"], "_mlx_rmsnorm_fused", False)
def hooks():
    return [f for f in sys.meta_path if type(f).__module__ == "mlx_rmsnorm._fuse"]
print("START", mlx_rmsnorm.is_fused(), loaded(), len(hooks()))
from mlx_lm.models import llama
print("LLAMA", fused(llama.TransformerBlock), "mlx_lm.models.gpt2" in sys.modules)
from mlx_lm.models import gemma3_text
print("GEMMA3", fused(gemma3_text.TransformerBlock), _fuse.skipped())
mlx_rmsnorm.unpatch()
print("OFF", mlx_rmsnorm.is_fused(), len(hooks()), fused(llama.TransformerBlock),
      llama.TransformerBlock.__call__.__module__)
from mlx_lm.models import gpt2
print("GPT2", fused(gpt2.TransformerBlock))
mlx_rmsnorm.patch(fuse=True)
print("AGAIN", fused(gpt2.TransformerBlock), fused(llama.TransformerBlock), len(hooks()))
"""


def _run(code, **env):
    base = {k: v for k, v in os.environ.items() if k != "MLX_RMSNORM_PATCH"}
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in out.stdout.splitlines() if " " in ln}, out.stderr


def test_fuse_waits_for_the_model_modules():
    # MLX_RMSNORM_PATCH=fuse at interpreter start imports no mlx-lm module
    # (it imported 14, transformers included: 3 s); a model module imported
    # later is rewritten as it is imported; unpatch() removes the hook
    lines, _ = _run(LAZY, MLX_RMSNORM_PATCH="fuse")
    assert lines["START"] == "True [] 1", lines
    assert lines["LLAMA"] == "True False", lines
    assert lines["GEMMA3"] == "True {}", lines
    assert lines["OFF"] == "False 0 False mlx_lm.models.llama", lines
    assert lines["GPT2"] == "False", lines
    assert lines["AGAIN"] == "True True 1", lines


NO_MLX_LM = """
import sys, warnings
sys.modules["mlx_lm"] = None  # as where mlx-lm is not installed
import mlx_rmsnorm
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    mlx_rmsnorm.patch(fuse=True)
    print("STATE", mlx_rmsnorm.is_fused(), mlx_rmsnorm.is_patched())
    mlx_rmsnorm.unpatch()
    with mlx_rmsnorm.patched(fuse=True):
        print("BLOCK", mlx_rmsnorm.is_fused(), mlx_rmsnorm.is_patched())
print("WARNINGS", len(caught), caught[0].category.__name__, caught[0].filename == "<string>")
print("MESSAGE", caught[0].message)
"""


def test_fuse_without_mlx_lm_warns_once():
    lines, _ = _run(NO_MLX_LM)
    assert lines["STATE"] == "False True", lines
    assert lines["BLOCK"] == "False True", lines
    assert lines["WARNINGS"] == "1 RuntimeWarning True", lines
    assert "mlx-lm" in lines["MESSAGE"] and "only the routing" in lines["MESSAGE"], lines


# --- the state, through functions --------------------------------------------------


def test_min_rows_and_route_cpu_are_set_through_functions():
    was = _fuse.set_min_rows(7)
    assert _fuse.min_rows() == 7 and _fuse.set_min_rows(was) == 7 and _fuse.min_rows() == was
    for bad, error in ((-1, ValueError), (1.5, TypeError), (True, TypeError), ("3", TypeError)):
        with pytest.raises(error):
            _fuse.set_min_rows(bad)
    assert _fuse.min_rows() == was
    before = _fuse.set_route_cpu(True)
    assert _fuse.set_route_cpu(before) is True
    with pytest.raises(TypeError):
        _fuse.set_route_cpu(1)
    # route_cpu() sets _fuse's switch beside the extension's
    prev = mlx_rmsnorm.route_cpu(not before)
    try:
        assert _fuse.set_route_cpu(not before) is (not before)
    finally:
        mlx_rmsnorm.route_cpu(prev)
    for name in ("MIN_ROWS", "_min_rows", "_cpu_plugin", "_counts", "_installed"):
        with pytest.raises(AttributeError, match=r"_fuse\.\w+ is not assigned from outside"):
            setattr(_fuse, name, 0)


def test_one_maker_one_spec_per_model_type():
    # every entry is a Block spec; the table is the one list of model types
    assert all(isinstance(spec, _fuse.Block) for spec in _fuse.ARCHITECTURES.values())
    assert mlx_rmsnorm.fused_architectures() == sorted(_fuse.ARCHITECTURES)
    assert _fuse.ARCHITECTURES["mistral"] is _fuse.ARCHITECTURES["llama"]
    assert _fuse.ARCHITECTURES["gemma2"].clip is None
    assert _fuse.ARCHITECTURES["gemma3_text"].clip == "clip_residual"
    for name in ("_pre_norm_block", "_gemma_block", "_gemma2_block", "_layer_norm_block", "_gemma_norm"):
        assert not hasattr(_fuse, name)
