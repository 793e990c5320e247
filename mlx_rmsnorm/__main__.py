"""python -m mlx_rmsnorm [--report] [--fuse] (-m MODULE | MODULE | SCRIPT.py) [ARGS...]

Runs a module (``python -m MODULE ARGS``) or a script with
``mx.fast.rms_norm`` and ``mx.fast.layer_norm`` -- and with them every
``nn.RMSNorm`` and ``nn.LayerNorm`` -- routed through
the plugin, the way ``python -m cProfile`` wraps a program. For mlx-lm's
command-line tools:

    python -m mlx_rmsnorm mlx_lm lora --model ... --train --data ...
    python -m mlx_rmsnorm -m mlx_lm.lora --model ...
    python -m mlx_rmsnorm train.py --steps 100

A first argument that names an existing file or ends in ``.py`` is a script;
otherwise a module. ``--report`` (or MLX_RMSNORM_REPORT=1) prints at exit
what ran: how many of our primitives and the built-in's the run's gradient
graphs held, the forward ops built, and which implementation the default
device runs. ``--fuse`` is ``patch(fuse=True)``: mlx-lm's decoder blocks run
their residual add and norm as one op (``add_rms_norm``; ``add_layer_norm``
in LayerNorm blocks), for the architectures ``fused_architectures()`` lists:
{architectures}
Without this wrapper, MLX_RMSNORM_PATCH=1 patches any program in the
environment (docs/api.md: "Patching programs you do not edit").
"""

from __future__ import annotations

import os
import runpy
import sys

USAGE = "usage: python -m mlx_rmsnorm [--report] [--fuse] (-m MODULE | MODULE | SCRIPT.py) [ARGS...]"

_fuse = False  # --fuse (set by _parse; keeps _parse's return shape)


def _parse(argv: list[str]) -> tuple[bool, str, str, list[str]]:
    global _fuse
    report = _fuse = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            print(_help())
            raise SystemExit(0)
        if a == "--report":
            report = True
            i += 1
            continue
        if a == "--fuse":
            _fuse = True
            i += 1
            continue
        if a == "-m":
            if i + 1 >= len(argv):
                break
            return report, "module", argv[i + 1], argv[i + 2 :]
        if a.startswith("-"):
            print(f"{USAGE}\nunknown option {a!r}", file=sys.stderr)
            raise SystemExit(2)
        kind = "script" if (a.endswith(".py") or os.path.isfile(a)) else "module"
        return report, kind, a, argv[i + 1 :]
    print(USAGE, file=sys.stderr)
    raise SystemExit(2)


def _help() -> str:
    from mlx_rmsnorm import fused_architectures

    import textwrap

    names = textwrap.fill(", ".join(fused_architectures()), width=76, initial_indent="    ",
                          subsequent_indent="    ")
    return __doc__.strip().replace("{architectures}", names)


def _check_target(kind: str, target: str) -> None:
    """One line, not runpy's traceback, for a script or module that is not there."""
    if kind == "script":
        found = os.path.isfile(target)
    else:
        import importlib.util

        try:
            found = importlib.util.find_spec(target) is not None
        except (ImportError, ValueError):  # a parent package that is missing, or a bad name
            found = False
    if not found:
        what = "script" if kind == "script" else "module"
        print(f"python -m mlx_rmsnorm: no {what} named {target!r}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    report, kind, target, args = _parse(sys.argv[1:] if argv is None else argv)
    import mlx_rmsnorm
    from mlx_rmsnorm import _autopatch

    mlx_rmsnorm.patch(fuse=_fuse)
    if report:
        _autopatch.install_report()
    _check_target(kind, target)
    sys.argv = [target, *args]  # (run_module puts the module's file in argv[0])
    if kind == "module":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main()
