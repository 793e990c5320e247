"""patch(fuse=True) as adversarial users use it: user code between blocks,
norm subclasses, class-level wrappers (before and after patching), mlx-lm's
gradient checkpointing, a changed mlx-lm block, bad switches. Each case
computes what the built-in computes (to rounding) or fails with a message
that names the plugin; the report says which blocks ran fused and why the
others did not."""

import contextlib
import json
import os
import subprocess
import sys
import warnings

import mlx.core as mx
import mlx.nn as nn
import pytest

import mlx_rmsnorm
from mlx_rmsnorm import _fuse

pytest.importorskip("mlx_lm.models")
from mlx_lm.models import gemma, gemma2, gemma3_text, gpt2, llama, stablelm  # noqa: E402
from mlx_lm.tuner.trainer import grad_checkpoint  # noqa: E402
from lab.tiny import (CONFIGS, LAYER_NORM, NORMS, VOCAB, embed, loss_and_grads, make,  # noqa: E402
                      patched_and_fused, tokens)

FUSED = ["llama", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
         "gpt2", "gpt_bigcode", "starcoder2", "gpt_neox", "stablelm", "phimoe"]
# (model, block class) for the class-level cases: an RMSNorm block, a
# LayerNorm one, and stablelm's (mask and cache without defaults)
BLOCKS = [("llama", llama.TransformerBlock), ("gpt2", gpt2.TransformerBlock),
          ("stablelm", stablelm.DecoderLayer)]


@pytest.fixture(autouse=True)
def _restore():
    _fuse.reset_counts()
    yield
    mlx_rmsnorm.unpatch()


def close(a, b, rel=2e-5):
    scale = float(mx.abs(b).max())
    return float(mx.abs(a - b).max()) <= rel * scale


def steer(model, x, delta=100.0):
    """A custom layer loop that edits the residual stream in place between
    blocks (activation steering, interpretability hooks)."""
    h = embed(model)(x)
    mask = nn.MultiHeadAttention.create_additive_causal_mask(h.shape[1]).astype(h.dtype)
    for i, layer in enumerate(model.layers):
        h = layer(h, mask, None)
        if i == 0:
            h += delta  # MLX's += keeps the Python object
    return h


@pytest.mark.parametrize("name", FUSED)
def test_in_place_edit_between_blocks_is_kept(name):
    model = make(name)
    x, _ = tokens()
    want = steer(model, x)
    mx.eval(want)
    mlx_rmsnorm.patch(fuse=True)
    got = steer(model, x)
    assert close(got, want), float(mx.abs(got - want).max())
    assert _fuse.counts()["fused"] == len(model.layers)


class ScaledLayerNorm(nn.LayerNorm):
    def __call__(self, x):
        return 2 * mx.fast.layer_norm(x, self.weight, self.bias, self.eps)


class ScaledNorm(nn.RMSNorm):
    def __call__(self, x):
        return 2 * mx.fast.rms_norm(x, self.weight, self.eps)


class ScaledGemmaNorm(gemma.RMSNorm):
    def __call__(self, x):
        return 2 * mx.fast.rms_norm(x, 1.0 + self.weight, self.eps)


@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("which", ["post", "input"])
def test_norm_subclass_runs_its_own_call(name, which):
    model = make(name)
    layer = model.layers[0]
    attr = NORMS[name][0 if which == "post" else 1]  # the norm the block fuses, or the input norm
    old = getattr(layer, attr)
    cls = ScaledGemmaNorm if name.startswith("gemma") else ScaledLayerNorm if name in LAYER_NORM else ScaledNorm
    new = cls(old.weight.shape[0], eps=old.eps)
    new.weight = old.weight
    if name in LAYER_NORM:
        new.bias = old.bias
    setattr(layer, attr, new)
    x, _ = tokens()
    want = model(x)
    mx.eval(want)
    with mlx_rmsnorm.patched(fuse=True):
        got = model(x)
    assert close(got, want)
    if which == "post":
        assert _fuse.counts() == {"fused": len(model.layers) - 1, "fallback:norm class": 1}
    else:
        assert _fuse.counts() == {"fused": len(model.layers)}


