"""The sections of the benchmark, in run order. A new section is a module
here that defines SECTIONS ({name: core.Section}) and one more name in
MODULES."""

from __future__ import annotations

import importlib

MODULES = (
    "table",
    "sweep",
    "training",
    "decode",
    "layernorm",
)

SECTION_SPECS = {}
for _module in MODULES:
    SECTION_SPECS.update(importlib.import_module(f"{__package__}.{_module}").SECTIONS)
del _module

SECTIONS = [name for name, spec in SECTION_SPECS.items() if spec.default]  # a run naming none
QUICK = {name: spec.quick for name, spec in SECTION_SPECS.items()}


def contenders(kind, w, gpu=True):
    """[(direction, impl, fn(x, g))]: one shape's figures. The ceilings come
    first only for readability; every repeat rotates the order anyway."""
    return SECTION_SPECS[kind].contenders(w, gpu)


def cases(sections, quick, shapes=None):
    """[(kind, shape)] in run order; shape is (M, N) or (rows, heads, N).
    `shapes` replaces every section's own list."""
    out = []
    for kind in sections:
        spec = SECTION_SPECS[kind]
        chosen = shapes or (spec.quick if quick else spec.shapes())
        out += [(kind, tuple(s)) for s in chosen]
    return out
