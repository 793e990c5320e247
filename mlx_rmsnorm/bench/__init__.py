"""Benchmark of mlx-rmsnorm against MLX's built-in norms:
`python -m mlx_rmsnorm.bench --help`.

One module per section (table, sweep, training, decode, layernorm, fused,
generation) over a shared core: `core` (inputs, the interleaved timing, the
copy ceiling, statistics, progress), `output` (CSV, JSON, plot, tables),
`registry` (the sections in run order), `cli` (the command line).
"""

from .cli import main, parse_shapes
from .fused import FUSED_IMPLS
from .registry import SECTION_SPECS, SECTIONS, cases, contenders

__all__ = ["FUSED_IMPLS", "SECTIONS", "SECTION_SPECS", "cases", "contenders", "main",
           "parse_shapes"]
