// GPU evaluation: records our kernels (cuda/) into MLX's CUDA graph. Built
// only against the CUDA flavor of MLX; the CPU flavor gets a clear error.
#include "rms_norm.h"
#include "rms_norm_vjp.h"

#ifdef MLX_RMSNORM_CUDA

#include <cuda.h>

#include "device_memory.h"
#include "mlx/backend/cuda/device.h"
#include "rmsnorm.h"  // cuda/: the kernels' launch interface

namespace mlx_rmsnorm {

namespace {

rmsnorm::DType kernel_dtype(mx::Dtype t) {
  switch (t) {
    case mx::float32:
      return rmsnorm::DType::F32;
    case mx::float16:
      return rmsnorm::DType::F16;
    case mx::bfloat16:
      return rmsnorm::DType::BF16;
    default:
      throw std::runtime_error("[mlx_rmsnorm] unsupported dtype on the GPU");
  }
}

// Device addresses. Not array::data(), which would make the buffer host
// accessible now, at record time, while the nodes producing it have not run.
const void* ptr(const mx::array& a) { return mx::gpu_ptr<void>(a); }
void* ptr(mx::array& a) { return mx::gpu_ptr<void>(a); }

// Output memory: reuse a donatable input of the same size and dtype (every
// kernel of ours reads a row element before it writes it), else allocate
// (device_memory.h says from where).
void allocate(mx::array& out, const mx::Stream& s,
              std::initializer_list<const mx::array*> donors = {}) {
  for (const mx::array* d : donors) {
    if (d && d->is_donatable() && d->dtype() == out.dtype() &&
        d->flags().row_contiguous && d->size() == out.size()) {
      out.copy_shared_buffer(*d);
      return;
    }
  }
  allocate_device(out, s.device.index);
}

mx::array scratch(size_t bytes, const mx::Stream& s, mx::cu::CommandEncoder& enc) {
  mx::array a({static_cast<int>((bytes + 3) / 4)}, mx::float32, nullptr, {});
  allocate(a, s);
  enc.add_temporary(a);
  return a;
}

// Records one kernel as a graph node, launched by its driver handle (MLX's
// runtime cannot launch a kernel registered in ours). The node copies the
// Args struct, which every kernel takes by value.
template <typename Args>
void record(mx::cu::CommandEncoder& enc, const rmsnorm::KernelCall& c, Args args) {
  enc.add_kernel_node_ex(reinterpret_cast<CUfunction>(c.fn), c.grid, c.block,
                         dim3(), c.smem, args);
}

// Our kernels run through our own copy of the CUDA runtime, whose current
// device is separate from MLX's: point it at the stream's device.
void use_device(const mx::Stream& s) {
  cudaError_t err = cudaSetDevice(s.device.index);
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("[mlx_rmsnorm] cudaSetDevice: ") +
                             cudaGetErrorString(err));
  }
}

}  // namespace

void RMSNorm::eval_gpu(const std::vector<mx::array>& inputs,
                       std::vector<mx::array>& outputs) {
  const mx::array& x = inputs[0];
  mx::array& y = outputs[0];
  auto& enc = mx::cu::get_command_encoder(stream());
  use_device(stream());
  allocate(y, stream(), {&x});

  rmsnorm::FwdArgs a{};
  a.x = ptr(x);
  a.w = has_weight_ ? ptr(inputs[1]) : nullptr;
  a.y = ptr(y);
  a.n = x.shape(-1);
  a.rows = a.n == 0 ? 0 : static_cast<int64_t>(x.size() / a.n);
  a.eps = eps_;
  a.x_dtype = kernel_dtype(x.dtype());
  a.w_dtype = has_weight_ ? kernel_dtype(inputs[1].dtype()) : rmsnorm::DType::None;
  a.y_dtype = kernel_dtype(y.dtype());

  rmsnorm::Plan plan = rmsnorm::plan_forward(a);
  for (auto& in : inputs) enc.set_input_array(in);
  enc.set_output_array(y);
  for (const auto& c : plan.calls) record(enc, c, a);
}

void RMSNormVJP::eval_gpu(const std::vector<mx::array>& inputs,
                          std::vector<mx::array>& outputs) {
  const mx::array& x = inputs[0];
  const mx::array& g = inputs.back();
  mx::array& gx = outputs[0];
  auto& enc = mx::cu::get_command_encoder(stream());
  use_device(stream());
  allocate(gx, stream(), {&x, &g});
  if (has_weight_) allocate(outputs[1], stream());

  rmsnorm::BwdArgs a{};
  a.x = ptr(x);
  a.w = has_weight_ ? ptr(inputs[1]) : nullptr;
  a.g = ptr(g);
  a.gx = ptr(gx);
  a.gw = has_weight_ ? ptr(outputs[1]) : nullptr;
  a.n = x.shape(-1);
  a.rows = a.n == 0 ? 0 : static_cast<int64_t>(x.size() / a.n);
  a.eps = eps_;
  a.x_dtype = kernel_dtype(x.dtype());
  a.w_dtype = has_weight_ ? kernel_dtype(inputs[1].dtype()) : rmsnorm::DType::None;
  a.g_dtype = kernel_dtype(g.dtype());

  auto plan = rmsnorm::plan_backward(
      a, static_cast<rmsnorm::Algorithm>(static_cast<int>(algorithm_)));
  std::optional<mx::array> tmp;
  if (plan.scratch_bytes > 0) {
    tmp = scratch(plan.scratch_bytes, stream(), enc);
    rmsnorm::bind_scratch(a, plan, ptr(*tmp));
  }
  // MLX orders graph nodes by the arrays declared before each one: every
  // node of the chain reads the inputs and the scratch and writes the outputs
  // and the scratch, so the chain runs in order.
  for (const auto& c : plan.calls) {
    for (auto& in : inputs) enc.set_input_array(in);
    if (tmp) enc.set_input_array(*tmp);
    if (tmp) enc.set_output_array(*tmp);
    for (auto& o : outputs) enc.set_output_array(o);
    record(enc, c, a);
  }
}

}  // namespace mlx_rmsnorm

#else  // CPU flavor of MLX

namespace mlx_rmsnorm {

[[noreturn]] static void no_gpu() {
  throw std::runtime_error(
      "[mlx_rmsnorm] this build has no GPU kernels: it was built against the "
      "CPU flavor of MLX. Install MLX with CUDA (pip install 'mlx[cuda13]') "
      "and rebuild mlx-rmsnorm, or run on the CPU stream.");
}

void RMSNorm::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  no_gpu();
}
void RMSNormVJP::eval_gpu(const std::vector<mx::array>&,
                          std::vector<mx::array>&) {
  no_gpu();
}

}  // namespace mlx_rmsnorm

#endif
