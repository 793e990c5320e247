// GPU evaluation of LayerNorm and LayerNormVJP: records cuda/layer_norm.cu's
// plans into MLX's CUDA graph. CUDA flavor of MLX only.
#ifdef MLX_RMSNORM_CUDA

#include "gpu_util.h"
#include "layer_norm.h"
#include "layer_norm_vjp.h"

namespace mlx_rmsnorm {

using namespace gpu;

void LayerNorm::eval_gpu(const std::vector<mx::array>& inputs,
                         std::vector<mx::array>& outputs) {
  mx::array& y = outputs[0];
  auto& enc = mx::cu::get_command_encoder(stream());
  use_device(stream());
  // The kernels read x in 16-byte vectors only (the op sent other rows to
  // the built-in): an x whose data starts off that boundary is copied.
  std::optional<mx::array> x_copy, w_copy, b_copy;
  const mx::array& x = rows_of(inputs[0], x_copy, stream(), enc, /*aligned16=*/true);
  const mx::array* w = has_weight() ? &rows_of(inputs[1], w_copy, stream(), enc) : nullptr;
  const mx::array* b =
      has_bias() ? &rows_of(inputs[has_weight() ? 2 : 1], b_copy, stream(), enc) : nullptr;
  allocate(y, stream(), {&x});

  rmsnorm::FwdArgs a{};
  a.x = ptr(x);
  a.w = w ? ptr(*w) : nullptr;
  a.b = b ? ptr(*b) : nullptr;
  a.y = ptr(y);
  a.n = x.shape(-1);
  a.rows = a.n == 0 ? 0 : static_cast<int64_t>(x.size() / a.n);
  a.eps = eps();
  a.x_dtype = kernel_dtype(x.dtype());
  a.w_dtype = w ? kernel_dtype(w->dtype()) : rmsnorm::DType::None;
  a.b_dtype = b ? kernel_dtype(b->dtype()) : rmsnorm::DType::None;
  a.y_dtype = kernel_dtype(y.dtype());

  rmsnorm::Plan plan = rmsnorm::plan_layer_forward(a);
  enc.set_input_array(x);
  if (w) enc.set_input_array(*w);
  if (b) enc.set_input_array(*b);
  enc.set_output_array(y);
  for (const auto& c : plan.calls) record(enc, c, a);
}

void LayerNormVJP::eval_gpu(const std::vector<mx::array>& inputs,
                            std::vector<mx::array>& outputs) {
  // inputs (x, [w], [b], g); outputs gx, [gw], [gb].
  auto& enc = mx::cu::get_command_encoder(stream());
  use_device(stream());
  std::optional<mx::array> x_copy, w_copy, g_copy;
  const mx::array& x = rows_of(inputs[0], x_copy, stream(), enc, /*aligned16=*/true);
  const mx::array* w = has_weight() ? &rows_of(inputs[1], w_copy, stream(), enc) : nullptr;
  const mx::array& g = rows_of(inputs.back(), g_copy, stream(), enc, /*aligned16=*/true);
  mx::array& gx = outputs[0];
  mx::array* gw = has_gw() ? &outputs[1] : nullptr;
  mx::array* gb = need_gb() ? &outputs.back() : nullptr;
  allocate(gx, stream(), {&x, &g});
  if (gw) allocate(*gw, stream());
  if (gb) allocate(*gb, stream());

  rmsnorm::BwdArgs a{};
  a.x = ptr(x);
  a.w = w ? ptr(*w) : nullptr;
  a.g = ptr(g);
  a.gx = ptr(gx);
  a.gw = gw ? ptr(*gw) : nullptr;
  a.gb = gb ? ptr(*gb) : nullptr;
  a.n = x.shape(-1);
  a.rows = a.n == 0 ? 0 : static_cast<int64_t>(x.size() / a.n);
  a.eps = eps();
  a.x_dtype = kernel_dtype(x.dtype());
  a.w_dtype = w ? kernel_dtype(w->dtype()) : rmsnorm::DType::None;
  a.b_dtype = gb ? kernel_dtype(gb->dtype()) : rmsnorm::DType::None;
  a.g_dtype = kernel_dtype(g.dtype());

  auto plan = rmsnorm::plan_layer_backward(a);
  record_backward(enc, stream(), plan, a, {&x, w, &g}, gx, {gw, gb});
}

}  // namespace mlx_rmsnorm

#endif  // MLX_RMSNORM_CUDA
