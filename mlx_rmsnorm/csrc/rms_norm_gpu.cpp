// GPU evaluation of RMSNorm and RMSNormVJP: records our kernels (cuda/) into
// MLX's CUDA graph. CUDA flavor of MLX only.
#ifdef MLX_RMSNORM_CUDA

#include "gpu_util.h"
#include "rms_norm.h"
#include "rms_norm_vjp.h"

namespace mlx_rmsnorm {

using namespace gpu;

void RMSNorm::eval_gpu(const std::vector<mx::array>& inputs,
                       std::vector<mx::array>& outputs) {
  mx::array& y = outputs[0];
  auto& enc = mx::cu::get_command_encoder(stream());
  use_device(stream());
  std::optional<mx::array> x_copy, w_copy;
  const mx::array& x = rows_of(inputs[0], x_copy, stream(), enc);
  const mx::array* w = has_weight() ? &rows_of(inputs[1], w_copy, stream(), enc) : nullptr;
  allocate(y, stream(), {&x});

  rmsnorm::FwdArgs a{};
  a.x = ptr(x);
  a.w = w ? ptr(*w) : nullptr;
  a.y = ptr(y);
  a.n = x.shape(-1);
  a.rows = a.n == 0 ? 0 : static_cast<int64_t>(x.size() / a.n);
  a.eps = eps();
  a.x_dtype = kernel_dtype(x.dtype());
  a.w_dtype = w ? kernel_dtype(w->dtype()) : rmsnorm::DType::None;
  a.y_dtype = kernel_dtype(y.dtype());
  a.offset = offset();

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
  const mx::array* w = has_weight() ? &rows_of(inputs[1], w_copy, stream(), enc) : nullptr;
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
  a.eps = eps();
  a.x_dtype = kernel_dtype(x.dtype());
  a.w_dtype = w ? kernel_dtype(w->dtype()) : rmsnorm::DType::None;
  a.g_dtype = kernel_dtype(g.dtype());
  a.offset = offset();

  auto plan = rmsnorm::plan_backward(
      a, static_cast<rmsnorm::Algorithm>(static_cast<int>(algorithm())));
  record_backward(enc, stream(), plan, a, {&x, w, &g}, gx, {gw});
}

}  // namespace mlx_rmsnorm

#endif  // MLX_RMSNORM_CUDA
