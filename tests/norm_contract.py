"""The transform contract of the ops, shared by the family suites: every
transform (call, grad, vjp, jvp, grad of grad, vmap over every input, the
first or the weights, on axis 0 or 1, compile, compile of grad, and both
shapeless) of ours and of the built-in (or MLX's composition of it), compared
with each other and with a float64 reference by complex steps
(norm_refs.np_*): values, shapes and dtypes. `check` returns what differs;
`run_contract` runs it on a device and asserts nothing does."""

import mlx.core as mx
import numpy as np
import pytest
from conftest import DEVICES
from norm_refs import (EPS, np_add, np_add_layer, np_add_layer_vjp, np_add_layer_vjp_inputs, np_add_vjp,
                       np_add_vjp_inputs, np_layer, np_layer_vjp, np_rms, np_rms_vjp)

from mlx_rmsnorm import _ext

# MLX's own functions, whatever patch() state another test left (the
# package keeps them on mx.fast when it is imported).
BUILTIN_RMS_NORM = getattr(mx.fast, "_mlx_rmsnorm_builtin_rms_norm", mx.fast.rms_norm)
BUILTIN_LAYER_NORM = getattr(mx.fast, "_mlx_rmsnorm_builtin_layer_norm", mx.fast.layer_norm)

H = 1e-30


class Op:
    """One op as a function of a list of arrays returning a list of arrays:
    ours, the built-in (or MLX's composition of it) and the NumPy reference;
    `np_vjp(*inputs, *cotangents)` is the reference's gradient in analytic
    form (forward ops only: what second-order references differentiate)."""

    def __init__(self, name, ours, builtin, np_fn, inputs, np_vjp=None):
        self.name, self.ours, self.builtin, self.np_fn = name, ours, builtin, np_fn
        self.inputs, self.np_vjp = inputs, np_vjp


def _builtin_rms_vjp(x, w, g):
    return list(mx.vjp(lambda x, w: [BUILTIN_RMS_NORM(x, w, EPS)], [x, w], [g])[1])


def _builtin_add_vjp(h, w, gy, gh):
    gx, gw = mx.vjp(lambda h, w: [BUILTIN_RMS_NORM(h, w, EPS)], [h, w], [gy])[1]
    return [gx + gh, gw]


def _builtin_layer_vjp(x, w, b, g):
    return list(mx.vjp(lambda x, w, b: [BUILTIN_LAYER_NORM(x, w, b, EPS)], [x, w, b], [g])[1])


def _builtin_add_layer_vjp(h, w, b, gy, gh):
    gx, gw, gb = mx.vjp(lambda h, w, b: [BUILTIN_LAYER_NORM(h, w, b, EPS)], [h, w, b], [gy])[1]
    return [gx + gh, gw, gb]



OPS = {
    "rms_norm": Op(
        "rms_norm",
        lambda x, w: [_ext.rms_norm(x, w, EPS)],
        lambda x, w: [BUILTIN_RMS_NORM(x, w, EPS)],
        lambda x, w: [np_rms(x, w)],
        "xw",
        np_vjp=lambda x, w, c: np_rms_vjp(x, w, c),
    ),
    "add_rms_norm": Op(
        "add_rms_norm",
        lambda x, r, w: list(_ext.add_rms_norm(x, r, w, EPS)),
        lambda x, r, w: [BUILTIN_RMS_NORM(x + r, w, EPS), x + r],
        np_add,
        "xxw",
        np_vjp=np_add_vjp_inputs,
    ),
    "layer_norm": Op(
        "layer_norm",
        lambda x, w, b: [_ext.layer_norm(x, w, b, EPS)],
        lambda x, w, b: [BUILTIN_LAYER_NORM(x, w, b, EPS)],
        lambda x, w, b: [np_layer(x, w, b)],
        "xww",
        np_vjp=lambda x, w, b, c: np_layer_vjp(x, w, c),
    ),
    "add_layer_norm": Op(
        "add_layer_norm",
        lambda x, r, w, b: list(_ext.add_layer_norm(x, r, w, b, EPS)),
        lambda x, r, w, b: [BUILTIN_LAYER_NORM(x + r, w, b, EPS), x + r],
        np_add_layer,
        "xxww",
        np_vjp=np_add_layer_vjp_inputs,
    ),
    "rms_norm_vjp": Op(
        "rms_norm_vjp",
        lambda x, w, g: list(_ext.rms_norm_vjp(x, w, g, EPS)),
        _builtin_rms_vjp,
        np_rms_vjp,
        "xwx",
    ),
    "add_rms_norm_vjp": Op(
        "add_rms_norm_vjp",
        lambda h, w, gy, gh: list(_ext.add_rms_norm_vjp(h, w, gy, gh, EPS)),
        _builtin_add_vjp,
        np_add_vjp,
        "xwxx",
    ),
    "layer_norm_vjp": Op(
        "layer_norm_vjp",
        lambda x, w, b, g: list(_ext.layer_norm_vjp(x, w, b, g, EPS)),
        _builtin_layer_vjp,
        lambda x, w, b, g: np_layer_vjp(x, w, g),
        "xwwx",
    ),
    "add_layer_norm_vjp": Op(
        "add_layer_norm_vjp",
        lambda h, w, b, gy, gh: list(_ext.add_layer_norm_vjp(h, w, b, gy, gh, EPS)),
        _builtin_add_layer_vjp,
        np_add_layer_vjp,
        "xwwxx",
    ),
}


