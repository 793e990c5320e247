// Helpers of the primitives' GPU evaluation (gpu_util.cpp defines them),
// shared by both families' eval_gpu: dtypes, device addresses, output and
// scratch memory, recording a kernel into MLX's graph, gathering strided
// inputs, and a whole forward or backward call (ForwardCall, BackwardCall)
// but for its plan, which is the family's. CUDA flavor of MLX only
// (MLX_RMSNORM_CUDA).
#pragma once

#include <cuda.h>

#include <initializer_list>
#include <optional>

#include "mlx/array.h"
#include "mlx/backend/cuda/device.h"
#include "mlx/stream.h"
#include "primitives.h"
#include "rmsnorm.h"  // cuda/: the kernels' launch interface

namespace mlx_rmsnorm::gpu {

namespace mx = mlx::core;

rmsnorm::DType kernel_dtype(mx::Dtype t);
rmsnorm::Algorithm kernel_algorithm(Algorithm a);

// Device addresses. Not array::data(), which would make the buffer host
// accessible now, at record time, while the nodes producing it have not run.
const void* ptr(const mx::array& a);
void* ptr(mx::array& a);

// Output memory: reuse a donatable input of the same size and dtype (every
// kernel of ours reads a row element before it writes it), else allocate
// (device_memory.h says from where).
void allocate(mx::array& out, const mx::Stream& s,
              std::initializer_list<const mx::array*> donors = {});

// A buffer of ours that lives until the graph has run.
mx::array temporary(const mx::Shape& shape, mx::Dtype dtype, const mx::Stream& s,
                    mx::cu::CommandEncoder& enc);

// A kernel with a compiled-in thread-block cluster shape, recorded as a child
// graph of its one kernel node under a key that names the shape ("(K2)", as
// MLX keys its own child graphs). MLX caches instantiated graphs by their
// nodes' keys and updates a cached one in place with the next graph of the
// same key; every plain kernel node is "K", and an update between a cluster
// node and a plain one kept the old cluster shape (the plain kernel then did
// not run). Under its own key a cluster launch only ever updates another of
// the same shape. `args` is copied into the node.
void record_cluster(mx::cu::CommandEncoder& enc, const rmsnorm::KernelCall& c,
                    const void* args);

// Records one kernel as a graph node, launched by its driver handle (MLX's
// runtime cannot launch a kernel registered in ours). The node copies the
// Args struct, which every kernel takes by value.
template <typename Args>
void record(mx::cu::CommandEncoder& enc, const rmsnorm::KernelCall& c, Args args) {
  if (c.cluster > 1) return record_cluster(enc, c, &args);
  enc.add_kernel_node_ex(reinterpret_cast<CUfunction>(c.fn), c.grid, c.block,
                         dim3(), c.smem, args);
}

// Records a backward plan (RMSNorm, the fused add, LayerNorm): the fp32
// scratch its plan asks for (a temporary bound into `a`), then its kernels in
// order. `inputs` are what the chain reads (nulls skipped), `gx` the row
// gradient, `column_sums` gw / gb where wanted (nulls skipped).
void record_backward(mx::cu::CommandEncoder& enc, const mx::Stream& s,
                     const rmsnorm::Plan& plan, rmsnorm::BwdArgs& a,
                     std::initializer_list<const mx::array*> inputs, mx::array& gx,
                     std::initializer_list<mx::array*> column_sums);

// Our kernels run through our own copy of the CUDA runtime, whose current
// device is separate from MLX's: point it at the stream's device.
void use_device(const mx::Stream& s);

// `in` as row-contiguous memory: itself, or (a view: transposed, sliced,
// broadcast) a copy gathered on the GPU into `copy`. With `aligned16`, also a
// copy when the data does not start on a 16-byte boundary (kernels that read
// 16-byte vectors only).
const mx::array& rows_of(const mx::array& in, std::optional<mx::array>& copy,
                         const mx::Stream& s, mx::cu::CommandEncoder& enc,
                         bool aligned16 = false);

// A forward call of `prim` (RMSNorm or LayerNorm, with add or not), ready
// for its plan: the row inputs made row-contiguous (with `aligned16`, also
// 16-byte aligned: kernels that read 16-byte vectors only), y (and with add
// h) allocated, `args` filled. run(plan) records the plan's kernels. Not
// copyable: args points into it.
struct ForwardCall {
  ForwardCall(NormPrimitive& prim, const std::vector<mx::array>& inputs,
              std::vector<mx::array>& outputs, bool aligned16);
  ForwardCall(const ForwardCall&) = delete;
  ForwardCall& operator=(const ForwardCall&) = delete;
  void run(const rmsnorm::Plan& plan);

  mx::cu::CommandEncoder& enc;
  rmsnorm::FwdArgs args{};

 private:
  // w and b as the primitive hands them out (NormPrimitive::weight / bias
  // return copies): held here, since w_ and b_ may point at them until run().
  std::optional<mx::array> w_in_, b_in_;
  std::optional<mx::array> x_copy_, r_copy_, w_copy_, b_copy_;
  const mx::array* x_;
  const mx::array *res_, *w_, *b_;  // null: absent
  mx::array* y_;
  mx::array* h_;  // null without add
};

// A backward call of `prim` (RMSNormVJP or LayerNormVJP), likewise: inputs
// (x, [w], [b], g, [g_h]); b only gives gb its dtype (the kernels do not read
// it). Outputs gx, [gw], [gb].
struct BackwardCall {
  BackwardCall(NormPrimitive& prim, const std::vector<mx::array>& inputs,
               std::vector<mx::array>& outputs, bool aligned16);
  BackwardCall(const BackwardCall&) = delete;
  BackwardCall& operator=(const BackwardCall&) = delete;
  void run(const rmsnorm::Plan& plan);

  mx::cu::CommandEncoder& enc;
  rmsnorm::BwdArgs args{};

 private:
  mx::Stream s_;
  std::optional<mx::array> w_in_;  // as in ForwardCall: w_ may point at it
  std::optional<mx::array> x_copy_, w_copy_, g_copy_, gh_copy_;
  const mx::array* x_;
  const mx::array *w_, *g_, *gh_;  // w_, gh_ null: absent
  mx::array* gx_;
  mx::array *gw_, *gb_;  // null: not wanted
};

}  // namespace mlx_rmsnorm::gpu
