// GPU evaluation of LayerNorm and LayerNormVJP: records cuda/layer_norm.cu's
// plans into MLX's CUDA graph. The recording serves the fused residual add
// too (layer_norm_gpu.h). CUDA flavor of MLX only.
#ifdef MLX_RMSNORM_CUDA

#include "layer_norm_gpu.h"

#include "gpu_util.h"
#include "layer_norm.h"
#include "layer_norm_vjp.h"

namespace mlx_rmsnorm {

namespace gpu {

void layer_forward(NormPrimitive& prim, const std::vector<mx::array>& inputs,
                   std::vector<mx::array>& outputs, bool add) {
  const mx::Stream s = prim.stream();
  mx::array& y = outputs[0];
  auto& enc = mx::cu::get_command_encoder(s);
  use_device(s);
  // The kernels read rows in 16-byte vectors only (the ops sent other rows
  // elsewhere): a row input whose data starts off that boundary is copied.
  std::optional<mx::array> x_copy, r_copy, w_copy, b_copy;
  const auto w_in = prim.weight(inputs), b_in = prim.bias(inputs);
  const mx::array& x = rows_of(inputs[0], x_copy, s, enc, /*aligned16=*/true);
  const mx::array* res = add ? &rows_of(inputs[1], r_copy, s, enc, /*aligned16=*/true) : nullptr;
  const mx::array* w = w_in ? &rows_of(*w_in, w_copy, s, enc) : nullptr;
  const mx::array* b = b_in ? &rows_of(*b_in, b_copy, s, enc) : nullptr;
  mx::array* h = add ? &outputs[1] : nullptr;
  if (h) {
    // h takes x's buffer or residual's, y the other one where dtypes allow
    // (the forward rows hold a whole row before they write it).
    allocate(*h, s, {&x, res});
    auto free_donor = [&](const mx::array& d) {
      return d.data_shared_ptr() == h->data_shared_ptr() ? nullptr : &d;
    };
    allocate(y, s, {free_donor(x), free_donor(*res)});
  } else {
    allocate(y, s, {&x});
  }

  rmsnorm::FwdArgs a{};
  a.x = ptr(x);
  a.w = w ? ptr(*w) : nullptr;
  a.b = b ? ptr(*b) : nullptr;
  a.y = ptr(y);
  a.residual = res ? ptr(*res) : nullptr;
  a.h = h ? ptr(*h) : nullptr;
  a.n = x.shape(-1);
  a.rows = a.n == 0 ? 0 : static_cast<int64_t>(x.size() / a.n);
  a.eps = prim.eps();
  a.x_dtype = kernel_dtype(x.dtype());
  a.w_dtype = w ? kernel_dtype(w->dtype()) : rmsnorm::DType::None;
  a.b_dtype = b ? kernel_dtype(b->dtype()) : rmsnorm::DType::None;
  a.y_dtype = kernel_dtype(y.dtype());

  rmsnorm::Plan plan = rmsnorm::plan_layer_forward(a);
  enc.set_input_array(x);
  if (res) enc.set_input_array(*res);
  if (w) enc.set_input_array(*w);
  if (b) enc.set_input_array(*b);
  enc.set_output_array(y);
  if (h) enc.set_output_array(*h);
  for (const auto& c : plan.calls) record(enc, c, a);
}

void layer_backward(NormPrimitive& prim, const std::vector<mx::array>& inputs,
                    std::vector<mx::array>& outputs, bool add) {
  const mx::Stream s = prim.stream();
  auto& enc = mx::cu::get_command_encoder(s);
  use_device(s);
  std::optional<mx::array> x_copy, w_copy, g_copy, gh_copy;
  const auto w_in = prim.weight(inputs);
  const mx::array& x = rows_of(inputs[0], x_copy, s, enc, /*aligned16=*/true);
  const mx::array* w = w_in ? &rows_of(*w_in, w_copy, s, enc) : nullptr;
  const mx::array& g = rows_of(prim.tail(inputs, 0), g_copy, s, enc, /*aligned16=*/true);
  const mx::array* gh =
      add ? &rows_of(prim.tail(inputs, 1), gh_copy, s, enc, /*aligned16=*/true) : nullptr;
  mx::array& gx = outputs[0];
  mx::array* gw = prim.has_gw() ? &outputs[1] : nullptr;
  mx::array* gb = prim.need_gb() ? &outputs.back() : nullptr;
  if (gh) {
    allocate(gx, s, {gh, &x, &g});
  } else {
    allocate(gx, s, {&x, &g});
  }
  if (gw) allocate(*gw, s);
  if (gb) allocate(*gb, s);

  rmsnorm::BwdArgs a{};
  a.x = ptr(x);
  a.w = w ? ptr(*w) : nullptr;
  a.g = ptr(g);
  a.gh = gh ? ptr(*gh) : nullptr;
  a.gx = ptr(gx);
  a.gw = gw ? ptr(*gw) : nullptr;
  a.gb = gb ? ptr(*gb) : nullptr;
  a.n = x.shape(-1);
  a.rows = a.n == 0 ? 0 : static_cast<int64_t>(x.size() / a.n);
  a.eps = prim.eps();
  a.x_dtype = kernel_dtype(x.dtype());
  a.w_dtype = w ? kernel_dtype(w->dtype()) : rmsnorm::DType::None;
  a.b_dtype = gb ? kernel_dtype(gb->dtype()) : rmsnorm::DType::None;
  a.g_dtype = kernel_dtype(g.dtype());

  auto plan = rmsnorm::plan_layer_backward(a);
  record_backward(enc, s, plan, a, {&x, w, &g, gh}, gx, {gw, gb});
}

}  // namespace gpu

void LayerNorm::eval_gpu(const std::vector<mx::array>& inputs,
                         std::vector<mx::array>& outputs) {
  gpu::layer_forward(*this, inputs, outputs, /*add=*/false);
}

void LayerNormVJP::eval_gpu(const std::vector<mx::array>& inputs,
                            std::vector<mx::array>& outputs) {
  gpu::layer_backward(*this, inputs, outputs, /*add=*/false);
}

}  // namespace mlx_rmsnorm

#endif  // MLX_RMSNORM_CUDA