# --- references of the transforms, by complex steps --------------------------


def np_jvp(fn, args, tangents):
    outs = fn(*[a + 1j * H * t for a, t in zip(args, tangents)])
    return [o.imag / H for o in outs]


def np_vjp(fn, args, cotangents):
    """sum over outputs of J^T c, one complex step per input element."""
    grads = []
    for k, a in enumerate(args):
        g = np.zeros(a.shape)
        for j in np.ndindex(*a.shape):
            t = [np.zeros(b.shape) for b in args]
            t[k][j] = 1.0
            g[j] = sum(float(np.sum(d * c)) for d, c in zip(np_jvp(fn, args, t), cotangents))
        grads.append(g)
    return grads


# --- the transforms: (ours or built-in) -> list of arrays, and the reference --


def _rand(shape, seed, dtype):
    rng = np.random.default_rng(seed)
    return mx.array(rng.standard_normal(shape).astype(np.float64)).astype(dtype)


def _f64(a):
    return np.array(a.astype(mx.float64, stream=mx.cpu), dtype=np.float64)


class Case:
    """Inputs of one op, with the cotangents, tangents and second batch
    members the transforms take. `shapes` overrides the shape of the row
    inputs one by one (the fused adds' broadcasts)."""

    def __init__(self, op, shape, x_dtype, w_dtype, shapes=None):
        self.op = op
        n = shape[-1]
        self.args = []
        for i, kind in enumerate(op.inputs):
            if kind == "x":
                self.args.append(_rand(shapes[i] if shapes else shape, 10 + i, x_dtype))
            else:  # a weight or bias: around 1 for a weight, around 0 for a bias
                a = _rand((n,), 10 + i, mx.float32) * 0.25 + (1.0 if i == 1 else 0.0)
                self.args.append(a.astype(w_dtype))
        self.np_args = [_f64(a) for a in self.args]
        outs = op.builtin(*self.args)
        self.cots = [_rand(o.shape, 40 + i, o.dtype) for i, o in enumerate(outs)]
        self.tans = [_rand(a.shape, 60 + i, a.dtype) for i, a in enumerate(self.args)]
        self.dcots = [_rand(a.shape, 80 + i, a.dtype) for i, a in enumerate(self.args)]
        # a second member of each batch, for vmap
        self.args2 = [_rand(a.shape, 100 + i, a.dtype) + (1.0 if op.inputs[i] == "w" else 0.0)
                      for i, a in enumerate(self.args)]


def _loss(fn, cots):
    def loss(*a):
        return sum((o.astype(mx.float64 if o.dtype == mx.float64 else mx.float32) * c).sum()
                   for o, c in zip(fn(*a), cots))

    return loss


def _argnums(case):
    return tuple(range(len(case.args)))


def t_call(fn, case):
    return fn(*case.args)


def r_call(case):
    return case.op.np_fn(*case.np_args)


def t_grad(fn, case):
    return list(mx.grad(_loss(fn, case.cots), argnums=_argnums(case))(*case.args))


def r_grad(case):
    return np_vjp(case.op.np_fn, case.np_args, [_f64(c) for c in case.cots])


def t_vjp(fn, case):
    return list(mx.vjp(fn, case.args, case.cots)[1])


def t_jvp(fn, case):
    return list(mx.jvp(fn, case.args, case.tans)[1])


def r_jvp(case):
    return np_jvp(case.op.np_fn, case.np_args, [_f64(t) for t in case.tans])


def t_grad_of_grad(fn, case):
    inner = mx.grad(_loss(fn, case.cots), argnums=_argnums(case))

    def outer(*a):
        return sum((g.astype(mx.float64 if g.dtype == mx.float64 else mx.float32) * d).sum()
                   for g, d in zip(inner(*a), case.dcots))

    return list(mx.grad(outer, argnums=_argnums(case))(*case.args))


def r_grad_of_grad(case):
    cots = [_f64(c) for c in case.cots]
    return np_vjp(lambda *a: case.op.np_vjp(*a, *cots), case.np_args,
                  [_f64(d) for d in case.dcots])


