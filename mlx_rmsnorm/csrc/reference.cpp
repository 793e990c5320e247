#include "reference.h"

#include <algorithm>
#include <numeric>

#include "mlx/ops.h"
#include "mlx/transforms.h"

namespace mlx_rmsnorm::reference {

namespace {

mx::array scalar(double v, mx::Dtype t) { return mx::array(v, t); }

mx::array rstd_plain(const mx::array& x, float eps, mx::Stream s) {
  auto ms = mx::mean(mx::square(x, s), -1, /*keepdims=*/true, s);
  return mx::rsqrt(mx::add(ms, scalar(eps, x.dtype()), s), s);
}

// r = rsqrt(mean(x^2) + eps) over the last axis (keepdims), in x's dtype,
// with its derivatives written out. MLX differentiates rsqrt(u) as
// (-0.5 / u) * rsqrt(u) = -r^3 / 2, which overflows fp32 from RMS ~1e-13
// with eps = 0 although the gradient itself is far from overflow.
// dr/dx = -x r^3 / n is formed as (x r) * ((dr r) r) / n, where x r is O(1),
// so nothing larger than r^2 is ever formed.
mx::array rstd(const mx::array& x, float eps, mx::Stream s) {
  auto fun = [eps, s](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{rstd_plain(in[0], eps, s)};
  };
  auto vjp = [s](const std::vector<mx::array>& primals,
                 const std::vector<mx::array>& cotangents,
                 const std::vector<mx::array>& outputs) {
    const auto& x = primals[0];
    const auto& r = outputs[0];
    int n = std::max(x.ndim() ? x.shape(-1) : 1, 1);
    auto t = mx::multiply(mx::multiply(cotangents[0], r, s), r, s);
    auto dx = mx::multiply(mx::multiply(x, r, s), t, s);
    return std::vector<mx::array>{
        mx::multiply(dx, scalar(-1.0 / n, x.dtype()), s)};
  };
  auto jvp = [eps, s](const std::vector<mx::array>& primals,
                      const std::vector<mx::array>& tangents,
                      const std::vector<int>&) {
    const auto& x = primals[0];
    auto r = rstd(x, eps, s);
    auto m = mx::mean(mx::multiply(mx::multiply(x, r, s), tangents[0], s), -1,
                      /*keepdims=*/true, s);
    return std::vector<mx::array>{
        mx::negative(mx::multiply(mx::multiply(m, r, s), r, s), s)};
  };
  // Keeps the derivatives above under vmap (MLX's default would vmap `fun`
  // and lose them): the batch axis goes in front, rows stay the last axis.
  auto vmap = [eps, s](const std::vector<mx::array>& inputs,
                       const std::vector<int>& axes)
      -> std::pair<std::vector<mx::array>, std::vector<int>> {
    if (axes[0] < 0) return {{rstd(inputs[0], eps, s)}, {-1}};
    auto x = mx::moveaxis(inputs[0], axes[0], 0, s);
    return {{rstd(x, eps, s)}, {0}};
  };
  return mx::custom_function(fun, vjp, jvp, vmap)({x})[0];
}

}  // namespace

mx::Dtype result_type(const mx::array& x, const std::optional<mx::array>& w) {
  return w ? mx::promote_types(x.dtype(), w->dtype()) : x.dtype();
}

mx::Dtype compute_type(mx::Dtype out_type) {
  return out_type == mx::float64 ? mx::float64 : mx::float32;
}

std::optional<mx::array> weight_of(const std::vector<mx::array>& inputs,
                                   bool has_weight) {
  if (!has_weight) return std::nullopt;
  return inputs[1];
}

// offset + w in the compute type: the scale the kernels form in fp32.
static mx::array scale_of(const mx::array& w, float offset, mx::Dtype ct,
                          mx::Stream s) {
  auto wf = mx::astype(w, ct, s);
  return offset == 0.f ? wf : mx::add(wf, scalar(offset, ct), s);
}

mx::array forward(const mx::array& x, const std::optional<mx::array>& w,
                  float eps, mx::StreamOrDevice s_, float offset) {
  auto s = mx::to_stream(s_);
  auto out_type = result_type(x, w);
  auto ct = compute_type(out_type);
  auto xf = mx::astype(x, ct, s);
  auto y = mx::multiply(xf, rstd(xf, eps, s), s);
  if (w) y = mx::multiply(y, scale_of(*w, offset, ct, s), s);
  return mx::astype(y, out_type, s);
}

std::vector<mx::array> backward(const mx::array& x,
                                const std::optional<mx::array>& w,
                                const mx::array& g, float eps, bool need_gw,
                                mx::StreamOrDevice s_, float offset) {
  auto s = mx::to_stream(s_);
  auto ct = compute_type(result_type(x, w));
  auto xf = mx::astype(x, ct, s);
  auto gf = mx::astype(g, ct, s);
  auto r = rstd(xf, eps, s);
  auto v = w ? mx::multiply(gf, scale_of(*w, offset, ct, s), s) : gf;
  auto m = mx::mean(mx::multiply(v, xf, s), -1, /*keepdims=*/true, s);
  auto c = mx::multiply(mx::multiply(mx::multiply(m, r, s), r, s), r, s);
  auto gx = mx::subtract(mx::multiply(r, v, s), mx::multiply(xf, c, s), s);
  std::vector<mx::array> out = {mx::astype(gx, x.dtype(), s)};
  if (w && need_gw) {
    std::vector<int> rows(x.ndim() - 1);
    std::iota(rows.begin(), rows.end(), 0);
    auto gw = mx::multiply(gf, mx::multiply(xf, r, s), s);
    if (!rows.empty()) gw = mx::sum(gw, rows, false, s);
    out.push_back(mx::astype(gw, w->dtype(), s));
  }
  return out;
}

std::vector<mx::array> full_tangents(const std::vector<mx::array>& primals,
                                     const std::vector<mx::array>& tangents,
                                     const std::vector<int>& argnums,
                                     mx::StreamOrDevice s) {
  std::vector<mx::array> all;
  for (size_t i = 0; i < primals.size(); ++i) {
    auto it = std::find(argnums.begin(), argnums.end(), static_cast<int>(i));
    all.push_back(it == argnums.end() ? mx::zeros_like(primals[i], s)
                                      : tangents[it - argnums.begin()]);
  }
  return all;
}

}  // namespace mlx_rmsnorm::reference
