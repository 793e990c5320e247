#include "rms_norm_vjp.h"

#include <stdexcept>

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

std::vector<mx::array> rms_norm_vjp(const mx::array& x,
                                    const std::optional<mx::array>& weight,
                                    const mx::array& g, float eps,
                                    Algorithm algorithm, mx::StreamOrDevice s) {
  auto out_type = check_inputs("rms_norm_vjp", x, weight);
  if (g.shape() != x.shape()) {
    auto str = [](const mx::Shape& shape) {
      std::string out = "(";
      for (size_t i = 0; i < shape.size(); ++i)
        out += (i ? ", " : "") + std::to_string(shape[i]);
      return out + (shape.size() == 1 ? ",)" : ")");
    };
    throw std::invalid_argument("[rms_norm_vjp] g must have the shape of x " +
                                str(x.shape()) + " but has shape " +
                                str(g.shape()) + ".");
  }
  if (!mx::issubdtype(g.dtype(), mx::floating)) {
    throw std::invalid_argument("[rms_norm_vjp] g must be a floating array.");
  }
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs = {mx::contiguous(x, false, stream)};
  std::vector<mx::Shape> shapes = {x.shape()};
  std::vector<mx::Dtype> dtypes = {x.dtype()};
  if (weight) {
    inputs.push_back(mx::contiguous(*weight, false, stream));
    shapes.push_back(weight->shape());
    dtypes.push_back(weight->dtype());
  }
  // g is read in the dtype of y, the tensor it is the gradient of.
  inputs.push_back(mx::contiguous(mx::astype(g, out_type, stream), false, stream));
  return mx::array::make_arrays(
      std::move(shapes), std::move(dtypes),
      std::make_shared<RMSNormVJP>(stream, eps, weight.has_value(), algorithm),
      std::move(inputs));
}

namespace {

// The backward as a function of (x, [w,] g) built from MLX ops, which is
// what jvp, vmap and higher-order vjp differentiate.
auto reference_backward(float eps, bool has_w, mx::Stream s) {
  return [eps, has_w, s](const std::vector<mx::array>& in) {
    return reference::backward(in[0], reference::weight_of(in, has_w),
                               in.back(), eps, s);
  };
}

}  // namespace

std::vector<mx::array> RMSNormVJP::vjp(const std::vector<mx::array>& primals,
                                       const std::vector<mx::array>& cotangents,
                                       const std::vector<int>& argnums,
                                       const std::vector<mx::array>&) {
  auto grads = mx::vjp(reference_backward(eps_, has_weight_, stream()), primals,
                       cotangents)
                   .second;
  std::vector<mx::array> out;
  for (int i : argnums) out.push_back(grads[i]);
  return out;
}

std::vector<mx::array> RMSNormVJP::jvp(const std::vector<mx::array>& primals,
                                       const std::vector<mx::array>& tangents,
                                       const std::vector<int>& argnums) {
  auto all_tangents = reference::full_tangents(primals, tangents, argnums, stream());
  return mx::jvp(reference_backward(eps_, has_weight_, stream()), primals,
                 all_tangents)
      .second;
}

std::pair<std::vector<mx::array>, std::vector<int>> RMSNormVJP::vmap(
    const std::vector<mx::array>& inputs, const std::vector<int>& axes) {
  std::vector<int> out_axes(has_weight_ ? 2 : 1, 0);
  auto f = mx::vmap(reference_backward(eps_, has_weight_, stream()), axes,
                    out_axes);
  return {f(inputs), out_axes};
}

std::vector<mx::Shape> RMSNormVJP::output_shapes(
    const std::vector<mx::array>& inputs) {
  if (has_weight_) return {inputs[0].shape(), inputs[1].shape()};
  return {inputs[0].shape()};
}

bool RMSNormVJP::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const RMSNormVJP&>(other);
  return eps_ == o.eps_ && has_weight_ == o.has_weight_ &&
         algorithm_ == o.algorithm_;
}

}  // namespace mlx_rmsnorm
