#include "add_layer_norm_vjp.h"

#include "layer_norm.h"
#include "layer_norm_vjp.h"
#include "mlx/ops.h"
#include "op_util.h"

namespace mlx_rmsnorm {

namespace detail {

std::vector<mx::array> make_add_layer_vjp(const mx::array& h, const std::optional<mx::array>& w,
                                          const std::optional<mx::array>& b,
                                          const mx::array& g_y, const mx::array& g_h, float eps,
                                          bool need_gw, bool need_gb, mx::Stream s) {
  // LayerNormVJP's node of h and g_y, with g_h as one more row input.
  auto node = layer_vjp_node(h, w, b, g_y, eps, need_gw, need_gb);
  node.inputs.push_back(g_h);
  return NormPrimitive::make(std::make_shared<AddLayerNormVJP>(s, node.params),
                             std::move(node.inputs), std::move(node.dtypes));
}

}  // namespace detail

std::vector<std::optional<mx::array>> add_layer_norm_vjp(
    const mx::array& h, const std::optional<mx::array>& weight,
    const std::optional<mx::array>& bias, const mx::array& g_y, const mx::array& g_h, float eps,
    bool need_gw, bool need_gb, mx::StreamOrDevice s) {
  const char* op = "add_layer_norm_vjp";
  auto out_type = check_inputs(op, h, weight, bias, "h");
  check_cotangent(op, g_y, "g_y", h, "h");
  check_cotangent(op, g_h, "g_h", h, "h");
  auto stream = mx::to_stream(s);
  auto hk = kernel_input(h, out_type, stream);
  const bool reference_only = out_type == mx::float64 || hk.dtype() == mx::float64 || h.size() == 0;
  if (export_tracing() ||
      (!reference_only && stream.device.type == mx::Device::DeviceType::gpu &&
       !detail::gpu_planned(hk.dtype(), out_type, h.shape(-1), stream, /*add=*/true))) {
    // The export's graph of MLX ops, and rows the fused add's kernels do not
    // take on the GPU: layer_norm_vjp of h (the built-in's backward, or its
    // own kernels or reference as layer_norm_vjp decides), plus g_h.
    auto grads = layer_norm_vjp(h, weight, bias, g_y, eps, need_gw, need_gb, s);
    grads[0] = mx::add(*grads[0], cast(g_h, grads[0]->dtype(), stream), stream);
    return grads;
  }
  auto w = kernel_input(weight, out_type, stream);
  auto b = kernel_input(bias, out_type, stream);
  auto gy = cast(g_y, out_type, stream);
  auto gh = cast(g_h, hk.dtype(), stream);
  need_gw = need_gw && w.has_value();
  need_gb = need_gb && b.has_value();
  std::vector<mx::array> grads;
  if (reference_only) {
    // float64: MLX ops in float64; no elements: zeros (op_util.h).
    grads = detail::layer_vjp_reference(hk, w, b, gy, eps, need_gw, need_gb, stream, gh);
    if (h.size() == 0) grads = no_elements(grads, stream);
  } else {
    grads = detail::make_add_layer_vjp(hk, w, b, gy, gh, eps, need_gw, need_gb, stream);
  }
  return detail::layer_vjp_outputs(grads, need_gw, need_gb);
}

std::vector<mx::array> AddLayerNormVJP::reference(const std::vector<mx::array>& in) {
  return detail::layer_vjp_reference(in[0], weight(in), bias(in), tail(in, 0), eps(), has_gw(),
                                     need_gb(), stream(), tail(in, 1));
}

}  // namespace mlx_rmsnorm
