#include "add_rms_norm_vjp.h"

#include <stdexcept>

#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "reference.h"
#include "rms_norm.h"

namespace mlx_rmsnorm {

namespace {

std::string shape_str(const mx::Shape& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

// The backward as a function of (h, [w,] g_y, g_h) built from MLX ops, which
// is what jvp, vmap and higher-order vjp differentiate.
auto reference_backward(float eps, float offset, bool has_w, bool need_gw,
                        mx::Stream s) {
  return [=](const std::vector<mx::array>& in) {
    const auto& h = in[0];
    const auto& g_h = in.back();
    auto out = reference::backward(h, reference::weight_of(in, has_w),
                                   in[in.size() - 2], eps, need_gw, s, offset);
    // gx + g_h in the compute type (float64 for float64), rounded once
    auto ct = reference::compute_type(h.dtype());
    out[0] = mx::astype(mx::add(mx::astype(out[0], ct, s), mx::astype(g_h, ct, s), s),
                        h.dtype(), s);
    return out;
  };
}

}  // namespace

namespace detail {

std::vector<mx::array> make_add_vjp(const mx::array& h,
                                    const std::optional<mx::array>& w,
                                    const mx::array& g_y, const mx::array& g_h,
                                    float eps, float offset, bool need_gw,
                                    mx::Stream s) {
  need_gw = need_gw && w.has_value();
  // float64 (only reachable through the reference path's own vjp, which
  // never builds this node) stays here for completeness: MLX ops.
  auto prim = std::make_shared<AddRMSNormVJP>(s, eps, w.has_value(), need_gw, offset);
  std::vector<mx::array> inputs = {h};
  if (w) inputs.push_back(*w);
  inputs.push_back(g_y);
  inputs.push_back(g_h);
  if (!need_gw) {
    return {mx::array(h.shape(), h.dtype(), std::move(prim), std::move(inputs))};
  }
  return mx::array::make_arrays({h.shape(), w->shape()}, {h.dtype(), w->dtype()},
                                std::move(prim), std::move(inputs));
}

}  // namespace detail

std::vector<mx::array> add_rms_norm_vjp(const mx::array& h,
                                        const std::optional<mx::array>& weight,
                                        const mx::array& g_y, const mx::array& g_h,
                                        float eps, float offset, bool need_gw,
                                        mx::StreamOrDevice s) {
  auto out_type = check_inputs("add_rms_norm_vjp", h, weight, "h");
  check_offset("add_rms_norm_vjp", weight, offset);
  for (auto [g, name] : {std::pair{&g_y, "g_y"}, std::pair{&g_h, "g_h"}}) {
    if (g->shape() != h.shape()) {
      throw std::invalid_argument(std::string("[add_rms_norm_vjp] ") + name +
                                  " must have the shape of h " + shape_str(h.shape()) +
                                  " but has shape " + shape_str(g->shape()) + ".");
    }
    if (!mx::issubdtype(g->dtype(), mx::floating)) {
      throw std::invalid_argument(std::string("[add_rms_norm_vjp] ") + name +
                                  " must be a floating array but has dtype " +
                                  dtype_str(g->dtype()) + ".");
    }
  }
  auto stream = mx::to_stream(s);
  auto hk = kernel_input(h, out_type, stream);
  std::optional<mx::array> w;
  if (weight) w = kernel_input(*weight, out_type, stream);
  auto gy = g_y.dtype() == out_type ? g_y : mx::astype(g_y, out_type, stream);
  auto gh = g_h.dtype() == hk.dtype() ? g_h : mx::astype(g_h, hk.dtype(), stream);
  need_gw = need_gw && w.has_value();
  check_not_empty_on_gpu("add_rms_norm_vjp", hk, stream);
  if (export_tracing() || out_type == mx::float64 || hk.dtype() == mx::float64 || hk.size() == 0) {
    // MLX ops: what the export writes, float64, and arrays of no elements.
    std::vector<mx::array> in = {hk};
    if (w) in.push_back(*w);
    in.push_back(gy);
    in.push_back(gh);
    return reference_backward(eps, offset, w.has_value(), need_gw, stream)(in);
  }
  return detail::make_add_vjp(hk, w, gy, gh, eps, offset, need_gw, stream);
}

std::vector<mx::array> AddRMSNormVJP::vjp(const std::vector<mx::array>& primals,
                                          const std::vector<mx::array>& cotangents,
                                          const std::vector<int>& argnums,
                                          const std::vector<mx::array>&) {
  auto grads = mx::vjp(reference_backward(eps_, offset_, has_weight_, need_gw_, stream()),
                       primals, cotangents)
                   .second;
  std::vector<mx::array> out;
  for (int i : argnums) out.push_back(grads[i]);
  return out;
}

std::vector<mx::array> AddRMSNormVJP::jvp(const std::vector<mx::array>& primals,
                                          const std::vector<mx::array>& tangents,
                                          const std::vector<int>& argnums) {
  auto all_tangents = reference::full_tangents(primals, tangents, argnums, stream());
  return mx::jvp(reference_backward(eps_, offset_, has_weight_, need_gw_, stream()),
                 primals, all_tangents)
      .second;
}

std::pair<std::vector<mx::array>, std::vector<int>> AddRMSNormVJP::vmap(
    const std::vector<mx::array>& inputs, const std::vector<int>& axes) {
  std::vector<int> out_axes(has_gw() ? 2 : 1, 0);
  auto f = mx::vmap(reference_backward(eps_, offset_, has_weight_, need_gw_, stream()),
                    axes, out_axes);
  return {f(inputs), out_axes};
}

std::vector<mx::Shape> AddRMSNormVJP::output_shapes(
    const std::vector<mx::array>& inputs) {
  if (has_gw()) return {inputs[0].shape(), inputs[1].shape()};
  return {inputs[0].shape()};
}

bool AddRMSNormVJP::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const AddRMSNormVJP&>(other);
  return eps_ == o.eps_ && has_weight_ == o.has_weight_ && need_gw_ == o.need_gw_ &&
         offset_ == o.offset_;
}

}  // namespace mlx_rmsnorm