@pytest.mark.parametrize("name,norm", [("llama", nn.RMSNorm), ("gpt2", nn.LayerNorm)])
def test_norm_call_replaced_on_the_class_runs_the_original(name, norm):
    model = make(name)
    x, _ = tokens()
    original = norm.__call__
    norm.__call__ = lambda self, x: 3 * original(self, x)
    try:
        want = model(x)
        mx.eval(want)
        with mlx_rmsnorm.patched(fuse=True):
            got = model(x)
    finally:
        norm.__call__ = original
    assert close(got, want)
    assert _fuse.counts() == {"fallback:norm __call__ replaced": len(model.layers)}


def test_layer_norm_call_wrapped_before_patch_leaves_only_the_layer_norm_blocks():
    # nn.LayerNorm.__call__ not MLX's own at patch time: the LayerNorm entries
    # are not installed (one warning); the RMSNorm ones are
    original = nn.LayerNorm.__call__
    calls = []
    nn.LayerNorm.__call__ = _counting_wrapper(original, calls)
    _fuse._norm_calls.pop("layer", None)  # as in a fresh process: checked at the next install
    try:
        model = make("gpt2")
        x, _ = tokens()
        want = model(x)
        mx.eval(want)
        with pytest.warns(RuntimeWarning, match="mlx.nn.LayerNorm .*wrapped before patch"):
            mlx_rmsnorm.patch(fuse=True)
        assert not getattr(gpt2.TransformerBlock.__dict__["__call__"], "_mlx_rmsnorm_fused", False)
        assert getattr(llama.TransformerBlock.__dict__["__call__"], "_mlx_rmsnorm_fused", False)
        calls.clear()
        got = model(x)
        assert len(calls) == 2 * len(model.layers) + 1 and _fuse.counts() == {}
        assert close(got, want)
    finally:
        mlx_rmsnorm.unpatch()
        nn.LayerNorm.__call__ = original
        _fuse._norm_calls.pop("layer", None)


def _counting_wrapper(fn, calls):
    def wrapper(self, *args, **kwargs):
        calls.append(1)
        return 1.5 * fn(self, *args, **kwargs)

    return wrapper


@pytest.mark.parametrize("name,cls", BLOCKS)
def test_class_wrapper_installed_before_patch_is_respected(name, cls):
    model = make(name)
    x, _ = tokens()
    key = (cls.__module__, cls.__name__, "__call__")
    original = cls.__dict__["__call__"]
    calls = []
    cls.__call__ = _counting_wrapper(original, calls)
    try:
        want = model(x)
        mx.eval(want)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mlx_rmsnorm.patch(fuse=True)
        assert any(f"{cls.__module__}.{cls.__name__}" in str(w.message) for w in caught)
        assert _fuse.skipped()[key].startswith("wrapped")
        calls.clear()
        got = model(x)
        assert len(calls) == 2
        assert close(got, want)
        mlx_rmsnorm.unpatch()
        assert cls.__dict__["__call__"] is not original  # still the user's wrapper
    finally:
        cls.__call__ = original


