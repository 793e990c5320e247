"""The export hook (mx.export_function / mx.exporter with the plugin in the
traced function) and models exported under patch(): the file holds what the
built-in would have written, so it imports (and runs) where mlx-rmsnorm is not
installed. Each op's own export (every switch, shapeless, several traces) is
in its family's suite (test_rms_norm.py, test_layer_norm.py)."""

import os
import subprocess
import sys
import textwrap

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import graph_text, random, rel_err, to_numpy
from mlx.utils import tree_flatten

import mlx_rmsnorm

EPS = 1e-5


def model_and_input():
    model = nn.Sequential(nn.Linear(16, 32), nn.RMSNorm(32), nn.GELU(), nn.Linear(32, 32), nn.RMSNorm(32, eps=1e-6))
    model.update(
        {"layers": [{"weight": random((32, 16), mx.float32, 1), "bias": random((32,), mx.float32, 2)},
                    {"weight": random((32,), mx.float32, 3, 0.3, 1.0)},
                    {},
                    {"weight": random((32, 32), mx.float32, 4), "bias": random((32,), mx.float32, 5)},
                    {"weight": random((32,), mx.float32, 6, 0.3, 1.0)}]}
    )
    x = random((6, 16), mx.float32, 7)
    mx.eval(model.parameters(), x)
    return model, x


def plugin_free(path):
    with open(path, "rb") as f:
        return b"RMSNormPlugin" not in f.read()


def import_elsewhere(path, inputs, tmp_path):
    """Runs the exported function in a fresh interpreter that never imports
    mlx_rmsnorm, on `inputs`; returns its outputs."""
    np.savez(tmp_path / "in.npz", *[np.array(a) for a in inputs])
    script = textwrap.dedent(
        f"""
        import sys
        import mlx.core as mx
        import numpy as np
        data = np.load({str(tmp_path / "in.npz")!r})
        args = [mx.array(data[k]) for k in sorted(data.files, key=lambda k: int(k.split("_")[1]))]
        out = mx.import_function({path!r})(*args)
        assert "mlx_rmsnorm" not in sys.modules
        np.savez({str(tmp_path / "out.npz")!r}, *[np.array(o) for o in out])
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_RMSNORM")}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120)
    out = np.load(tmp_path / "out.npz")
    return [out[k] for k in sorted(out.files, key=lambda k: int(k.split("_")[1]))]


def test_patched_model_exports_and_imports_without_the_plugin(tmp_path):
    model, x = model_and_input()
    path = str(tmp_path / "model.mlxfn")
    with mlx_rmsnorm.patched():
        assert "RMSNormPlugin" in graph_text(model(x))
        mx.export_function(path, model, x)
        # the trace is over: the plugin is back in graphs built afterwards
        assert "RMSNormPlugin" in graph_text(model(x))
    assert plugin_free(path)
    expected = model(x)
    (out,) = import_elsewhere(path, [x], tmp_path)
    assert rel_err(out, to_numpy(expected)) <= 1e-6
    (here,) = mx.import_function(path)(x)
    assert rel_err(here, to_numpy(expected)) <= 1e-6


def test_patched_training_step_exports(tmp_path):
    """A gradient step of a model under patch(): forward and backward export."""
    model, x = model_and_input()
    params = model.trainable_parameters()
    keys = [k for k, _ in tree_flatten(params)]

    def loss_and_grads(x, *flat):
        model.update(dict_from(keys, flat))
        loss, grads = nn.value_and_grad(model, lambda m, x: (m(x) ** 2).mean())(model, x)
        return [loss] + [g for _, g in tree_flatten(grads)]

    flat = [v for _, v in tree_flatten(params)]
    path = str(tmp_path / "step.mlxfn")
    with mlx_rmsnorm.patched():
        mx.export_function(path, loss_and_grads, x, *flat)
    assert plugin_free(path)
    ref = loss_and_grads(x, *flat)  # the built-in
    got = import_elsewhere(path, [x] + flat, tmp_path)
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert rel_err(a, to_numpy(b)) <= 1e-5


def dict_from(keys, flat):
    from mlx.utils import tree_unflatten

    return tree_unflatten(list(zip(keys, flat)))


def test_flag_is_cleared_when_the_traced_function_raises(tmp_path):
    def bad(x):
        mlx_rmsnorm.rms_norm(x, None, EPS)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        mx.export_function(str(tmp_path / "bad.mlxfn"), bad, mx.ones((2, 4)))
    assert not mlx_rmsnorm._ext._export_tracing()
    assert "RMSNormPlugin" in graph_text(mlx_rmsnorm.rms_norm(mx.ones((2, 4)), None, EPS))


def test_export_hooks_keep_the_signature_of_mlx(tmp_path):
    assert mx.export_function.__wrapped__ is not None and mx.exporter.__wrapped__ is not None
    assert mx.export_function.__doc__ == mx.export_function.__wrapped__.__doc__
    # keyword inputs and metadata pass through
    path = str(tmp_path / "kw.mlxfn")
    mx.export_function(path, lambda x, *, w: mlx_rmsnorm.rms_norm(x, w, EPS), mx.ones((2, 4)),
                       w=mx.ones((4,)), metadata="m")
    out = mx.import_function(path)(mx.ones((2, 4)), w=mx.full((4,), 2.0))[0]
    assert np.allclose(np.array(out), 2.0, rtol=1e-5)
