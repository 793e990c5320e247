#include "add_rms_norm_vjp.h"

#include "mlx/ops.h"
#include "op_util.h"
#include "reference.h"

namespace mlx_rmsnorm {

namespace {

// {gx, [gw]} in MLX ops: the primitive's reference, the export's form and
// the float64 path.
std::vector<mx::array> reference_backward(const mx::array& h, const std::optional<mx::array>& w,
                                          const mx::array& g_y, const mx::array& g_h,
                                          float eps, float offset, bool need_gw, mx::Stream s) {
  auto out = reference::backward(h, w, g_y, eps, need_gw, s, offset);
  // gx + g_h in the compute type (float64 for float64), rounded once
  auto ct = reference::compute_type(h.dtype());
  out[0] = mx::astype(mx::add(mx::astype(out[0], ct, s), mx::astype(g_h, ct, s), s),
                      h.dtype(), s);
  return out;
}

}  // namespace

namespace detail {

std::vector<mx::array> make_add_vjp(const mx::array& h, const std::optional<mx::array>& w,
                                    const mx::array& g_y, const mx::array& g_h, float eps,
                                    float offset, bool need_gw, mx::Stream s) {
  NormParams p{.eps = eps, .offset = offset, .has_weight = w.has_value(),
               .need_gw = need_gw && w.has_value()};
  std::vector<mx::array> inputs = {h};
  std::vector<mx::Dtype> dtypes = {h.dtype()};
  if (w) inputs.push_back(*w);
  if (p.need_gw) dtypes.push_back(w->dtype());
  inputs.push_back(g_y);
  inputs.push_back(g_h);
  return NormPrimitive::make(std::make_shared<AddRMSNormVJP>(s, p), std::move(inputs), dtypes);
}

}  // namespace detail

std::vector<mx::array> add_rms_norm_vjp(const mx::array& h,
                                        const std::optional<mx::array>& weight,
                                        const mx::array& g_y, const mx::array& g_h,
                                        float eps, float offset, bool need_gw,
                                        mx::StreamOrDevice s) {
  auto out_type = check_inputs("add_rms_norm_vjp", h, weight, std::nullopt, "h");
  check_offset("add_rms_norm_vjp", weight, offset);
  check_cotangent("add_rms_norm_vjp", g_y, "g_y", h, "h");
  check_cotangent("add_rms_norm_vjp", g_h, "g_h", h, "h");
  auto stream = mx::to_stream(s);
  auto hk = kernel_input(h, out_type, stream);
  auto w = kernel_input(weight, out_type, stream);
  auto gy = cast(g_y, out_type, stream);
  auto gh = cast(g_h, hk.dtype(), stream);
  need_gw = need_gw && w.has_value();
  // MLX ops: what the export writes, float64; no elements: zeros, as in rms_norm.
  if (export_tracing() || out_type == mx::float64 || hk.dtype() == mx::float64 || hk.size() == 0) {
    auto grads = reference_backward(hk, w, gy, gh, eps, offset, need_gw, stream);
    return hk.size() == 0 && !export_tracing() ? no_elements(grads, stream) : grads;
  }
  return detail::make_add_vjp(hk, w, gy, gh, eps, offset, need_gw, stream);
}

std::vector<mx::array> AddRMSNormVJP::reference(const std::vector<mx::array>& in) {
  return reference_backward(in[0], weight(in), tail(in, 0), tail(in, 1), eps(), offset(),
                            has_gw(), stream());
}

}  // namespace mlx_rmsnorm
