// Launch interface of the RMSNorm kernels: plain C++ and the CUDA runtime,
// no MLX. The MLX glue (mlx_rmsnorm/csrc/gpu_util.cpp, {rms,layer}_norm_gpu.cpp) and the standalone CLI
// (cuda/cli/rmsnorm_backward.cu) both drive the kernels through this header.
//
// A call is planned in two steps:
//   1. plan_forward / plan_backward pick the kernels from the launch-plan
//      tables (cuda/plans.h) and say how much fp32 scratch they need;
//   2. the caller allocates that scratch, fills in the Args and records every
//      KernelCall in order (each kernel takes the one Args struct by value).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rmsnorm {

// Storage types the kernels read and write. `None` marks an absent weight.
enum class DType : int { F32 = 0, F16 = 1, BF16 = 2, None = 3 };

inline std::size_t dtype_size(DType t) {
  return t == DType::F32 ? 4 : (t == DType::None ? 0 : 2);
}
const char* dtype_name(DType t);

// Backward algorithms. Auto picks Persistent when a row fits its tables and
// Split otherwise; Naive is the seed's 3-kernel baseline.
enum class Algorithm : int { Auto = 0, Persistent = 1, Split = 2, Naive = 3 };
const char* algorithm_name(Algorithm a);

// y = x * rsqrt(mean(x^2) + eps) * (offset + w), over rows of length n.
struct FwdArgs {
  const void* x;  // rows x n, dtype x_dtype
  const void* w;  // n, dtype w_dtype, or nullptr
  void* y;        // rows x n, dtype y_dtype
  int64_t rows;
  int n;
  float eps;
  DType x_dtype, w_dtype, y_dtype;
  // LayerNorm only (row_math.cuh LayerRow): y += b; n, dtype b_dtype, or
  // nullptr (no bias). Appended so that the RMSNorm kernels keep their layout.
  const void* b;
  DType b_dtype;
  // Fused residual add (add_rms_norm): with `residual` set, the row normed is
  // h = x + residual rounded to x_dtype, and h is written too.
  const void* residual = nullptr;  // rows x n, x_dtype
  void* h = nullptr;               // rows x n, x_dtype
  float offset = 0.f;  // the scale is offset + w, formed in fp32 (Gemma: 1)
};

// gx, gw of y = rmsnorm(x) * w against the incoming gradient g.
struct BwdArgs {
  const void* x;  // rows x n, x_dtype
  const void* w;  // n, w_dtype, or nullptr (then gw is not computed)
  const void* g;  // rows x n, g_dtype
  void* gx;       // rows x n, x_dtype
  void* gw;       // n, w_dtype; nullptr: no gw wanted (no weight, or frozen)
  // Scratch laid out by the plan (fp32): column partials of gw, per-row
  // statistics and, for the naive chain, its M x n partial in x_dtype.
  float* partials;   // partial_rows x n
  float* row_stats;  // rows x 2 (Split only)
  void* naive_rows;  // rows x n in x_dtype (Naive only)
  int64_t rows;
  int n;
  float eps;
  DType x_dtype, w_dtype, g_dtype;
  int partial_rows;  // rows of `partials` that the gw column sum adds up
  // LayerNorm only: gb (n, b_dtype), or nullptr (no bias, or frozen). Its
  // partials follow gw's in the scratch: partials + partial_rows * n.
  void* gb;
  DType b_dtype;
  // Fused residual add's backward: x is the forward's h, and gx = gh + the
  // norm's gradient (gh: rows x n in x_dtype, the cotangent of h). Only the
  // persistent and split plans take it.
  const void* gh = nullptr;
  float offset = 0.f;  // the scale is offset + w, formed in fp32 (Gemma: 1)
};

// out = x + g elementwise (dtype t): the copy-bandwidth ceiling of the
// benchmarks, the same traffic as the backward (two reads, one write).
struct CopyArgs {
  const void* x;
  const void* g;
  void* out;
  int64_t count;
  DType dtype;
};

