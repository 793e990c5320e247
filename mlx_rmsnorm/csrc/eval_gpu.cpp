// GPU evaluation: records our kernels (cuda/) into MLX's CUDA graph. Built
// only against the CUDA flavor of MLX; the CPU flavor gets a clear error.
#include "add_rms_norm.h"
#include "add_rms_norm_vjp.h"
#include "rms_norm.h"
#include "rms_norm_vjp.h"

#ifdef MLX_RMSNORM_CUDA

#include "device_memory.h"
#include "gpu_util.h"

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

using namespace gpu;

void RMSNorm::eval_gpu(const std::vector<mx::array>& inputs,
                       std::vector<mx::array>& outputs) {
  mx::array& y = outputs[0];
  auto& enc = mx::cu::get_command_encoder(stream());
  use_device(stream());
  std::optional<mx::array> x_copy, w_copy;
  const mx::array& x = rows_of(inputs[0], x_copy, stream(), enc);
  const mx::array* w = has_weight_ ? &rows_of(inputs[1], w_copy, stream(), enc) : nullptr;
  allocate(y, stream(), {&x});

  rmsnorm::FwdArgs a{};
  a.x = ptr(x);
  a.w = w ? ptr(*w) : nullptr;
  a.y = ptr(y);
  a.n = x.shape(-1);
  a.rows = a.n == 0 ? 0 : static_cast<int64_t>(x.size() / a.n);
  a.eps = eps_;
  a.x_dtype = kernel_dtype(x.dtype());
  a.w_dtype = w ? kernel_dtype(w->dtype()) : rmsnorm::DType::None;
  a.y_dtype = kernel_dtype(y.dtype());
  a.offset = offset_;

  rmsnorm::Plan plan = rmsnorm::plan_forward(a);
  enc.set_input_array(x);
  if (w) enc.set_input_array(*w);
  enc.set_output_array(y);
  for (const auto& c : plan.calls) record(enc, c, a);
}

void RMSNormVJP::eval_gpu(const std::vector<mx::array>& inputs,
                          std::vector<mx::array>& outputs) {
  // outputs: gx, and gw only when the weight's gradient is wanted.
  auto& enc = mx::cu::get_command_encoder(stream());
  use_device(stream());
  std::optional<mx::array> x_copy, w_copy, g_copy;
  const mx::array& x = rows_of(inputs[0], x_copy, stream(), enc);
  const mx::array* w = has_weight_ ? &rows_of(inputs[1], w_copy, stream(), enc) : nullptr;
  const mx::array& g = rows_of(inputs.back(), g_copy, stream(), enc);
  mx::array& gx = outputs[0];
  mx::array* gw = outputs.size() > 1 ? &outputs[1] : nullptr;
  allocate(gx, stream(), {&x, &g});
  if (gw) allocate(*gw, stream());

  rmsnorm::BwdArgs a{};
  a.x = ptr(x);
  a.w = w ? ptr(*w) : nullptr;
  a.g = ptr(g);
  a.gx = ptr(gx);
  a.gw = gw ? ptr(*gw) : nullptr;
  a.n = x.shape(-1);
  a.rows = a.n == 0 ? 0 : static_cast<int64_t>(x.size() / a.n);
  a.eps = eps_;
  a.x_dtype = kernel_dtype(x.dtype());
  a.w_dtype = w ? kernel_dtype(w->dtype()) : rmsnorm::DType::None;
  a.g_dtype = kernel_dtype(g.dtype());
  a.offset = offset_;

  auto plan = rmsnorm::plan_backward(
      a, static_cast<rmsnorm::Algorithm>(static_cast<int>(algorithm_)));
  record_backward(enc, stream(), plan, a, {&x, w, &g}, gx, {gw});
}