@pytest.mark.parametrize("name,cls", BLOCKS)
def test_class_wrapper_installed_after_patch_runs_and_survives_unpatch(name, cls):
    model = make(name)
    x, _ = tokens()
    key = (cls.__module__, cls.__name__, "__call__")
    want_plain = model(x)
    mlx_rmsnorm.patch(fuse=True)
    original = cls.__dict__["__call__"]  # our rewrite
    assert getattr(original, "_mlx_rmsnorm_fused", False)
    calls = []
    wrapper = _counting_wrapper(original, calls)
    cls.__call__ = wrapper
    try:
        got = model(x)
        assert len(calls) == 2 and _fuse.counts()["fused"] == 2
        mlx_rmsnorm.unpatch()
        assert cls.__dict__["__call__"] is wrapper  # not removed
        assert not mlx_rmsnorm.is_fused()
        calls.clear()
        _fuse.reset_counts()
        again = model(x)
        assert len(calls) == 2 and _fuse.counts()["fused"] == 0  # inert: the original block
        assert close(got, again)
        # the same values as the wrapper around the original block, unpatched
        cls.__call__ = _counting_wrapper(_fuse._installed[key].original, [])
        mx.eval(want_plain)
        assert mx.array_equal(again, model(x))
        # patching again turns the rewrite under the wrapper back on
        cls.__call__ = wrapper
        mlx_rmsnorm.patch(fuse=True)
        assert mlx_rmsnorm.is_fused()
        _fuse.reset_counts()
        model(x)
        assert _fuse.counts()["fused"] == 2
    finally:
        mlx_rmsnorm.unpatch()
        rec = _fuse._installed.pop(key, None)
        if rec is not None:
            cls.__call__ = rec.original
    assert cls.__dict__["__call__"].__module__ == cls.__module__


@contextlib.contextmanager
def class_call_restored(cls):
    """On exit: unpatch(), forget the rewrite recorded for cls.__call__, and
    put back the __call__ cls has now (tests that wrap a block class)."""
    pristine = cls.__dict__["__call__"]
    try:
        yield
    finally:
        mlx_rmsnorm.unpatch()
        _fuse._installed.pop((cls.__module__, cls.__name__, "__call__"), None)
        cls.__call__ = pristine


@pytest.mark.parametrize("name", ["qwen3", "gpt2", "stablelm"])
@pytest.mark.parametrize("order", ["checkpoint-first", "patch-first"])
def test_grad_checkpoint_keeps_checkpointing(order, name, monkeypatch):
    model = make(name)
    x, y = tokens()
    want_loss, want = loss_and_grads(model, x, y)
    cls = type(model.layers[0])
    calls = []
    real_checkpoint = mx.checkpoint

    def counting_checkpoint(fn):
        calls.append(1)
        return real_checkpoint(fn)

    monkeypatch.setattr(mx, "checkpoint", counting_checkpoint)
    with class_call_restored(cls):
        if order == "checkpoint-first":
            grad_checkpoint(model.layers[0])
            mlx_rmsnorm.patch(fuse=True)
        else:
            mlx_rmsnorm.patch(fuse=True)
            grad_checkpoint(model.layers[0])
        got_loss, got = loss_and_grads(model, x, y)
        assert len(calls) == len(model.layers)  # every block checkpointed
        if order == "patch-first":
            assert _fuse.counts()["fused"] > 0  # fused inside the checkpoint
        else:
            assert _fuse.counts()["fused"] == 0
        assert abs(got_loss.item() - want_loss.item()) <= 1e-5 * abs(want_loss.item())
        for k in want:
            assert close(got[k], want[k], 1e-4), k
        wrapper = cls.__dict__["__call__"]
        mlx_rmsnorm.unpatch()
        assert cls.__dict__["__call__"] is wrapper  # the checkpoint stays
        calls.clear()
        loss_and_grads(model, x, y)
        assert len(calls) == len(model.layers)


CHECKPOINT_PEAKS_SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
import mlx.core as mx
mx.set_default_device(mx.cpu)  # liveness, not the GPU's timing (the test says why)
import mlx_rmsnorm
from mlx_rmsnorm import _fuse
from mlx_lm.tuner.trainer import grad_checkpoint
from lab.tiny import VOCAB, make, peak_mib  # peak_mib: a step's peak, after one untimed step

