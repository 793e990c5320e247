#include "layer_norm_vjp.h"

#include "layer_norm.h"
#include "mlx/fast.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "op_util.h"

namespace mlx_rmsnorm {

namespace {

// What the built-in's own backward gives (an export trace, and rows no plan
// of ours covers on the GPU): the graph then holds only MLX's ops.
std::vector<std::optional<mx::array>> builtin_vjp(
    const mx::array& x, const std::optional<mx::array>& weight,
    const std::optional<mx::array>& bias, const mx::array& g, float eps, bool need_gw,
    bool need_gb, mx::Dtype out_type, mx::StreamOrDevice s) {
  const bool with_w = weight && need_gw, with_b = bias && need_gb;
  auto f = [&](const std::vector<mx::array>& in) {
    std::optional<mx::array> w = with_w ? std::optional(in[1]) : weight;
    std::optional<mx::array> b = with_b ? std::optional(in[with_w ? 2 : 1]) : bias;
    return std::vector<mx::array>{mx::fast::layer_norm(in[0], w, b, eps, s)};
  };
  std::vector<mx::array> primals = {x};
  if (with_w) primals.push_back(*weight);
  if (with_b) primals.push_back(*bias);
  auto grads = mx::vjp(f, primals, {mx::astype(g, out_type, s)}).second;
  std::vector<std::optional<mx::array>> out = {grads[0], std::nullopt, std::nullopt};
  if (with_w) out[1] = grads[1];
  if (with_b) out[2] = grads[with_w ? 2 : 1];
  return out;
}

}  // namespace

namespace detail {

LayerVjpNode layer_vjp_node(const mx::array& x, const std::optional<mx::array>& w,
                            const std::optional<mx::array>& b, const mx::array& g, float eps,
                            bool need_gw, bool need_gb) {
  need_gb = need_gb && b.has_value();
  // b is an input only when gb is wanted: it gives gb its dtype.
  LayerVjpNode node{{.eps = eps, .has_weight = w.has_value(), .has_bias = need_gb,
                     .need_gw = need_gw && w.has_value(), .need_gb = need_gb},
                    {x},
                    {x.dtype()}};
  if (w) node.inputs.push_back(*w);
  if (node.params.need_gw) node.dtypes.push_back(w->dtype());
  if (need_gb) node.inputs.push_back(*b), node.dtypes.push_back(b->dtype());
  node.inputs.push_back(g);
  return node;
}

std::vector<mx::array> layer_vjp_reference(const mx::array& x, const std::optional<mx::array>& w,
                                           const std::optional<mx::array>& b, const mx::array& g,
                                           float eps, bool need_gw, bool need_gb, mx::Stream s,
                                           const std::optional<mx::array>& g_h) {
  std::optional<mx::Dtype> gb_dtype;
  if (need_gb && b) gb_dtype = b->dtype();
  return layer_reference::backward(x, w, g, eps, need_gw, gb_dtype, s, g_h);
}

std::vector<std::optional<mx::array>> layer_vjp_outputs(const std::vector<mx::array>& grads,
                                                        bool need_gw, bool need_gb) {
  std::vector<std::optional<mx::array>> out = {grads[0], std::nullopt, std::nullopt};
  if (need_gw) out[1] = grads[1];
  if (need_gb) out[2] = grads[need_gw ? 2 : 1];
  return out;
}

std::vector<mx::array> make_layer_vjp(const mx::array& x, const std::optional<mx::array>& w,
                                      const std::optional<mx::array>& b, const mx::array& g,
                                      float eps, bool need_gw, bool need_gb, mx::Stream s) {
  auto node = layer_vjp_node(x, w, b, g, eps, need_gw, need_gb);
  return NormPrimitive::make(std::make_shared<LayerNormVJP>(s, node.params),
                             std::move(node.inputs), std::move(node.dtypes));
}

}  // namespace detail

std::vector<std::optional<mx::array>> layer_norm_vjp(
    const mx::array& x, const std::optional<mx::array>& weight,
    const std::optional<mx::array>& bias, const mx::array& g, float eps, bool need_gw,
    bool need_gb, mx::StreamOrDevice s) {
  auto out_type = check_inputs("layer_norm_vjp", x, weight, bias);
  check_cotangent("layer_norm_vjp", g, "g", x);
  auto stream = mx::to_stream(s);
  if (export_tracing()) return builtin_vjp(x, weight, bias, g, eps, need_gw, need_gb, out_type, s);
  auto xk = kernel_input(x, out_type, stream);
  bool reference_only = out_type == mx::float64 || x.size() == 0;
  if (!reference_only && stream.device.type == mx::Device::DeviceType::gpu &&
      !detail::gpu_planned(xk.dtype(), out_type, x.shape(-1), stream)) {
    // As layer_norm: the built-in past our tables, our fp32 reference where
    // rows are not a whole number of 16-byte vectors (the built-in's gx is
    // wrong there for 16-bit dtypes).
    if (detail::vector_rows(xk.dtype(), x.shape(-1)))
      return builtin_vjp(x, weight, bias, g, eps, need_gw, need_gb, out_type, s);
    reference_only = true;
  }
  auto w = kernel_input(weight, out_type, stream);
  auto b = kernel_input(bias, out_type, stream);
  need_gw = need_gw && w.has_value();
  need_gb = need_gb && b.has_value();
  std::vector<mx::array> grads;
  if (reference_only) {
    grads = detail::layer_vjp_reference(xk, w, b, g, eps, need_gw, need_gb, stream);
    if (x.size() == 0) grads = no_elements(grads, stream);  // zeros, as in rms_norm
  } else {
    grads = detail::make_layer_vjp(xk, w, b, cast(g, out_type, stream), eps, need_gw, need_gb,
                                   stream);
  }
  return detail::layer_vjp_outputs(grads, need_gw, need_gb);
}

std::vector<mx::array> LayerNormVJP::reference(const std::vector<mx::array>& in) {
  return detail::layer_vjp_reference(in[0], weight(in), bias(in), tail(in, 0), eps(), has_gw(),
                                     need_gb(), stream());
}

}  // namespace mlx_rmsnorm