// Fused residual add: one kernel reads x and residual, writes h and y.
void AddRMSNorm::eval_gpu(const std::vector<mx::array>& inputs,
                          std::vector<mx::array>& outputs) {
  mx::array& y = outputs[0];
  mx::array& h = outputs[1];
  auto& enc = mx::cu::get_command_encoder(stream());
  use_device(stream());
  std::optional<mx::array> x_copy, r_copy, w_copy;
  const mx::array& x = rows_of(inputs[0], x_copy, stream(), enc);
  const mx::array& res = rows_of(inputs[1], r_copy, stream(), enc);
  const mx::array* w = has_weight_ ? &rows_of(inputs[2], w_copy, stream(), enc) : nullptr;
  // h takes x's buffer or residual's, y the other one where dtypes allow
  // (every row element is read before it is written, by the same thread).
  allocate(h, stream(), {&x, &res});
  auto free_donor = [&](const mx::array& d) {
    return d.data_shared_ptr() == h.data_shared_ptr() ? nullptr : &d;
  };
  allocate(y, stream(), {free_donor(x), free_donor(res)});

  rmsnorm::FwdArgs a{};
  a.x = ptr(x);
  a.residual = ptr(res);
  a.w = w ? ptr(*w) : nullptr;
  a.y = ptr(y);
  a.h = ptr(h);
  a.n = x.shape(-1);
  a.rows = a.n == 0 ? 0 : static_cast<int64_t>(x.size() / a.n);
  a.eps = eps_;
  a.offset = offset_;
  a.x_dtype = kernel_dtype(x.dtype());
  a.w_dtype = w ? kernel_dtype(w->dtype()) : rmsnorm::DType::None;
  a.y_dtype = kernel_dtype(y.dtype());

  rmsnorm::Plan plan = rmsnorm::plan_forward(a);
  enc.set_input_array(x);
  enc.set_input_array(res);
  if (w) enc.set_input_array(*w);
  enc.set_output_array(y);
  enc.set_output_array(h);
  for (const auto& c : plan.calls) record(enc, c, a);
}

// Its backward: the RMSNorm backward chain of h with g_h streamed beside g_y
// and added into gx (the persistent walk, or the split plan), then gw's
// column sum.
void AddRMSNormVJP::eval_gpu(const std::vector<mx::array>& inputs,
                             std::vector<mx::array>& outputs) {
  auto& enc = mx::cu::get_command_encoder(stream());
  use_device(stream());
  std::optional<mx::array> h_copy, w_copy, g_copy, gh_copy;
  const mx::array& h = rows_of(inputs[0], h_copy, stream(), enc);
  const mx::array* w = has_weight_ ? &rows_of(inputs[1], w_copy, stream(), enc) : nullptr;
  const mx::array& g = rows_of(inputs[inputs.size() - 2], g_copy, stream(), enc);
  const mx::array& gh = rows_of(inputs.back(), gh_copy, stream(), enc);
  mx::array& gx = outputs[0];
  mx::array* gw = outputs.size() > 1 ? &outputs[1] : nullptr;
  allocate(gx, stream(), {&gh, &h, &g});
  if (gw) allocate(*gw, stream());

  rmsnorm::BwdArgs a{};
  a.x = ptr(h);
  a.w = w ? ptr(*w) : nullptr;
  a.g = ptr(g);
  a.gh = ptr(gh);
  a.gx = ptr(gx);
  a.gw = gw ? ptr(*gw) : nullptr;
  a.n = h.shape(-1);
  a.rows = a.n == 0 ? 0 : static_cast<int64_t>(h.size() / a.n);
  a.eps = eps_;
  a.offset = offset_;
  a.x_dtype = kernel_dtype(h.dtype());
  a.w_dtype = w ? kernel_dtype(w->dtype()) : rmsnorm::DType::None;
  a.g_dtype = kernel_dtype(g.dtype());

  auto plan = rmsnorm::plan_backward(a, rmsnorm::Algorithm::Auto);
  record_backward(enc, stream(), plan, a, {&h, w, &g, &gh}, gx, {gw});
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
void AddRMSNorm::eval_gpu(const std::vector<mx::array>&,
                          std::vector<mx::array>&) {
  no_gpu();
}
void AddRMSNormVJP::eval_gpu(const std::vector<mx::array>&,
                             std::vector<mx::array>&) {
  no_gpu();
}

}  // namespace mlx_rmsnorm

#endif