model = make({name!r})
t = mx.random.randint(0, VOCAB, (16, 129), key=mx.random.key(1))
x, y = t[:, :-1], t[:, 1:]
mlx_rmsnorm.patch(fuse=True)
fused = peak_mib(model, x, y)
grad_checkpoint(model.layers[0])
fused_checkpointed = peak_mib(model, x, y)
n_fused = _fuse.counts()["fused"]
mlx_rmsnorm.unpatch()
mlx_rmsnorm.patch()
checkpointed = peak_mib(model, x, y)
print(json.dumps(dict(fused=fused, fused_checkpointed=fused_checkpointed,
                      checkpointed=checkpointed, n_fused=n_fused)))
"""


@pytest.mark.parametrize("name", ["qwen3", "gpt2"])
def test_grad_checkpoint_with_fuse_saves_the_memory_it_saves_unfused(name, tmp_path):
    # Checkpointing that is silently off shows in peak memory, not in values:
    # a checkpointed step with fusion (fused inside the checkpoint) peaks as
    # the checkpointed step with patch() alone, and below the same step
    # without checkpointing (many rows: activations dominate). Measured on
    # the CPU device, in a process of its own (fused blocks routed there),
    # on any machine: there the peak follows which arrays are alive. On a GPU
    # it also follows how far the host runs ahead of the GPU, since MLX frees
    # a CUDA graph's inputs only when the graph has run: on the H200, gpt2
    # fused and checkpointed peaked at 31.4 MiB in a quiet process
    # (scripts/checkpoint_memory.py, now gone, every node its own graph) and at 40.4
    # in this test's process beside seven other test workers, against 32.8
    # and 32.9 for patch()'s checkpointed step (docs/NOTES.md). That fusion
    # keeps the checkpoint on any device: the test above. Second steps: the
    # first one's one-time allocations would count. On the CPU: Qwen3-shaped
    # 51.3 / 43.6 / 43.1 MiB (fused, fused and checkpointed, checkpointed),
    # gpt2-shaped 71.6 / 58.2 / 58.2 (lab.tiny's models, the sweep's configs).
    script = tmp_path / "peaks.py"
    tests = os.path.dirname(os.path.abspath(__file__))
    script.write_text(CHECKPOINT_PEAKS_SCRIPT.format(
        root=os.path.dirname(tests), name=name))
    env = dict(os.environ, MLX_RMSNORM_ROUTE_CPU="1")
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    peaks = json.loads(out.stdout.strip().splitlines()[-1])
    assert peaks["n_fused"] > 0, peaks
    assert peaks["fused_checkpointed"] <= 1.05 * peaks["checkpointed"], peaks
    assert peaks["fused_checkpointed"] <= 0.95 * peaks["fused"], peaks


CHANGED = {  # the block with h = x + 0.5 * r
    "llama": "def __call__(self, x, mask=None, cache=None):\n"
             "    r = self.self_attn(self.input_layernorm(x), mask, cache)\n"
             "    h = x + 0.5 * r\n"
             "    return h + self.mlp(self.post_attention_layernorm(h))\n",
    "gpt2": "def __call__(self, x, mask=None, cache=None):\n"
            "    r = self.attn(self.ln_1(x), mask, cache)\n"
            "    h = x + 0.5 * r\n"
            "    return h + self.mlp(self.ln_2(h))\n",
    "stablelm": "def __call__(self, x, mask, cache):\n"
                "    r = self.self_attn(self.input_layernorm(x), mask, cache)\n"
                "    h = x + 0.5 * r\n"
                "    return h + self.mlp(self.post_attention_layernorm(h))\n",
}


@pytest.mark.parametrize("name,cls", BLOCKS)
def test_changed_mlx_lm_block_runs_its_own_code(name, cls):
    # an mlx-lm whose block differs from the one the entry was written for:
    # the same module and name, other source
    namespace = {}
    exec(CHANGED[name], namespace)
    changed = namespace["__call__"]
    changed.__module__ = cls.__module__
    changed.__qualname__ = f"{cls.__name__}.__call__"
    original = cls.__dict__["__call__"]
    cls.__call__ = changed
    try:
        model = make(name)
        x, _ = tokens()
        want = model(x)
        mx.eval(want)
        with pytest.warns(RuntimeWarning, match=f"{cls.__module__}.{cls.__name__}.*changed block"):
            mlx_rmsnorm.patch(fuse=True)
        got = model(x)
        assert close(got, want)
        assert cls.__dict__["__call__"] is changed
        assert _fuse.counts() == {}
    finally:
        mlx_rmsnorm.unpatch()
        cls.__call__ = original


def test_patch_fuse_again_reads_no_source(monkeypatch):
    # patch(fuse=True) after unpatch() checks every entry again; the source
    # checks are remembered, so switching costs no source reads (6.8 ms of
    # them slowed the call after each switch: docs/NOTES.md)
    mlx_rmsnorm.patch(fuse=True)
    mlx_rmsnorm.unpatch()
    reads = []
    real = _fuse.inspect.getsource
    monkeypatch.setattr(_fuse.inspect, "getsource", lambda fn: reads.append(fn) or real(fn))
    try:
        mlx_rmsnorm.patch(fuse=True)
        assert mlx_rmsnorm.is_fused() and _fuse.skipped() == {}
        assert reads == []
    finally:
        mlx_rmsnorm.unpatch()


def test_fingerprint_follows_a_replaced_code_object():
    # what fingerprint() remembers is tied to the code it was taken from
    def block(x):
        return x + 1

    def changed(x):
        return x + 2

    before = _fuse.fingerprint(block)
    assert before is not None and before != _fuse.fingerprint(changed)
    block.__code__ = changed.__code__
    assert _fuse.fingerprint(block) == _fuse.fingerprint(changed)


def test_every_entry_matches_the_installed_mlx_lm():
    # the pinned mlx-lm: every entry installs (no fingerprint mismatch); its
    # modules imported first (an entry is installed when its module is)
    import importlib

    for spec in _fuse.ARCHITECTURES.values():
        importlib.import_module(spec.module)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mlx_rmsnorm.patch(fuse=True)
    assert _fuse.skipped() == {}
    assert len(_fuse._installed) == len({spec.key for spec in _fuse.ARCHITECTURES.values()})
    # the fingerprints are of the installed sources (not a stale list that
    # happens to install): each entry's original, the norms and helpers it
    # checks, and MLX's norms
    for spec in _fuse.ARCHITECTURES.values():
        mod = importlib.import_module(spec.module)
        assert _fuse.fingerprint(_fuse._installed[spec.key].original) in spec.sources, spec.key
        if spec.norm_class is not None:
            assert _fuse.fingerprint(getattr(mod, spec.norm_class).__call__) in spec.norm_sources, spec.key
        for name, sources in spec.helpers:
            assert _fuse.fingerprint(getattr(mod, name)) in sources, (spec.key, name)
    assert _fuse.fingerprint(nn.RMSNorm.__call__) in _fuse.NN_RMS_NORM
    assert _fuse.fingerprint(nn.LayerNorm.__call__) in _fuse.NN_LAYER_NORM
    assert {_fuse.ARCHITECTURES["gpt2"].module, _fuse.ARCHITECTURES["stablelm"].module} == {
        "mlx_lm.models.gpt2", "mlx_lm.models.stablelm"}


def test_gemma_norm_subclass_without_own_call_runs_the_original():
    class Sub(gemma2.RMSNorm):
        pass

    model = make("gemma2")
    layer = model.model.layers[1]
    sub = Sub(layer.input_layernorm.weight.shape[0], eps=layer.input_layernorm.eps)
    sub.weight = layer.input_layernorm.weight
    layer.input_layernorm = sub
    x, _ = tokens()
    want = model(x)
    with mlx_rmsnorm.patched(fuse=True):
        got = model(x)
    assert close(got, want)


def test_float16_gemma3_keeps_clip_residual():
    model = make("gemma3_text", mx.float16)
    x, _ = tokens()
    want, got = patched_and_fused(model, x)
    # the blocks run their own code, and so do their norms (Gemma's 1 + w as
    # mlx-lm forms it, no longer in fp32): what patch() computes, bit for bit
    assert mx.array_equal(got, want)
    assert _fuse.counts()["fallback:float16 (clip_residual)"] == 2


@pytest.mark.parametrize("name,cls", BLOCKS)
def test_block_subclass_runs_the_original(name, cls):
    MyBlock = type("MyBlock", (cls,), {})
    model = make(name)
    old = model.layers[0]
    new = MyBlock(model.args)
    new.update(old.parameters())
    model.layers[0] = new
    x, _ = tokens()
    want = model(x)
    with mlx_rmsnorm.patched(fuse=True):
        got = model(x)
    assert close(got, want)
    assert _fuse.counts() == {"fused": 1, "fallback:block subclass": 1}


def test_cpu_stream_default_runs_the_builtin_and_the_original_blocks():
    was = mlx_rmsnorm.route_cpu(False)
    try:
        model = make("llama")
        x, _ = tokens()
        with mx.stream(mx.cpu):
            want = model(x)
            mx.eval(want)
            with mlx_rmsnorm.patched(fuse=True):
                got = model(x)
        if mx.default_device() == mx.cpu:
            assert mx.array_equal(got, want)  # bit for bit: MLX's own ops
            assert _fuse.counts()["fallback:cpu stream (built-in)"] == 2
    finally:
        mlx_rmsnorm.route_cpu(was)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_few_rows_run_the_blocks_own_code(name):
    """Below min_rows() rows (a decode step) a block runs its own code, bit
    for bit what patch() alone computes; from min_rows() up it fuses."""
    was = _fuse.set_min_rows(48)  # the tokens' 3 x 16 rows
    try:
        _few_rows_cases(name)
    finally:
        _fuse.set_min_rows(was)


def _few_rows_cases(name):
    model = make(name)
    x, _ = tokens()
    for rows, fused in ((x[:1, :5], False), (x[:2, :12], False), (x, True)):
        _fuse.reset_counts()
        want, got = patched_and_fused(model, rows)
        n = len(model.layers)
        if fused:
            assert _fuse.counts() == {"fused": n}
            assert mx.allclose(got, want, rtol=1e-5, atol=1e-5)
        else:
            assert _fuse.counts() == {"fallback:few rows (decode)": n}
            assert mx.array_equal(got, want)


def test_min_rows_default_and_variable():
    code = "from mlx_rmsnorm import _fuse; print('RAN', _fuse.min_rows())"
    env = {k: v for k, v in os.environ.items() if k != "MLX_RMSNORM_FUSE_MIN_ROWS"}
    for extra, want in (({}, "RAN 64"), ({"MLX_RMSNORM_FUSE_MIN_ROWS": "0"}, "RAN 0"),
                        ({"MLX_RMSNORM_FUSE_MIN_ROWS": "128"}, "RAN 128")):
        out = subprocess.run([sys.executable, "-c", code], env={**env, **extra},
                             capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == want, out.stderr
    for bad in ("many", "-1", "1.5"):
        out = subprocess.run([sys.executable, "-c", code], env={**env, "MLX_RMSNORM_FUSE_MIN_ROWS": bad},
                             capture_output=True, text=True, timeout=120)
        assert out.returncode != 0 and "RAN" not in out.stdout
        assert f"MLX_RMSNORM_FUSE_MIN_ROWS={bad!r} is not a row count" in out.stderr


# --- switches -----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_fuse_must_be_a_bool(value):
    with pytest.raises(TypeError, match=r"mlx_rmsnorm.patch: fuse must be True or False"):
        mlx_rmsnorm.patch(fuse=value)
    with pytest.raises(TypeError, match=r"mlx_rmsnorm.patched: fuse must be True or False"):
        with mlx_rmsnorm.patched(fuse=value):
            pass
    assert not mlx_rmsnorm.is_patched()


@pytest.mark.parametrize("value", ["fused", "bogus", "true"])
def test_unknown_patch_variable_is_an_error(value):
    env = dict(os.environ, MLX_RMSNORM_PATCH=value)
    out = subprocess.run([sys.executable, "-c", "import mlx_rmsnorm; print('RAN', mlx_rmsnorm.is_patched())"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "RAN" not in out.stdout
    assert f"MLX_RMSNORM_PATCH={value!r} is not one of 1" in out.stderr


@pytest.mark.parametrize("target", ["nosuch_script.py", "nosuch_module_xyz", "mlx_lm.nosuch"])
def test_missing_target_is_one_line(target):
    out = subprocess.run([sys.executable, "-m", "mlx_rmsnorm", target], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().startswith("python -m mlx_rmsnorm: no ") and target in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


REPORT_SCRIPT = """
import mlx.core as mx, mlx.nn as nn, sys
sys.path.insert(0, {root!r})
from lab.tiny import make, tokens
model = make("llama")
model.model.layers[1].post_attention_layernorm.__class__ = type("Sub", (nn.RMSNorm,), {{}})
x, y = tokens()
step = nn.value_and_grad(model, lambda m, x, y: nn.losses.cross_entropy(m(x), y).mean())
for _ in range(12):
    mx.eval(step(model, x, y))
