"""The lab: the sweeps, probes and measurements behind docs/NOTES.md, apart
from the product (not in the wheel: setup.py packages mlx_rmsnorm only).
Run from the repository root, each module as ``python -m lab.NAME`` (or by
its path where the step must not put the repository on sys.path first);
``bash scripts/gpu_run.sh --help`` lists the GPU machine's steps that run
them.

  sweep             every mlx-lm architecture, tiny, under the built-in,
                    patch() and patch(fuse=True) (configs, judge, runner,
                    report; tests/test_architectures.py runs its subset)
  tiny              tiny mlx-lm models of the architectures patch(fuse=True)
                    rewrites, from the sweep's configs (the fuse tests')
  host_cost         host time outside the kernels: per call (calls), a
                    decode step's graph (step), one block (block), a decode
                    token's build and eval by variant (decode)
  cuda_calls        CUDA API calls and kernel GPU time per eval (CUPTI;
                    cuda_calls.cpp); timelines of whole workloads, built-in
                    against the plugin (busy time, gaps, what the host was in)
  decode_kernels    decode-step forward kernels under Nsight Compute
  profile_training  kernel times at training shapes under Nsight Compute
  profile_case      one norm direction, for a profiler to catch
  weight_reads      the forward's read of w and b as x (with or without b)
                    against its general read (fp32 weights) at long rows
  sanitize_cases    small cases for compute-sanitizer
  memory_check      active memory flat over many shape-changing steps
  mismatch_check    the error of a build without code for the GPU
  cpu_speed         the norm on a CPU stream: built-in against the plugin
  sass_compare      two builds' SASS, function by function
  tuner_ab          a kernel change against a base revision, each tuner
                    (cuda/cli) built here for both and run interleaved on
                    the GPU (pack here, the tune-ab step there)
  bench_ab          plan-row variants through MLX side by side: the table
                    of the bench-ab step (each variant a patched copy of
                    the tree, built and run on the GPU)
  plan_dump         the planners' launch plans on a model GPU (no GPU;
                    plan_dump.cu): two builds' plans side by side; its
                    --check (every plan well formed) runs in .ci/run
"""