def _vmap(mapped, axis=0):
    def t(fn, case):
        ins = [mx.stack([a, b], axis=min(axis, a.ndim)) if k in mapped(case) else a
               for k, (a, b) in enumerate(zip(case.args, case.args2))]
        axes = tuple(min(axis, a.ndim) if k in mapped(case) else None
                     for k, a in enumerate(case.args))
        return list(mx.vmap(lambda *a: fn(*a), in_axes=axes)(*ins))

    def r(case):
        first = case.op.np_fn(*case.np_args)
        second = case.op.np_fn(*[_f64(b) if k in mapped(case) else a for k, (a, b)
                                 in enumerate(zip(case.np_args, case.args2))])
        return [np.stack([p, q]) for p, q in zip(first, second)]

    return t, r


def _all(case):
    return set(range(len(case.args)))


def _weights(case):
    return {k for k, kind in enumerate(case.op.inputs) if kind == "w"}


def _first(case):
    return {0}


def t_compile(fn, case):
    return list(mx.compile(fn)(*case.args))


def t_compile_shapeless(fn, case):
    return list(mx.compile(fn, shapeless=True)(*case.args))


def t_compile_grad(fn, case):
    return list(mx.compile(lambda *a: mx.grad(_loss(fn, case.cots), argnums=_argnums(case))(*a))(
        *case.args))


def t_compile_grad_shapeless(fn, case):
    return list(mx.compile(lambda *a: mx.grad(_loss(fn, case.cots), argnums=_argnums(case))(*a),
                           shapeless=True)(*case.args))


TRANSFORMS = {
    "call": (t_call, r_call),
    "grad": (t_grad, r_grad),
    "vjp": (t_vjp, r_grad),
    "jvp": (t_jvp, r_jvp),
    "grad_of_grad": (t_grad_of_grad, r_grad_of_grad),
    "vmap_all": _vmap(_all),
    "vmap_first": _vmap(_first),
    "vmap_weights": _vmap(_weights),
    "vmap_all_axis1": _vmap(_all, axis=1),
    "vmap_weights_axis1": _vmap(_weights, axis=1),
    "compile": (t_compile, r_call),
    "compile_grad": (t_compile_grad, r_grad),
    "compile_shapeless": (t_compile_shapeless, r_call),
    "compile_grad_shapeless": (t_compile_grad_shapeless, r_grad),
}


def _normwise(a, ref):
    a = np.asarray(a, dtype=np.float64)
    if a.size == 0:
        return 0.0
    scale = max(float(np.max(np.abs(ref))), 1e-30)
    return float(np.max(np.abs(a - ref))) / scale


def _tols(case, dtype):
    """(from the reference, from the built-in). float64 results of float64
    inputs are exact to float64 rounding; the built-in computes its float64
    norm in float32 (MLX 0.32.4's fallback casts to float32 and back), hence
    1e-6 for it. A float64 result of a float32 input (a float64 weight) holds
    float32 roundings (h = x + residual is stored in float32)."""
    exact = dtype == mx.float64 and all(a.dtype == mx.float64 for a in case.args)
    return (1e-10 if exact else 5e-5), (1e-6 if dtype == mx.float64 else 5e-5)


def check(op, shape, x_dtype, w_dtype, transforms, shapes=None):
    """Runs every transform on ours and on the built-in and returns what
    differs: shapes and dtypes from the built-in's, values from the built-in's
    and from the float64 reference."""
    case = Case(op, shape, x_dtype, w_dtype, shapes)
    # MLX 0.32.4's reductions fail on arrays of no elements: on the CPU some
    # never return (`mx.sum(mx.zeros((8, 0)).T, axis=0)`; its LayerNorm
    # backward hung in about every other process), on the GPU they stop the
    # process (SIGFPE), so the built-in does not run on them: ours is held to
    # the reference's values and shapes, and to the dtypes the built-in gives
    # where every empty dimension is 1.
    empty = case.args[0].size == 0
    problems = []
    filled = Case(op, tuple(d or 1 for d in shape), x_dtype, w_dtype, shapes) if empty else case
    for name in transforms:
        t, r = TRANSFORMS[name]
        if name == "grad_of_grad" and op.np_vjp is None:
            continue
        try:
            theirs = t(op.builtin, filled)
            mx.eval(theirs)
        except Exception:  # the built-in does not take it: neither need we
            continue
        dtypes = [b.dtype for b in theirs]
        theirs = None if empty else theirs
        try:
            ours = t(op.ours, case)
            mx.eval(ours)
        except Exception as e:  # noqa: BLE001
            problems.append(f"{name}: {type(e).__name__}: {e}")
            continue
        ref = r(case)
        if len(ours) != len(ref) or len(ours) != len(dtypes):
            problems.append(f"{name}: {len(ours)} outputs, the reference {len(ref)}, "
                            f"the built-in {len(dtypes)}")
            continue
        for i, (a, c) in enumerate(zip(ours, ref)):
            if tuple(c.shape) != tuple(a.shape) or a.dtype != dtypes[i]:
                problems.append(f"{name}[{i}]: {a.shape} {a.dtype}, reference {c.shape}, "
                                f"built-in's dtype {dtypes[i]}")
                continue
            tol_ref, tol_builtin = _tols(case, a.dtype)
            errors = [("reference", _normwise(_f64(a), c), tol_ref)]
            if theirs is not None:
                b = theirs[i]
                if a.shape != b.shape or a.dtype != b.dtype:
                    problems.append(f"{name}[{i}]: {a.shape} {a.dtype}, built-in {b.shape} {b.dtype}")
                    continue
                errors.append(("built-in", _normwise(_f64(a), _f64(b)), tol_builtin))
            for what, err, tol in errors:
                if not err <= tol:
                    problems.append(f"{name}[{i}]: {err:.2e} from the {what}")
    return problems