for _ in range(3):
    mx.eval(mx.vjp(lambda a: mx.fast.rms_norm(a, None, 1e-5), [x.astype(mx.float32)], [x.astype(mx.float32)]))
"""


def test_report_counts_every_graph_and_the_fused_blocks(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(REPORT_SCRIPT.format(root=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = dict(os.environ, MLX_RMSNORM_PATCH="fuse", MLX_RMSNORM_REPORT="1")
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("mlx_rmsnorm report:")]
    assert "gradient_graphs=15 " in lines[0] and "counted the first" not in lines[0], lines
    # 12 steps x (2 input norms + 1 unfused post norm + the final norm) + 3 vjp calls
    assert "RMSNormPluginVJP=51 " in lines[0], lines
    assert "AddRMSNormPluginVJP=12 " in lines[0], lines
    assert "blocks_fused=12 blocks_unfused=12 (norm class: 12)" in lines[1], lines


LN_REPORT_SCRIPT = """
import mlx.core as mx, mlx.nn as nn, sys
sys.path.insert(0, {root!r})
from lab.tiny import make, tokens
model = make("gpt2")
model.layers[1].ln_2.__class__ = type("Sub", (nn.LayerNorm,), {{}})
x, y = tokens()
step = nn.value_and_grad(model, lambda m, x, y: nn.losses.cross_entropy(m(x), y).mean())
for _ in range(3):
    mx.eval(step(model, x, y))
