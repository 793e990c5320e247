"""Every mlx-lm architecture, built tiny, under MLX's built-in norms, under
``patch()`` and under ``patch(fuse=True)``.

For each model module of the installed ``mlx_lm.models`` (a module with a
``ModelArgs`` dataclass and a ``Model``) the sweep fills the fields of
``ModelArgs`` with small values (GENERIC, then the per-module OVERRIDES),
builds the model with a fixed seed, perturbs every float parameter a little
(so that no two norm weights are equal and a swapped weight shows), and runs,
in float32 and in bfloat16 (the float32 parameters cast):

* ``logits``: the forward of one batch without a cache;
* ``cache``: the same tokens through ``make_prompt_cache``: a prefill, then
  two one-token decode steps (the logits of all steps, concatenated);
* ``grad:<param>``: the gradients of a cross-entropy loss with respect to
  every trainable parameter (``nn.value_and_grad``).

Modes: ``builtin`` (run twice, to know whether the built-in is bitwise
reproducible), ``patch`` (``patch()``), ``fuse`` (``patch(fuse=True)``) and
``unpatched`` (the built-in again after ``unpatch()``). Verdicts:

* float32: every quantity within ``FP32_TOL`` (1e-5) relative to the built-in:
  ``max|a - b| / max|b|``, for a gradient ``max|b|`` at least
  ``FP32_GRAD_FLOOR`` (1e-2) of the model's largest gradient (a gradient that
  is zero in exact arithmetic, such as a router's behind a top-k, is rounding
  noise in both). Where that fails, the built-in in float64 (on the CPU stream)
  decides: the mode matches if it is no more than ``FP64_SLACK`` (2) times as
  far from float64 as the built-in is (the built-in is itself further than
  1e-5 from the exact value there); such quantities are listed (``*_by_fp64``).
  Where the built-in is not reproducible run to run (the gather / scatter
  backwards of MoE models on a GPU), a quantity within ``NOISE_SLACK`` (2)
  times the built-in's own run-to-run distance matches (``*_by_noise``).
  Float32 matmuls run in float32 (``MLX_ENABLE_TF32=0``, unless set): TF32
  would carry a norm's last-bit differences into 1e-4 of the next matmul;
* bfloat16: the mode as close to float32 as the built-in is. Per quantity and
  token batch, r = rms_rel(mode, fp32 built-in) / rms_rel(bf16 built-in, fp32
  built-in), normwise (``||a - b|| / ||b||``). Over ``BF16_BATCHES`` (3) token
  batches, the geometric mean of all r at most ``BF16_MEAN`` (1.25) and, per
  quantity, the geometric mean over batches at most ``BF16_MAX`` (3) (there the
  denominator is at least the median error of the built-in in that batch). One
  batch's ratios move together -- an error early in the graph reaches every
  gradient -- so one batch's mean scatters from 0.8 to 1.35 between token
  draws for a mode that computes the same thing; hence several batches and a
  line above 1. The distance of the mode to the bf16 built-in over the
  built-in's own is reported beside it (``*_vs_builtin_gmean``): it sits near
  sqrt(2) for two equally good roundings, so it makes a poor pass line.
  Quantities that the bf16 built-in gets more than ``BF16_NOISE`` (25 %) wrong
  in some batch (scalar parameters summed over every element: apertus's xIELU
  alpha / beta / eps, 20 % to 150 % off) are left out of the bf16 verdict and
  counted (``bf16_noise``); float32 still checks them. Where a mode fails
  that line, a control decides: the built-in model with its norms computed
  exactly in float32 and rounded once (``exact``, MLX ops; the built-in's
  kernel rounds twice, ``w * bf16(x * rstd)``). A top-k router turns a last-bit
  difference into another expert, so in MoE models any other rounding of the
  norms, however good, can sit 2x further from float32 than the built-in's on
  a few batches. The mode matches (``*_by_control``) when it is no further
  from float32 than that control, within ``CONTROL_SLACK`` (1.25), on both
  lines;
* ``unpatched`` equals the first built-in run bit for bit where the built-in
  is reproducible run to run; a built-in that is not, or that raises, is
  recorded as the built-in's (``builtin_note``), not as a mismatch.

On the CPU, ``patch()`` runs MLX's built-in on CPU streams unless
``mlx_rmsnorm.route_cpu(True)``; the sweep turns that on so that it
compares the plugin and not the built-in with itself. On a
CUDA machine the default device is the GPU and everything runs there.

A model whose float32 built-in forward raises is "not built" (its config is
not one the model takes, or it does not run here), with the first line of the
exception; one whose built-in raises only in bfloat16 or only in the cache or
gradient part is built, and the note says where the built-in raises. Each
model runs in its own process (``--in-process`` to run them all in this one):
a model that crashes the interpreter is "not built", with the phase it died in.

CLI (from the repository root)::

    python -m lab.sweep [--quick] [--models a,b] \
        [--dtypes float32,bfloat16] [--out DIR] [--in-process] [--jobs N]

prints a markdown table, the counts (found / built / matched per mode and
dtype / fused) and what was not built and why, and writes ``arch_sweep.csv``
and ``arch_sweep.json`` to ``--out``. Exit status 1 when some built model does
not match. ``tests/test_architectures.py`` runs the quick subset
(``MLX_RMSNORM_FULL_SWEEP=1``: all of them).

Modules: ``configs`` (the tiny configs, discovering and building),
``judge`` (the verdicts' lines and the summary), ``runner`` (the modes, one
model, every model), ``report`` (markdown, csv, json), ``__main__`` (the CLI).
"""
