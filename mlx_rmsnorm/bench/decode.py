"""The forward at text-generation shapes: tiny tensors, where the host's cost
of building and launching a call is the time, so the figure counts graph
building too, with many calls per eval as a decode step makes them."""

from __future__ import annotations

from .core import Section, fwd_figures

# (rows, N) for the hidden-size norms; (rows, heads, 128) for QK-norm (one
# token each of `rows` sequences, every head normalised).
DECODE_ROWS = [1, 8, 64]
DECODE_N = [1024, 2048, 4096, 8192]
DECODE_HEADS = [8, 32]
DECODE_HEAD_DIM = 128
DECODE_CALLS = 64  # a decode step makes ~100 norm calls between evals


def decode_contenders(w, gpu):
    return fwd_figures(w)


def decode_shapes():
    return ([(r, n) for n in DECODE_N for r in DECODE_ROWS]
            + [(r, h, DECODE_HEAD_DIM) for h in DECODE_HEADS for r in DECODE_ROWS])


SECTIONS = {
    "decode": Section(
        decode_shapes, [(1, 1024), (8, 2048), (1, 8, 128)], decode_contenders,
        count_build=True, min_calls=DECODE_CALLS, title="decode",
        about="the forward at text-generation shapes (1, 8, 64 rows of N = 1024-8192, "
              "and QK-norm rows of 128 for 8 and 32 heads): tiny tensors, where "
              "building and launching a call is the time, so this figure counts "
              "graph building too"),
}