# --- the contract ----------------------------------------------------------

# Arrays with no rows, rows of no elements, and leading dimensions of zero.
EMPTY_SHAPES = [(0, 8), (3, 0), (0,), (2, 0, 8), (0, 0)]
# Arrays with values: the same transforms, so that the comparisons above are
# seen to compare something.
SHAPES = [(3, 8), (2, 3, 8), (8,)]
# both, as one parameter list: the empty ones named empty-<shape>
CONTRACT_SHAPES = ([pytest.param(s, id=f"empty-{s}") for s in EMPTY_SHAPES]
                   + [pytest.param(s, id=str(s)) for s in SHAPES])
# (x's dtype and that of every row input, the weight's and bias's). float64
# on the CPU stream (MLX's GPU has none: there the built-in refuses it, and so
# the cases drop out).
DTYPES = [("float32", "float32"), ("float64", "float64"), ("float32", "float64")]


def _transforms(shape):
    # MLX 0.32.4's mx.compile(..., shapeless=True) crashes the process on
    # arrays of zero elements, the built-in's and plain ops' alike (segfault
    # or SIGFPE: `mx.compile(mx.grad(lambda x, w: (x * w).sum(), argnums=(0, 1)),
    # shapeless=True)(mx.zeros((0, 8)), mx.ones((8,)))`): not taken there.
    return [t for t in TRANSFORMS if not ("shapeless" in t and 0 in shape)]



def run_contract(device, op, shape, dtypes, shapes=None, skip=()):
    """check() of OPS[op] on `device`, every transform the shape takes but
    those in `skip`; asserts that nothing differs."""
    if device == mx.gpu and "float64" in dtypes:
        pytest.skip("MLX has no float64 on the GPU (the built-in refuses it alike)")
    with mx.stream(device):
        problems = check(OPS[op], shape, getattr(mx, dtypes[0]), getattr(mx, dtypes[1]),
                         [t for t in _transforms(shape) if t not in skip], shapes)
    assert not problems, "\n".join(problems)


# x and residual as `x + residual` broadcasts them (h's shape last).
BROADCASTS = [
    ((3, 8), (8,)),
    ((3, 8), (1, 8)),
    ((8,), (3, 8)),
    ((1, 8), (3, 8)),
    ((2, 3, 8), (3, 8)),
    ((2, 1, 8), (3, 8)),
    ((3, 1), (3, 8)),
]


def family_contract_tests(ops, add_op, broadcast_skip=lambda shapes: ()):
    """A family's transform-contract tests, for its test module to bind by
    name: test_under_every_transform (every op in `ops`, empty arrays (shape
    ids empty-...) and values) and test_add_broadcasts_like_x_plus_residual
    (add_op with a broadcast x or residual; broadcast_skip(shapes) the
    transforms it leaves out)."""

    @pytest.mark.parametrize("device", DEVICES)
    @pytest.mark.parametrize("dtypes", DTYPES, ids="-".join)
    @pytest.mark.parametrize("shape", CONTRACT_SHAPES)
    @pytest.mark.parametrize("op", ops)
    def test_under_every_transform(device, op, shape, dtypes):
        run_contract(device, op, shape, dtypes)

    @pytest.mark.parametrize("device", DEVICES)
    @pytest.mark.parametrize("dtypes", DTYPES[:2], ids="-".join)
    @pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
    def test_add_broadcasts_like_x_plus_residual(device, shapes, dtypes):
        # gradients of the smaller input summed over the broadcast axes, as
        # the composition's; every transform
        n = np.broadcast_shapes(*shapes)[-1]
        run_contract(device, add_op, (n,), dtypes, shapes=list(shapes), skip=broadcast_skip(shapes))

    return test_under_every_transform, test_add_broadcasts_like_x_plus_residual
