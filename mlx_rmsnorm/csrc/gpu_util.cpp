// The helpers of the primitives' GPU evaluation (gpu_util.h).
#ifdef MLX_RMSNORM_CUDA

#include "gpu_util.h"

#include "device_memory.h"

namespace mlx_rmsnorm {

namespace gpu {

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

const void* ptr(const mx::array& a) { return mx::gpu_ptr<void>(a); }
void* ptr(mx::array& a) { return mx::gpu_ptr<void>(a); }

void allocate(mx::array& out, const mx::Stream& s,
              std::initializer_list<const mx::array*> donors) {
  for (const mx::array* d : donors) {
    if (d && d->is_donatable() && d->dtype() == out.dtype() &&
        d->flags().row_contiguous && d->size() == out.size()) {
      out.copy_shared_buffer(*d);
      return;
    }
  }
  allocate_device(out, s.device.index);
}

mx::array temporary(const mx::Shape& shape, mx::Dtype dtype, const mx::Stream& s,
                    mx::cu::CommandEncoder& enc) {
  mx::array a(shape, dtype, nullptr, {});
  allocate(a, s);
  enc.add_temporary(a);
  return a;
}

// Our kernels run through our own copy of the CUDA runtime: see
// rmsnorm::use_device (no runtime call while the device stays the same).
void use_device(const mx::Stream& s) { rmsnorm::use_device(s.device.index); }

const mx::array& rows_of(const mx::array& in, std::optional<mx::array>& copy,
                         const mx::Stream& s, mx::cu::CommandEncoder& enc,
                         bool aligned16) {
  if (in.flags().row_contiguous &&
      (!aligned16 || reinterpret_cast<uintptr_t>(ptr(in)) % 16 == 0))
    return in;
  copy = temporary(in.shape(), in.dtype(), s, enc);
  rmsnorm::GatherArgs a{};
  a.src = ptr(in);
  a.dst = ptr(*copy);
  a.count = static_cast<int64_t>(in.size());
  a.elem_bytes = static_cast<int>(in.itemsize());
  a.ndim = static_cast<int>(in.ndim());
  for (int d = 0; d < a.ndim && d < rmsnorm::kGatherMaxDims; ++d) {
    a.shape[d] = in.shape(d);
    a.strides[d] = in.strides()[d];
  }
  const rmsnorm::Plan plan = rmsnorm::plan_gather(a);
  for (const auto& c : plan.calls) {
    enc.set_input_array(in);
    enc.set_output_array(*copy);
    record(enc, c, a);
  }
  return *copy;
}

void record_backward(mx::cu::CommandEncoder& enc, const mx::Stream& s,
                     const rmsnorm::Plan& plan, rmsnorm::BwdArgs& a,
                     std::initializer_list<const mx::array*> inputs, mx::array& gx,
                     std::initializer_list<mx::array*> column_sums) {
  std::optional<mx::array> tmp;
  if (plan.scratch_bytes > 0) {
    // fp32 scratch (the column partials, row statistics)
    tmp = temporary({static_cast<int>((plan.scratch_bytes + 3) / 4)}, mx::float32, s, enc);
    rmsnorm::bind_scratch(a, plan, ptr(*tmp));
  }
  // MLX orders graph nodes by the arrays declared before each one, and a
  // node that reads an array waits for the last node that declared it as an
  // output. The inputs are declared once, before the chain's first node:
  // declared again, their bytes would count again toward the size at which
  // MLX commits its graph (1000 MB on Hopper; a 32768 x 4096 bf16 backward
  // then ended a graph at every call, 0.95x the built-in, instead of every
  // other one). The nodes of the chain follow each other through the
  // scratch and the column sums; gx is declared up to the node that writes
  // it, so what reads gx need not wait for the column sums that finish gw.
  for (std::size_t i = 0; i < plan.calls.size(); ++i) {
    if (i == 0)
      for (const mx::array* in : inputs)
        if (in) enc.set_input_array(*in);
    if (tmp) {
      enc.set_input_array(*tmp);
      enc.set_output_array(*tmp);
    }
    if (i <= static_cast<std::size_t>(plan.gx_call)) enc.set_output_array(gx);
    for (mx::array* out : column_sums)
      if (out) enc.set_output_array(*out);
    record(enc, plan.calls[i], a);
  }
}

}  // namespace gpu

}  // namespace mlx_rmsnorm

#endif  // MLX_RMSNORM_CUDA
