#include "rms_norm_vjp.h"

#include <stdexcept>

#include "mlx/fast.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "reference.h"
#include "rms_norm.h"

namespace mlx_rmsnorm {

Algorithm parse_algorithm(const std::string& name) {
  if (name == "auto") return Algorithm::Auto;
  if (name == "persistent") return Algorithm::Persistent;
  if (name == "split") return Algorithm::Split;
  if (name == "naive") return Algorithm::Naive;
  throw std::invalid_argument(
      "[rms_norm_vjp] algorithm must be one of 'auto', 'persistent', 'split', "
      "'naive' but got '" + name + "'.");
}

namespace {

std::string shape_str(const mx::Shape& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

// What the built-in's own backward gives, for an export trace: the exported
// file then holds only MLX's ops.
std::vector<mx::array> builtin_vjp(const mx::array& x,
                                   const std::optional<mx::array>& weight,
                                   const mx::array& g, float eps, bool need_gw,
                                   mx::StreamOrDevice s) {
  bool with_w = weight && need_gw;
  auto f = [&](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{
        mx::fast::rms_norm(in[0], with_w ? std::optional(in[1]) : weight, eps, s)};
  };
  std::vector<mx::array> primals = {x};
  if (with_w) primals.push_back(*weight);
  return mx::vjp(f, primals, {mx::astype(g, reference::result_type(x, weight), s)}).second;
}

// The backward as a function of (x, [w,] g) built from MLX ops, which is
// what jvp, vmap and higher-order vjp differentiate.
auto reference_backward(float eps, bool has_w, bool need_gw, mx::Stream s,
                        float offset) {
  return [eps, has_w, need_gw, s, offset](const std::vector<mx::array>& in) {
    return reference::backward(in[0], reference::weight_of(in, has_w),
                               in.back(), eps, need_gw, s, offset);
  };
}

}  // namespace

namespace detail {

std::vector<mx::array> make_vjp(const mx::array& x,
                                const std::optional<mx::array>& w,
                                const mx::array& g, float eps,
                                Algorithm algorithm, bool need_gw,
                                mx::Stream s, float offset) {
  need_gw = need_gw && w.has_value();
  auto prim = std::make_shared<RMSNormVJP>(s, eps, w.has_value(), algorithm, need_gw,
                                           offset);
  std::vector<mx::array> inputs;
  inputs.reserve(3);
  inputs.push_back(x);
  if (w) inputs.push_back(*w);
  inputs.push_back(g);
  if (!need_gw) {
    return {mx::array(x.shape(), x.dtype(), std::move(prim), std::move(inputs))};
  }
  return mx::array::make_arrays({x.shape(), w->shape()}, {x.dtype(), w->dtype()},
                                std::move(prim), std::move(inputs));
}

}  // namespace detail

std::vector<mx::array> rms_norm_vjp(const mx::array& x,
                                    const std::optional<mx::array>& weight,
                                    const mx::array& g, float eps,
                                    Algorithm algorithm, bool need_gw,
                                    mx::StreamOrDevice s) {
  auto out_type = check_inputs("rms_norm_vjp", x, weight);
  if (g.shape() != x.shape()) {
    throw std::invalid_argument("[rms_norm_vjp] g must have the shape of x " +
                                shape_str(x.shape()) + " but has shape " +
                                shape_str(g.shape()) + ".");
  }
  if (!mx::issubdtype(g.dtype(), mx::floating)) {
    throw std::invalid_argument(
        "[rms_norm_vjp] g must be a floating array but has dtype " +
        dtype_str(g.dtype()) + ".");
  }
  if (export_tracing()) return builtin_vjp(x, weight, g, eps, need_gw, s);
  auto stream = mx::to_stream(s);
  auto xk = kernel_input(x, out_type, stream);
  std::optional<mx::array> w;
  if (weight) w = kernel_input(*weight, out_type, stream);
  // float64: MLX ops in float64 (reference.h); the kernels read 16/32-bit floats.
  // (and no elements: no kernel launch, as in rms_norm)
  check_not_empty_on_gpu("rms_norm_vjp", x, stream);
  if (out_type == mx::float64 || x.size() == 0) return reference::backward(xk, w, g, eps, need_gw, stream);
  // g is read in the dtype of y, the tensor it is the gradient of.
  auto gc = g.dtype() == out_type ? g : mx::astype(g, out_type, stream);
  return detail::make_vjp(xk, w, gc, eps, algorithm, need_gw, stream);
}

std::vector<mx::array> RMSNormVJP::vjp(const std::vector<mx::array>& primals,
                                       const std::vector<mx::array>& cotangents,
                                       const std::vector<int>& argnums,
                                       const std::vector<mx::array>&) {
  auto grads = mx::vjp(reference_backward(eps_, has_weight_, need_gw_, stream(), offset_),
                       primals, cotangents)
                   .second;
  std::vector<mx::array> out;
  for (int i : argnums) out.push_back(grads[i]);
  return out;
}

std::vector<mx::array> RMSNormVJP::jvp(const std::vector<mx::array>& primals,
                                       const std::vector<mx::array>& tangents,
                                       const std::vector<int>& argnums) {
  auto all_tangents = reference::full_tangents(primals, tangents, argnums, stream());
  return mx::jvp(reference_backward(eps_, has_weight_, need_gw_, stream(), offset_),
                 primals, all_tangents)
      .second;
}

std::pair<std::vector<mx::array>, std::vector<int>> RMSNormVJP::vmap(
    const std::vector<mx::array>& inputs, const std::vector<int>& axes) {
  std::vector<int> out_axes(has_gw() ? 2 : 1, 0);
  auto f = mx::vmap(reference_backward(eps_, has_weight_, need_gw_, stream(), offset_),
                    axes, out_axes);
  return {f(inputs), out_axes};
}

std::vector<mx::Shape> RMSNormVJP::output_shapes(
    const std::vector<mx::array>& inputs) {
  if (has_gw()) return {inputs[0].shape(), inputs[1].shape()};
  return {inputs[0].shape()};
}

bool RMSNormVJP::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const RMSNormVJP&>(other);
  return eps_ == o.eps_ && has_weight_ == o.has_weight_ &&
         need_gw_ == o.need_gw_ && algorithm_ == o.algorithm_ && offset_ == o.offset_;
}

}  // namespace mlx_rmsnorm