// dst = a row-contiguous copy of src, an array of `ndim` dimensions with the
// given shape and strides (in elements; 0 for a broadcast dimension).
inline constexpr int kGatherMaxDims = 8;
struct GatherArgs {
  const void* src;
  void* dst;
  int64_t count;
  int elem_bytes;  // 2, 4 or 8
  int ndim;
  int64_t shape[kGatherMaxDims];
  int64_t strides[kGatherMaxDims];
};

struct KernelCall {
  const void* host_fn;  // the kernel's host stub, for cudaLaunchKernel
  cudaFunction_t fn;    // driver handle: MLX's encoder needs a CUfunction
  dim3 grid, block;
  unsigned smem;
  const char* name;
  // Blocks of a thread-block cluster, compiled into the kernel (1: none). A
  // caller recording into a cached, updatable CUDA graph must keep cluster
  // launches from being updated into plain ones or back (MLX's glue records
  // them as child graphs keyed by this shape).
  int cluster = 1;
};

struct Plan {
  std::vector<KernelCall> calls;
  std::size_t scratch_bytes = 0;  // fp32 scratch the caller must provide
  int partial_rows = 0;           // copy into BwdArgs::partial_rows
  std::size_t partials_offset = 0, row_stats_offset = 0, naive_offset = 0;
  // (backward) the last call that what reads gx waits for: the call that
  // writes gx, where the calls after it only finish gw (column sums) and
  // may run beside what reads gx; a later one where they must not
  // (layer_norm.cu says why).
  int gx_call = 0;
  Algorithm algorithm = Algorithm::Auto;
};

// Widest element count per 16-byte access that the pointers and n allow.
int vector_width(DType t, int n, std::initializer_list<const void*> ptrs);

Plan plan_forward(const FwdArgs& a);
Plan plan_backward(const BwdArgs& a, Algorithm algorithm);
Plan plan_copy(const CopyArgs& a);  // pointers must be 16-byte aligned
Plan plan_gather(const GatherArgs& a);

// LayerNorm (layer_norm.cu): the same walks with row_math.cuh's LayerRow and
// the plans.h kLayer* tables; FwdArgs::b and BwdArgs::gb carry the bias and
// its gradient. Both planners need 16-byte rows (n a multiple of the vector,
// 16-byte aligned pointers) and a table row: layer_norm_planned says whether
// both directions have one for rows of n elements of x_dtype with g (and y)
// in g_dtype on the current device; the planners throw std::invalid_argument
// where it says no.
// The fused residual add (add_layer_norm: h = x + residual, y = layer_norm(h),
// outputs y and h) runs on the same planners, as add_rms_norm's does: the
// forward with FwdArgs::residual and FwdArgs::h set, the backward with x = the
// forward's h and BwdArgs::gh = the cotangent of h (gx = gh + d(norm)/dh, the
// gradient of x and residual alike); `add` asks layer_norm_planned about that
// backward (g_h takes shared memory beside x and g).
bool layer_norm_planned(DType x_dtype, DType g_dtype, int n, bool add = false);
Plan plan_layer_forward(const FwdArgs& a);
Plan plan_layer_backward(const BwdArgs& a);

// Fill the scratch pointers of `a` from a base pointer of plan.scratch_bytes.
void bind_scratch(BwdArgs& a, const Plan& plan, void* scratch);

// Makes `device` current for the kernels of this build, which run through
// their own copy of the CUDA runtime (its current device is not MLX's). Per
// thread, like the runtime's; cudaSetDevice only when the device changes, so
// a steady stream of calls on one GPU makes no runtime call here.
void use_device(int device);

// The plan family (90, 80 or 75, plans.h) of the current device's code; throws
// std::runtime_error when this build has no code for the device.
int device_family();

// A new graph (the caller destroys it) of the one launch `c` with `args`:
// how a cluster launch enters a cached graph of MLX's (KernelCall::cluster).
cudaError_t kernel_graph(const KernelCall& c, const void* args, cudaGraph_t* graph);

// Launch a plan on a stream with <<<>>>-equivalent runtime calls (CLI).
// `args` points at the FwdArgs, BwdArgs or CopyArgs the plan was made for.
cudaError_t launch(const Plan& plan, const void* args, cudaStream_t stream);

}  // namespace rmsnorm