import os, mlx_rmsnorm
print("mlx_rmsnorm from", os.path.dirname(os.path.dirname(os.path.abspath(mlx_rmsnorm.__file__))))
"""


def test_report_counts_the_fused_layer_norm_blocks(tmp_path):
    script = tmp_path / "train.py"
    tests = os.path.dirname(os.path.abspath(__file__))
    script.write_text(LN_REPORT_SCRIPT.format(root=os.path.dirname(tests)))
    # the mlx_rmsnorm of this tree (not whatever an editable install points at)
    root = os.path.dirname(tests)
    env = dict(os.environ, MLX_RMSNORM_PATCH="fuse", MLX_RMSNORM_REPORT="1",
               PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("mlx_rmsnorm report:")]
    assert "gradient_graphs=3 " in lines[0], lines
    assert f"mlx_rmsnorm from {root}" in out.stdout, out.stdout
    # 3 steps x (2 ln_1 + the unfused ln_2 + ln_f)
    assert "LayerNormPluginVJP=12 " in lines[0], lines
    assert "AddLayerNormPlugin=3 AddLayerNormPluginVJP=3" in lines[0], lines
    assert "AddRMSNormPluginVJP=0 " in lines[0], lines
    assert "blocks_fused=3 blocks_unfused=3 (norm class: 3)" in lines[1], lines
