"""patch()'s routed functions: what it puts in mx.fast.rms_norm's and
mx.fast.layer_norm's place on a CPU stream (_ext.routed_rms_norm,
_ext.routed_layer_norm). One body per contract, parametrized over the family:
(routed function, MLX's built-in, the plugin's own op, the float64 reference).
"""

import mlx.core as mx
import numpy as np
import pytest
from norm_contract import BUILTIN_LAYER_NORM, BUILTIN_RMS_NORM
from norm_refs import np_layer, np_rms

from mlx_rmsnorm import _ext

EPS = 1e-5


class Family:
    def __init__(self, name, routed, builtin, plugin, ref, params):
        self.name, self.routed, self.builtin, self.plugin, self.ref = name, routed, builtin, plugin, ref
        self.params = params  # the parameters between x and eps: ("weight",) or ("weight", "bias")

    def inputs(self, seed, n=4099):
        # x, then one (n,) array per parameter, in that order from one seeding
        mx.random.seed(seed)
        return [mx.random.normal((8, n))] + [mx.random.normal((n,)) for _ in self.params]


FAMILIES = [
    pytest.param(Family("rms_norm", _ext.routed_rms_norm, BUILTIN_RMS_NORM, _ext.rms_norm, np_rms,
                        ("weight",)), id="rms_norm"),
    pytest.param(Family("layer_norm", _ext.routed_layer_norm, BUILTIN_LAYER_NORM, _ext.layer_norm, np_layer,
                        ("weight", "bias")), id="layer_norm"),
]


@pytest.fixture
def route_cpu():
    was = _ext._set_route_cpu(True)
    yield
    _ext._set_route_cpu(was)


@pytest.fixture
def builtin_on_cpu():
    # the default, which the suite's MLX_RMSNORM_ROUTE_CPU=1 (conftest) turns off
    was = _ext._set_route_cpu(False)
    yield
    _ext._set_route_cpu(was)


@pytest.mark.parametrize("fam", FAMILIES)
def test_routed_signature_is_mx_fast(fam):
    head, doc = fam.routed.__doc__.split("\n", 1)
    their_head, their_doc = fam.builtin.__doc__.split("\n", 1)
    assert doc == their_doc
    assert head.split("(", 1)[1] == their_head.split("(", 1)[1]


@pytest.mark.parametrize("fam", FAMILIES)
def test_routed_cpu_is_the_builtin_bit_for_bit(fam, builtin_on_cpu):
    # N = 4099 float32: MLX's own test_fast.py case
    x, *p = fam.inputs(3)
    if fam.name == "rms_norm":
        # where ours differs from the built-in's composition in the last bits
        assert not mx.array_equal(fam.plugin(x, *p, EPS), fam.builtin(x, *p, EPS))
    for s in ({}, {"stream": mx.cpu}, {"stream": mx.default_stream(mx.cpu)}):
        assert mx.array_equal(fam.routed(x, *p, EPS, **s), fam.builtin(x, *p, EPS))

    # its gradients too, second order included
    def loss(f):
        return lambda x, *p: (f(x, *p, EPS) ** 2).sum()

    def gx2(f):
        return mx.grad(lambda x: mx.grad(loss(f))(x, *p).sum())(x)

    argnums = tuple(range(1 + len(p)))
    for mine, theirs in [(mx.grad(loss(fam.routed), argnums=argnums)(x, *p),
                          mx.grad(loss(fam.builtin), argnums=argnums)(x, *p)),
                         ([gx2(fam.routed)], [gx2(fam.builtin)])]:
        assert len(mine) == len(theirs)
        for a, t in zip(mine, theirs):
            assert mx.array_equal(a, t)


@pytest.mark.parametrize("fam", FAMILIES)
def test_routed_cpu_flag_runs_the_plugin(fam, route_cpu):
    x, *p = fam.inputs(4)
    assert _ext._set_route_cpu(True) is True
    assert mx.array_equal(fam.routed(x, *p, EPS), fam.plugin(x, *p, EPS))
    want = fam.ref(*(np.array(a, dtype=np.float64) for a in (x, *p)), EPS)
    np.testing.assert_allclose(np.array(fam.routed(x, *p, EPS)), want, rtol=1e-5, atol=1e-5)
    assert _ext._set_route_cpu(False) is True
    assert mx.array_equal(fam.routed(x, *p, EPS), fam.builtin(x, *p, EPS))


@pytest.mark.parametrize("fam", FAMILIES)
def test_routed_arguments_are_mx_fast_arguments(fam, builtin_on_cpu):
    x = mx.ones((2, 8))
    nones = [None] * len(fam.params)
    with pytest.raises(TypeError):
        fam.routed(x, *nones, EPS, offset=1.0)
    y = fam.routed(x=x, **dict.fromkeys(fam.params), eps=EPS, stream=mx.cpu)
    assert mx.array_equal(y, fam.builtin(x, *nones, EPS))
