#include "add_layer_norm.h"

#include "add_layer_norm_vjp.h"
#include "layer_norm.h"
#include "mlx/fast.h"
#include "mlx/ops.h"
#include "op_util.h"

namespace mlx_rmsnorm {

namespace {

// {y, h} from MLX ops: the primitive's reference, the float64 path and the
// shapes and dtypes of arrays of no elements.
std::vector<mx::array> reference_forward(const mx::array& x, const mx::array& r,
                                         const std::optional<mx::array>& w,
                                         const std::optional<mx::array>& b, float eps,
                                         mx::Dtype out_type, mx::Stream s) {
  auto h = mx::add(x, r, s);
  return {layer_reference::forward(h, w, b, eps, out_type, s), h};
}

// The unfused composition, MLX's add and then our layer_norm, which casts
// h, runs float64 in float64 and sends rows it has no GPU plan for to the
// built-in (layer_norm.cpp): what the fused op is where it has no kernel.
std::vector<mx::array> composition(const mx::array& x, const mx::array& residual,
                                   const std::optional<mx::array>& weight,
                                   const std::optional<mx::array>& bias, float eps,
                                   mx::Stream s) {
  auto h = mx::add(x, residual, s);
  return {layer_norm(h, weight, bias, eps, s), h};
}

}  // namespace

std::vector<mx::array> add_layer_norm(const mx::array& x, const mx::array& residual,
                                      const std::optional<mx::array>& weight,
                                      const std::optional<mx::array>& bias, float eps,
                                      mx::StreamOrDevice s) {
  auto [shape, h_type, out_type] =
      check_add_inputs("add_layer_norm", x, residual, weight, bias);
  if (export_tracing()) {
    auto h = mx::add(x, residual, s);
    return {mx::fast::layer_norm(h, weight, bias, eps, s), h};
  }
  auto stream = mx::to_stream(s);
  // x and residual in h's dtype and shape (expand_to; add_rms_norm.cpp says
  // what an expanded one costs on the GPU).
  auto xh = expand_to(x, shape, h_type, stream), rh = expand_to(residual, shape, h_type, stream);
  // An h the kernels do not store (integer or bool inputs, as layer_norm
  // accepts them, and float64): the composition itself.
  if (!is_kernel_dtype(h_type)) return composition(x, residual, weight, bias, eps, stream);
  auto w = kernel_input(weight, out_type, stream);
  auto b = kernel_input(bias, out_type, stream);
  // No elements: zeros of the reference's shapes and dtypes, no reduction
  // (op_util.h). A float64 weight or bias: MLX ops in float64.
  if (xh.size() == 0)
    return no_elements(reference_forward(xh, rh, w, b, eps, out_type, stream), stream);
  if (out_type == mx::float64) return reference_forward(xh, rh, w, b, eps, out_type, stream);
  // Rows that the fused add's kernels do not take (past the tables, N not a
  // whole number of 16-byte vectors, or no backward plan with g_h's stream):
  // the composition, whose layer_norm decides between its kernels and the
  // built-in.
  if (stream.device.type == mx::Device::DeviceType::gpu &&
      !detail::gpu_planned(h_type, out_type, shape.back(), stream, /*add=*/true))
    return composition(x, residual, weight, bias, eps, stream);
  std::vector<mx::array> inputs = {xh, rh};
  if (w) inputs.push_back(*w);
  if (b) inputs.push_back(*b);
  NormParams p{.eps = eps, .has_weight = w.has_value(), .has_bias = b.has_value()};
  return NormPrimitive::make(std::make_shared<AddLayerNorm>(stream, p), std::move(inputs),
                             {out_type, h_type});
}

std::vector<mx::array> AddLayerNorm::reference(const std::vector<mx::array>& in) {
  auto w = weight(in), b = bias(in);
  // in[0] is x in h's dtype
  return reference_forward(in[0], in[1], w, b, eps(), layer_reference::result_type(in[0], w, b),
                           stream());
}

std::vector<mx::array> AddLayerNorm::vjp(const std::vector<mx::array>& primals,
                                         const std::vector<mx::array>& cotangents,
                                         const std::vector<int>& argnums,
                                         const std::vector<mx::array>& outputs) {
  // The backward reads the forward's h (outputs[1]) rather than x and
  // residual; both inputs get the same gradient.
  const auto& h = outputs[1];
  const int w_arg = has_weight() ? 2 : -1;
  const int b_arg = has_bias() ? (has_weight() ? 3 : 2) : -1;
  const bool need_gw = wanted(argnums, w_arg), need_gb = wanted(argnums, b_arg);
  auto g_y = cast(cotangents[0], outputs[0].dtype(), stream());
  auto g_h = cast(cotangents[1], h.dtype(), stream());
  auto grads = detail::make_add_layer_vjp(h, weight(primals), bias(primals), g_y, g_h, eps(),
                                          need_gw, need_gb, stream());
  std::vector<mx::array> out;
  out.reserve(argnums.size());
  for (int i : argnums) {
    if (i == w_arg) out.push_back(grads[1]);
    else if (i == b_arg) out.push_back(grads[need_gw ? 2 : 1]);
    else out.push_back(grads[0]);  // x and residual
  }
  return out;
}

}  // namespace mlx_rmsnorm
