"""M from 1024 to 65536 at N = 2048, 4096, 8192, the nine-shape table's
contenders."""

from __future__ import annotations

from .core import Section
from .table import table_contenders

SWEEP_N = [2048, 4096, 8192]
SWEEP_M = [1024, 2048, 4096, 8192, 16384, 32768, 65536]

SECTIONS = {
    "sweep": Section(
        lambda: [(m, n) for n in SWEEP_N for m in SWEEP_M], [(64, 1024), (128, 1024)],
        table_contenders, layout="impl", title="sweep",
        about="M from 1024 to 65536 at N = 2048, 4096, 8192 (the table's contenders)"),
}
