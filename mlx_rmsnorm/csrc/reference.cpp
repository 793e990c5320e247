#include "reference.h"

#include <algorithm>
#include <numeric>

#include "mlx/ops.h"

namespace mlx_rmsnorm::reference {

namespace {

// rsqrt(mean(x^2) + eps) over the last axis, keepdims, fp32.
mx::array rstd(const mx::array& xf, float eps, mx::StreamOrDevice s) {
  auto ms = mx::mean(mx::square(xf, s), -1, /*keepdims=*/true, s);
  return mx::rsqrt(mx::add(ms, mx::array(eps, mx::float32), s), s);
}

}  // namespace

std::optional<mx::array> weight_of(const std::vector<mx::array>& inputs,
                                   bool has_weight) {
  if (!has_weight) return std::nullopt;
  return inputs[1];
}

mx::array forward(const mx::array& x, const std::optional<mx::array>& w,
                  float eps, mx::StreamOrDevice s) {
  auto xf = mx::astype(x, mx::float32, s);
  auto y = mx::multiply(xf, rstd(xf, eps, s), s);
  auto out_type = x.dtype();
  if (w) {
    y = mx::multiply(y, mx::astype(*w, mx::float32, s), s);
    out_type = mx::promote_types(x.dtype(), w->dtype());
  }
  return mx::astype(y, out_type, s);
}

std::vector<mx::array> backward(const mx::array& x,
                                const std::optional<mx::array>& w,
                                const mx::array& g, float eps,
                                mx::StreamOrDevice s) {
  auto xf = mx::astype(x, mx::float32, s);
  auto gf = mx::astype(g, mx::float32, s);
  auto r = rstd(xf, eps, s);
  auto v = w ? mx::multiply(gf, mx::astype(*w, mx::float32, s), s) : gf;
  // gx = r * v - x * mean(v * x) * r^3
  auto c = mx::multiply(mx::mean(mx::multiply(v, xf, s), -1, true, s),
                        mx::power(r, mx::array(3.0f), s), s);
  auto gx = mx::subtract(mx::multiply(r, v, s), mx::multiply(xf, c, s), s);
  std::vector<mx::array> out = {mx::astype(gx, x.dtype(), s)};
  if (w) {
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
