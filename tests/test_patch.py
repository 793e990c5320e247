"""patch() reroutes mx.fast.rms_norm (and nn.RMSNorm) and unpatch() restores it."""

import importlib
import threading

import mlx.core as mx
import mlx.nn as nn
import pytest
from conftest import graph_text, overlapping_patched_blocks
from mlx.utils import tree_flatten

import mlx_rmsnorm


def test_patch_routes_nn_rmsnorm_and_unpatch_restores():
    builtin = mx.fast.rms_norm
    layer = nn.RMSNorm(32)
    x = mx.ones((2, 32))
    assert "RMSNormPlugin" not in graph_text(layer(x))
    try:
        mlx_rmsnorm.patch()
        mlx_rmsnorm.patch()  # idempotent
        assert mlx_rmsnorm.is_patched()
        assert "RMSNormPlugin" in graph_text(layer(x))
        # and the backward of a model built on nn.RMSNorm runs our VJP
        grads = mx.grad(lambda x: layer(x).sum())(x)
        assert "RMSNormPluginVJP" in graph_text(grads)
    finally:
        mlx_rmsnorm.unpatch()
    mlx_rmsnorm.unpatch()  # idempotent
    assert mx.fast.rms_norm is builtin and not mlx_rmsnorm.is_patched()
    assert "RMSNormPlugin" not in graph_text(layer(x))


def test_context_manager_restores_previous_state():
    with mlx_rmsnorm.patched():
        assert mlx_rmsnorm.is_patched()
    assert not mlx_rmsnorm.is_patched()
    mlx_rmsnorm.patch()
    try:
        with mlx_rmsnorm.patched():
            pass
        assert mlx_rmsnorm.is_patched()  # it was patched before: stays so
    finally:
        mlx_rmsnorm.unpatch()


def test_patched_model_matches_builtin():
    model = nn.Sequential(nn.Linear(16, 32), nn.RMSNorm(32), nn.Linear(32, 4))
    mx.eval(model.parameters())
    x = mx.random.normal((8, 16), key=mx.random.key(0))

    def loss(m, x):
        return (m(x) ** 2).mean()

    ref_loss, ref_grads = nn.value_and_grad(model, loss)(model, x)
    with mlx_rmsnorm.patched():
        our_loss, our_grads = nn.value_and_grad(model, loss)(model, x)
    assert abs(our_loss.item() - ref_loss.item()) <= 1e-5 * abs(ref_loss.item())
    ours, theirs = dict(tree_flatten(our_grads)), dict(tree_flatten(ref_grads))
    assert ours.keys() == theirs.keys() and len(ours) == 5
    for k in ours:
        assert mx.allclose(ours[k], theirs[k], rtol=1e-4, atol=1e-6).item(), k


# --- nesting, threads, reload -------------------------------------------------

BUILTIN = mx.fast.rms_norm  # the suite starts unpatched


def test_patched_restores_the_state_it_found_whatever_the_body_does():
    try:
        mlx_rmsnorm.patch()
        with mlx_rmsnorm.patched():
            mlx_rmsnorm.unpatch()
            assert not mlx_rmsnorm.is_patched()  # the body's call takes effect now
        assert mlx_rmsnorm.is_patched()  # and the block restores what it found
        mlx_rmsnorm.unpatch()
        with mlx_rmsnorm.patched():
            mlx_rmsnorm.patch()
            with mlx_rmsnorm.patched():  # nested
                pass
            assert mlx_rmsnorm.is_patched()
        assert not mlx_rmsnorm.is_patched()
        with pytest.raises(KeyError):  # an exception in the body restores too
            with mlx_rmsnorm.patched():
                raise KeyError
        assert not mlx_rmsnorm.is_patched()
    finally:
        mlx_rmsnorm.unpatch()
    assert mx.fast.rms_norm is BUILTIN


def test_overlapping_blocks_in_threads():
    """A enters, B enters, A exits: B's block still runs the plugin; the last
    to exit restores the state from before the first entered."""
    x = mx.ones((2, 8))
    patched, graph = overlapping_patched_blocks(
        lambda: (mlx_rmsnorm.is_patched(), graph_text(nn.RMSNorm(8)(x))))
    assert patched and "RMSNormPlugin" in graph
    assert not mlx_rmsnorm.is_patched() and mx.fast.rms_norm is BUILTIN


def test_patch_outside_blocks_outlives_other_threads_blocks():
    entered, release = threading.Event(), threading.Event()

    def block():
        with mlx_rmsnorm.patched():
            entered.set()
            release.wait(10)

    t = threading.Thread(target=block)
    t.start()
    try:
        entered.wait(10)
        mlx_rmsnorm.patch()  # this thread is in no block: the state that stays
        release.set()
        t.join(10)
        assert mlx_rmsnorm.is_patched()
    finally:
        release.set()
        mlx_rmsnorm.unpatch()
    assert mx.fast.rms_norm is BUILTIN


def test_many_threads_entering_and_leaving():
    errors = []

    def worker(seed):
        x = mx.ones((2, 16)) * (seed + 1)
        try:
            for _ in range(20):
                with mlx_rmsnorm.patched():
                    assert mlx_rmsnorm.is_patched()
                    y = mx.fast.rms_norm(x, None, 1e-5)  # graphs only: no eval from threads
                    assert "RMSNormPlugin" in graph_text(y)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert not mlx_rmsnorm.is_patched() and mx.fast.rms_norm is BUILTIN


