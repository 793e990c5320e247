"""Functions a program installs on mx.fast itself (a wrapper, a profiler's
hook): "the state before" is what was there, whoever installed it
(_patching's docstring, "Other functions"). patch() replaces a wrapper
installed before it and unpatch() / the last patched() block put it back;
one installed over the plugin while it is on stays."""

import warnings

import mlx.core as mx
import mlx.nn as nn
import pytest
from conftest import graph_text, overlapping_patched_blocks

import mlx_rmsnorm
from mlx_rmsnorm import _patching

OURS = {"rms_norm": _patching.ROUTED_RMS_NORM, "layer_norm": _patching.ROUTED_LAYER_NORM}


@pytest.fixture
def doubled():
    """mx.fast.rms_norm and mx.fast.layer_norm replaced by wrappers of what
    was there that double the result, installed after `import mlx_rmsnorm`;
    put back afterwards."""
    assert not mlx_rmsnorm.is_patched()
    before = {name: getattr(mx.fast, name) for name in OURS}
    wrappers = {}
    for name, inner in before.items():
        def wrapper(*a, _inner=inner, **k):
            return _inner(*a, **k) * 2.0
        wrappers[name] = wrapper
        setattr(mx.fast, name, wrapper)
    yield wrappers
    mlx_rmsnorm.unpatch()
    for name, fn in before.items():
        setattr(mx.fast, name, fn)


def _values():
    x = mx.random.normal((2, 8), key=mx.random.key(3))
    return mx.stack([nn.RMSNorm(8)(x), nn.LayerNorm(8)(x)])


def test_patched_exit_and_unpatch_keep_a_wrapper_installed_before(doubled):
    a = _values()
    with mlx_rmsnorm.patched():
        assert mlx_rmsnorm.is_patched()  # the plugin, instead of the wrapper, inside
        assert mx.allclose(2 * _values(), a, rtol=1e-5, atol=1e-6)
    assert mx.fast.rms_norm is doubled["rms_norm"] and mx.fast.layer_norm is doubled["layer_norm"]
    assert mx.array_equal(_values(), a)  # the check: the wrapper is still there
    mlx_rmsnorm.patch()
    assert mlx_rmsnorm.is_patched() and "RMSNormPlugin" in graph_text(nn.RMSNorm(8)(mx.ones((2, 8))))
    mlx_rmsnorm.unpatch()
    assert mx.fast.rms_norm is doubled["rms_norm"] and mx.fast.layer_norm is doubled["layer_norm"]
    assert not mlx_rmsnorm.is_patched() and mx.array_equal(_values(), a)


def test_nested_blocks_and_body_switches_restore_the_wrapper(doubled):
    with mlx_rmsnorm.patched():
        with mlx_rmsnorm.patched():
            mlx_rmsnorm.unpatch()  # the body's call takes effect now: the wrapper
            assert mx.fast.rms_norm is doubled["rms_norm"]
        assert mlx_rmsnorm.is_patched()  # an outer block is open: the plugin again
    assert mx.fast.rms_norm is doubled["rms_norm"] and mx.fast.layer_norm is doubled["layer_norm"]
    mlx_rmsnorm.patch()
    with mlx_rmsnorm.patched():
        pass
    assert mlx_rmsnorm.is_patched()  # patched before the block: stays so
    mlx_rmsnorm.unpatch()
    assert mx.fast.rms_norm is doubled["rms_norm"]


def test_threads_keep_the_wrapper(doubled):
    assert overlapping_patched_blocks(mlx_rmsnorm.is_patched)
    assert mx.fast.rms_norm is doubled["rms_norm"] and mx.fast.layer_norm is doubled["layer_norm"]


def test_a_function_installed_over_the_plugin_stays():
    try:
        mlx_rmsnorm.patch()
        hook_calls = []

        def hook(*a, _inner=mx.fast.rms_norm, **k):  # a profiler's hook over the plugin
            hook_calls.append(1)
            return _inner(*a, **k)

        mx.fast.rms_norm = hook
        assert not mlx_rmsnorm.is_patched()  # mx.fast does not hold the plugin itself
        mlx_rmsnorm.patch()  # the program's latest choice stays
        assert mx.fast.rms_norm is hook
        with mlx_rmsnorm.patched():
            assert mx.fast.rms_norm is hook
        assert mx.fast.rms_norm is hook
        with pytest.warns(RuntimeWarning, match=r"mx\.fast\.rms_norm was replaced after patch\(\)"):
            mlx_rmsnorm.unpatch()
        assert mx.fast.rms_norm is hook  # left in place, with the warning
        assert mx.fast.layer_norm is _patching.BUILTIN_LAYER_NORM  # the other one is restored
        # the routing is off: a new patch() replaces the hook and keeps it
        mlx_rmsnorm.patch()
        assert mlx_rmsnorm.is_patched()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            mlx_rmsnorm.unpatch()
        assert mx.fast.rms_norm is hook
    finally:
        mlx_rmsnorm.unpatch()
        mx.fast.rms_norm = _patching.BUILTIN
    assert mx.fast.rms_norm is _patching.BUILTIN and not mlx_rmsnorm.is_patched()


def test_without_wrappers_unpatch_restores_mlx_own_functions():
    with mlx_rmsnorm.patched():
        pass
    assert mx.fast.rms_norm is _patching.BUILTIN and mx.fast.layer_norm is _patching.BUILTIN_LAYER_NORM
    mx.fast.rms_norm = _patching.ROUTED_RMS_NORM  # set by hand, not by patch()
    try:
        mlx_rmsnorm.patch()
        mlx_rmsnorm.unpatch()
    finally:
        mx.fast.layer_norm = _patching.BUILTIN_LAYER_NORM
    assert mx.fast.rms_norm is _patching.BUILTIN  # MLX's own, not the plugin again


def test_compiled_functions_keep_the_routing_they_were_traced_with():
    # docs/api.md: mx.compile traces once per input shape; the traced graph
    # keeps the norm it was traced with after unpatch() (and before patch()).
    norm = nn.RMSNorm(8)
    x = mx.random.normal((4, 8), key=mx.random.key(0))
    f = mx.compile(lambda x: norm(x))
    g = mx.compile(lambda x: norm(x))
    mx.eval(g(x))  # traced unpatched
    with mlx_rmsnorm.patched():
        mx.eval(f(x))  # traced patched
        assert "RMSNormPlugin" not in graph_text(g(x))
        assert "RMSNormPlugin" in graph_text(g(mx.ones((3, 8))))  # a new shape traces again
    assert "RMSNormPlugin" in graph_text(f(x))
    assert "RMSNormPlugin" not in graph_text(f(mx.ones((5, 8))))
