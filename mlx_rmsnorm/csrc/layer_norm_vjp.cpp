#include "layer_norm_vjp.h"

#include <stdexcept>

#include "layer_norm.h"
#include "mlx/fast.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "reference.h"
#include "rms_norm.h"  // dtype_str, kernel_input, export_tracing
#ifdef MLX_RMSNORM_CUDA
#include "gpu_util.h"
#endif

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

// The backward as a function of the primitive's inputs (x, [w], [b], g),
// built from MLX ops: what jvp, vmap and higher-order vjp differentiate.
auto reference_backward(float eps, bool has_w, bool need_gw, bool need_gb, mx::Stream s) {
  return [eps, has_w, need_gw, need_gb, s](const std::vector<mx::array>& in) {
    std::optional<mx::array> w;
    if (has_w) w = in[1];
    std::optional<mx::Dtype> gb_dtype;
    if (need_gb) gb_dtype = in[in.size() - 2].dtype();
    return layer_reference::backward(in[0], w, in.back(), eps, need_gw, gb_dtype, s);
  };
}

bool gpu_planned(mx::Dtype x_type, mx::Dtype out_type, int n, const mx::Stream& s) {
#ifdef MLX_RMSNORM_CUDA
  gpu::use_device(s);
  return rmsnorm::layer_norm_planned(gpu::kernel_dtype(x_type), gpu::kernel_dtype(out_type), n);
#else
  (void)x_type, (void)out_type, (void)n, (void)s;
  return false;
#endif
}

}  // namespace

namespace detail {

std::vector<mx::array> make_layer_vjp(const mx::array& x,
                                      const std::optional<mx::array>& w,
                                      const std::optional<mx::array>& b,
                                      const mx::array& g, float eps, bool need_gw,
                                      bool need_gb, mx::Stream s) {
  need_gw = need_gw && w.has_value();
  need_gb = need_gb && b.has_value();
  auto prim = std::make_shared<LayerNormVJP>(s, eps, w.has_value(), need_gw, need_gb);
  std::vector<mx::array> inputs = {x};
  if (w) inputs.push_back(*w);
  if (need_gb) inputs.push_back(*b);
  inputs.push_back(g);
  std::vector<mx::Shape> shapes = {x.shape()};
  std::vector<mx::Dtype> dtypes = {x.dtype()};
  if (need_gw) shapes.push_back(w->shape()), dtypes.push_back(w->dtype());
  if (need_gb) shapes.push_back(b->shape()), dtypes.push_back(b->dtype());
  if (shapes.size() == 1)
    return {mx::array(x.shape(), x.dtype(), std::move(prim), std::move(inputs))};
  return mx::array::make_arrays(std::move(shapes), dtypes, std::move(prim),
                                std::move(inputs));
}

}  // namespace detail

std::vector<std::optional<mx::array>> layer_norm_vjp(
    const mx::array& x, const std::optional<mx::array>& weight,
    const std::optional<mx::array>& bias, const mx::array& g, float eps, bool need_gw,
    bool need_gb, mx::StreamOrDevice s) {
  auto out_type = check_layer_inputs("layer_norm_vjp", x, weight, bias);
  if (g.shape() != x.shape()) {
    throw std::invalid_argument("[layer_norm_vjp] g must have the shape of x.");
  }
  if (!mx::issubdtype(g.dtype(), mx::floating)) {
    throw std::invalid_argument(
        "[layer_norm_vjp] g must be a floating array but has dtype " +
        dtype_str(g.dtype()) + ".");
  }
  auto stream = mx::to_stream(s);
  if (export_tracing()) return builtin_vjp(x, weight, bias, g, eps, need_gw, need_gb, out_type, s);
  auto xk = kernel_input(x, out_type, stream);
  check_not_empty_on_gpu("layer_norm_vjp", x, stream);
  bool reference_only = out_type == mx::float64 || x.size() == 0;  // (no elements: no launch)
  if (!reference_only && stream.device.type == mx::Device::DeviceType::gpu &&
      !gpu_planned(xk.dtype(), out_type, x.shape(-1), stream)) {
    // As layer_norm: the built-in past our tables, our fp32 reference where
    // rows are not a whole number of 16-byte vectors (the built-in's gx is
    // wrong there for 16-bit dtypes).
    if (detail::vector_rows(xk.dtype(), x.shape(-1)))
      return builtin_vjp(x, weight, bias, g, eps, need_gw, need_gb, out_type, s);
    reference_only = true;
  }
  std::optional<mx::array> w, b;
  if (weight) w = kernel_input(*weight, out_type, stream);
  if (bias) b = kernel_input(*bias, out_type, stream);
  need_gw = need_gw && w.has_value();
  need_gb = need_gb && b.has_value();
  std::vector<mx::array> grads;
  if (reference_only) {
    std::optional<mx::Dtype> gb_dtype;
    if (need_gb) gb_dtype = b->dtype();
    grads = layer_reference::backward(xk, w, g, eps, need_gw, gb_dtype, stream);
  } else {
    auto gc = g.dtype() == out_type ? g : mx::astype(g, out_type, stream);
    grads = detail::make_layer_vjp(xk, w, b, gc, eps, need_gw, need_gb, stream);
  }
  std::vector<std::optional<mx::array>> out = {grads[0], std::nullopt, std::nullopt};
  if (need_gw) out[1] = grads[1];
  if (need_gb) out[2] = grads[need_gw ? 2 : 1];
  return out;
}

std::vector<mx::array> LayerNormVJP::vjp(const std::vector<mx::array>& primals,
                                         const std::vector<mx::array>& cotangents,
                                         const std::vector<int>& argnums,
                                         const std::vector<mx::array>&) {
  auto grads = mx::vjp(reference_backward(eps_, has_weight_, has_gw(), need_gb_, stream()),
                       primals, cotangents)
                   .second;
  std::vector<mx::array> out;
  for (int i : argnums) out.push_back(grads[i]);
  return out;
}

std::vector<mx::array> LayerNormVJP::jvp(const std::vector<mx::array>& primals,
                                         const std::vector<mx::array>& tangents,
                                         const std::vector<int>& argnums) {
  auto all_tangents = reference::full_tangents(primals, tangents, argnums, stream());
  return mx::jvp(reference_backward(eps_, has_weight_, has_gw(), need_gb_, stream()),
                 primals, all_tangents)
      .second;
}

std::pair<std::vector<mx::array>, std::vector<int>> LayerNormVJP::vmap(
    const std::vector<mx::array>& inputs, const std::vector<int>& axes) {
  std::vector<int> out_axes(1 + has_gw() + need_gb_, 0);
  auto f = mx::vmap(reference_backward(eps_, has_weight_, has_gw(), need_gb_, stream()),
                    axes, out_axes);
  return {f(inputs), out_axes};
}

std::vector<mx::Shape> LayerNormVJP::output_shapes(const std::vector<mx::array>& inputs) {
  std::vector<mx::Shape> out = {inputs[0].shape()};
  if (has_gw()) out.push_back(inputs[1].shape());
  if (need_gb_) out.push_back(inputs[has_weight_ ? 2 : 1].shape());
  return out;
}

bool LayerNormVJP::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const LayerNormVJP&>(other);
  return eps_ == o.eps_ && has_weight_ == o.has_weight_ && need_gw_ == o.need_gw_ &&
         need_gb_ == o.need_gb_;
}

}  // namespace mlx_rmsnorm
