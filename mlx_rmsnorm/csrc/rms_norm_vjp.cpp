#include "rms_norm_vjp.h"

#include <stdexcept>

#include "mlx/fast.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "op_util.h"
#include "reference.h"

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

}  // namespace

namespace detail {

std::vector<mx::array> make_vjp(const mx::array& x, const std::optional<mx::array>& w,
                                const mx::array& g, float eps, Algorithm algorithm,
                                bool need_gw, mx::Stream s, float offset) {
  NormParams p{.eps = eps, .offset = offset, .has_weight = w.has_value(),
               .need_gw = need_gw && w.has_value(), .algorithm = static_cast<int>(algorithm)};
  std::vector<mx::array> inputs = {x};
  std::vector<mx::Dtype> dtypes = {x.dtype()};
  if (w) inputs.push_back(*w);
  if (p.need_gw) dtypes.push_back(w->dtype());
  inputs.push_back(g);
  return NormPrimitive::make(std::make_shared<RMSNormVJP>(s, p), std::move(inputs), dtypes);
}

}  // namespace detail

std::vector<mx::array> rms_norm_vjp(const mx::array& x,
                                    const std::optional<mx::array>& weight,
                                    const mx::array& g, float eps,
                                    Algorithm algorithm, bool need_gw,
                                    mx::StreamOrDevice s) {
  auto out_type = check_inputs("rms_norm_vjp", x, weight);
  check_cotangent("rms_norm_vjp", g, "g", x);
  if (export_tracing()) return builtin_vjp(x, weight, g, eps, need_gw, s);
  auto stream = mx::to_stream(s);
  auto xk = kernel_input(x, out_type, stream);
  auto w = kernel_input(weight, out_type, stream);
  // No elements: zeros, as in rms_norm. float64: MLX ops in float64
  // (reference.h); the kernels read 16/32-bit floats.
  if (x.size() == 0) return no_elements(reference::backward(xk, w, g, eps, need_gw, stream), stream);
  if (out_type == mx::float64) return reference::backward(xk, w, g, eps, need_gw, stream);
  // g is read in the dtype of y, the tensor it is the gradient of.
  return detail::make_vjp(xk, w, cast(g, out_type, stream), eps, algorithm, need_gw, stream);
}

std::vector<mx::array> RMSNormVJP::reference(const std::vector<mx::array>& in) {
  return reference::backward(in[0], weight(in), tail(in, 0), eps(), has_gw(), stream(),
                             offset());
}

}  // namespace mlx_rmsnorm
