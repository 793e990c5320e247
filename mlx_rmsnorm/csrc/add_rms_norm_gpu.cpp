// GPU evaluation of AddRMSNorm and AddRMSNormVJP: the RMSNorm kernels with
// the residual read beside x (forward) and g_h beside g (backward). CUDA
// flavor of MLX only.
#ifdef MLX_RMSNORM_CUDA

#include "add_rms_norm.h"
#include "add_rms_norm_vjp.h"
#include "gpu_util.h"

namespace mlx_rmsnorm {

using namespace gpu;

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
  const mx::array* w = has_weight() ? &rows_of(inputs[2], w_copy, stream(), enc) : nullptr;
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
  a.eps = eps();
  a.offset = offset();
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
  const mx::array* w = has_weight() ? &rows_of(inputs[1], w_copy, stream(), enc) : nullptr;
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
  a.eps = eps();
  a.offset = offset();
  a.x_dtype = kernel_dtype(h.dtype());
  a.w_dtype = w ? kernel_dtype(w->dtype()) : rmsnorm::DType::None;
  a.g_dtype = kernel_dtype(g.dtype());

  auto plan = rmsnorm::plan_backward(a, rmsnorm::Algorithm::Auto);
  record_backward(enc, stream(), plan, a, {&h, w, &g, &gh}, gx, {gw});
}

}  // namespace mlx_rmsnorm

#endif  // MLX_RMSNORM_CUDA