def test_reload_keeps_the_builtin_and_open_blocks():
    try:
        mlx_rmsnorm.patch()
        module = importlib.reload(mlx_rmsnorm)
        assert module.is_patched()
        module.unpatch()
        assert mx.fast.rms_norm is BUILTIN
        with module.patched():
            importlib.reload(mlx_rmsnorm)
            assert mlx_rmsnorm.is_patched()
        assert mx.fast.rms_norm is BUILTIN
    finally:
        mlx_rmsnorm.unpatch()
    assert "RMSNormPlugin" not in graph_text(nn.RMSNorm(8)(mx.ones((2, 8))))


# --- RMSNorm is an nn.RMSNorm -------------------------------------------------


def test_rmsnorm_is_an_nn_rmsnorm(tmp_path):
    ours, theirs = mlx_rmsnorm.RMSNorm(24, eps=1e-6), nn.RMSNorm(24, eps=1e-6)
    assert isinstance(ours, nn.RMSNorm)
    assert repr(ours) == repr(theirs) == "RMSNorm(24, eps=1e-06)"
    assert ours.eps == theirs.eps and ours.weight.dtype == theirs.weight.dtype
    assert tree_flatten(ours.parameters())[0][0] == tree_flatten(theirs.parameters())[0][0] == "weight"
    theirs.update({"weight": mx.arange(24, dtype=mx.float32) / 7})
    path = str(tmp_path / "norm.safetensors")
    theirs.save_weights(path)
    ours.load_weights(path)  # checkpoints load as they are
    assert mx.array_equal(ours.weight, theirs.weight).item()
    x = mx.random.normal((3, 24), key=mx.random.key(1))
    assert "RMSNormPlugin" in graph_text(ours(x))  # the plugin, patched or not
    assert mx.allclose(ours(x), theirs(x), rtol=1e-5, atol=1e-6).item()
    with pytest.raises(ValueError, match="eps"):
        mlx_rmsnorm.RMSNorm(4, eps=0.0)  # nn.RMSNorm's own check


def test_awq_apply_scale_treats_both_alike():
    awq = pytest.importorskip("mlx_lm.quant.awq")
    scales = mx.linspace(0.5, 2.0, 16)
    results = []
    for cls in (nn.RMSNorm, mlx_rmsnorm.RMSNorm):
        norm, linear = cls(16), nn.Linear(16, 8)
        linear.weight = mx.ones((8, 16))
        awq.apply_scale(norm, [linear], scales)
        results.append((norm.weight, linear.weight))
    (nw_a, lw_a), (nw_b, lw_b) = results
    assert mx.allclose(nw_a, 1.0 / scales).item()  # what mlx-lm does to an RMSNorm
    assert mx.array_equal(nw_a, nw_b).item() and mx.array_equal(lw_a, lw_b).item()


# --- the CPU stream: MLX's own op under patch() (route_cpu off, the default) --------


@pytest.fixture
def builtin_on_cpu():
    was = mlx_rmsnorm.route_cpu(False)
    yield
    mlx_rmsnorm.route_cpu(was)


def _composition(x, w, eps):
    # MLX's test_fast.py reference for rms_norm
    y = x.astype(mx.float32)
    y = y * mx.rsqrt(y.square().mean(-1, keepdims=True) + eps)
    return w * y.astype(w.dtype)


@pytest.mark.parametrize("seed", range(8))
def test_cpu_stream_runs_the_builtin_bit_for_bit(builtin_on_cpu, seed):
    # MLX's own tests (N = 4099 float32, 1e-6 absolute against the composition;
    # second-order gradients at 1e-5) pass under patch() on the CPU because the
    # routed call there *is* the built-in.
    from mlx_rmsnorm._patching import BUILTIN, BUILTIN_LAYER_NORM

    mx.random.seed(seed)
    x = mx.random.uniform(shape=(3, 4099))
    w = mx.random.uniform(shape=(4099,))
    b = mx.random.uniform(shape=(4099,))
    with mx.stream(mx.cpu):
        want = BUILTIN(x, w, 1e-5)
        want_ln = BUILTIN_LAYER_NORM(x, w, b, 1e-5)
        f = lambda fn: mx.grad(lambda x: mx.grad(lambda x: fn(x, w, 1e-5).sum())(x).sum())(x)  # noqa: E731
        want_gg = f(BUILTIN)
        with mlx_rmsnorm.patched():
            got = mx.fast.rms_norm(x, w, 1e-5)
            got_ln = mx.fast.layer_norm(x, w, b, 1e-5)
            got_gg = f(mx.fast.rms_norm)
            assert "RMSNormPlugin" not in graph_text(got)
        composition = _composition(x, w, 1e-5)  # on the CPU too: the GPU's rounds otherwise
    assert mx.array_equal(got, want) and mx.array_equal(got_ln, want_ln) and mx.array_equal(got_gg, want_gg)
    assert float(mx.abs(got - composition).max()) < 1e-6


def test_cpu_stream_routes_to_the_plugin_when_asked():
    was = mlx_rmsnorm.route_cpu(True)
    try:
        x = mx.ones((2, 8))
        with mlx_rmsnorm.patched(), mx.stream(mx.cpu):
            assert "RMSNormPlugin" in graph_text(mx.fast.rms_norm(x, None, 1e-5))
            assert "LayerNormPlugin" in graph_text(mx.fast.layer_norm(x, None, None, 1e-5))
    finally:
        mlx_rmsnorm.route_cpu(was)
