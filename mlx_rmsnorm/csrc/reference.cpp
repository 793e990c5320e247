#include "reference.h"

#include <cmath>
#include <numeric>

#include "mlx/ops.h"
#include "mlx/transforms.h"

namespace mlx_rmsnorm::reference {

namespace {

mx::array scalar(double v, mx::Dtype t) { return mx::array(v, t); }

// r = rsqrt(mean(x^2) + eps) over the last axis (keepdims), in x's dtype,
// as k * rsqrt(mean((x k)^2) + (eps k) k) with k a power of two near
// 1 / max(max|x|, sqrt(eps)), taken out of differentiation (stop_gradient;
// r does not depend on k, so the derivatives are exact). The argument of
// rsqrt is then O(1): MLX's derivative of rsqrt(u), (-0.5 / u) * rsqrt(u),
// is -r^3 / 2 for the plain u = mean(x^2), which overflows fp32 from RMS
// ~1e-13 with eps = 0, while here every derivative (of any order, forward
// or reverse mode) multiplies by k one factor at a time and forms nothing
// larger than the result it is part of. A power of two scales exactly, so r
// is the plain formula's value (up to rsqrt's rounding, and pow's where the
// device's pow(2, integer) is not exact). Plain MLX ops only (no custom_function,
// whose CustomTransforms node cannot infer output shapes): the graphs of
// float64, vmap and higher-order gradients compile with shapeless=True.
mx::array rstd(const mx::array& x, float eps, mx::Stream s) {
  auto t = x.dtype();
  // Rows of no elements (x of shape (..., 0)): nothing to scale, and no max
  // to take (MLX refuses to reduce an empty axis); r is then what the plain
  // formula gives, and every result that reads it is empty.
  if (x.shape(-1) == 0) {
    return mx::rsqrt(
        mx::add(mx::mean(mx::square(x, s), -1, /*keepdims=*/true, s), scalar(eps, t), s), s);
  }
  // The clip keeps k finite for zero rows (eps = 0) and inf/nan inputs
  // (which then give what the plain formula gives: r = inf, 0, nan).
  constexpr double kBound = 18446744073709551616.0;  // 2^64
  // k is computed from x with its gradient stopped at the start, not only at
  // the end: mx::jvp skips what descends from a StopGradient node, whereas a
  // max of x itself would get its tangent formed (MLX's takes an argmax,
  // which refuses arrays of no rows) only for it to be stopped.
  auto a = mx::max(mx::abs(mx::stop_gradient(x, s), s), -1, /*keepdims=*/true, s);
  a = mx::maximum(a, scalar(std::sqrt(static_cast<double>(eps)), t), s);
  a = mx::clip(a, scalar(1.0 / kBound, t), scalar(kBound, t), s);
  auto k = mx::stop_gradient(
      mx::power(scalar(2.0, t), mx::negative(mx::floor(mx::log2(a, s), s), s), s), s);
  auto xs = mx::multiply(x, k, s);
  auto u = mx::add(mx::mean(mx::square(xs, s), -1, /*keepdims=*/true, s),
                   mx::multiply(mx::multiply(scalar(eps, t), k, s), k, s), s);
  return mx::multiply(mx::rsqrt(u, s), k, s);
}

// offset + w in the compute type: the scale the kernels form in fp32.
mx::array scale_of(const mx::array& w, float offset, mx::Dtype ct, mx::Stream s) {
  auto wf = mx::astype(w, ct, s);
  return offset == 0.f ? wf : mx::add(wf, scalar(offset, ct), s);
}

// Sums over every axis but the last (a column sum: gw, gb).
mx::array column_sum(const mx::array& a, mx::Stream s) {
  std::vector<int> rows(a.ndim() - 1);
  std::iota(rows.begin(), rows.end(), 0);
  return rows.empty() ? a : mx::sum(a, rows, false, s);
}

}  // namespace

mx::Dtype compute_type(mx::Dtype out_type) {
  return out_type == mx::float64 ? mx::float64 : mx::float32;
}

namespace rms {

mx::Dtype result_type(const mx::array& x, const std::optional<mx::array>& w) {
  return w ? mx::promote_types(x.dtype(), w->dtype()) : x.dtype();
}

std::vector<mx::array> forward(const mx::array& x_in, const std::optional<mx::array>& residual,
                               const std::optional<mx::array>& w, float eps, float offset,
                               mx::Stream s) {
  auto x = residual ? mx::add(x_in, *residual, s) : x_in;
  auto out_type = result_type(x, w);
  auto ct = compute_type(out_type);
  auto xf = mx::astype(x, ct, s);
  auto y = mx::multiply(xf, rstd(xf, eps, s), s);
  if (w) y = mx::multiply(y, scale_of(*w, offset, ct, s), s);
  y = mx::astype(y, out_type, s);
  if (residual) return {y, x};
  return {y};
}

std::vector<mx::array> backward(const mx::array& x, const std::optional<mx::array>& w,
                                const mx::array& g, const std::optional<mx::array>& g_h,
                                float eps, bool need_gw, float offset, mx::Stream s) {
  auto ct = compute_type(result_type(x, w));
  auto xf = mx::astype(x, ct, s);
  auto gf = mx::astype(g, ct, s);
  auto r = rstd(xf, eps, s);
  auto v = w ? mx::multiply(gf, scale_of(*w, offset, ct, s), s) : gf;
  auto m = mx::mean(mx::multiply(v, xf, s), -1, /*keepdims=*/true, s);
  // x c = (x r) ((m r) r): the kernels' product, grouped so that its
  // tangents stay finite too (d(((m r) r) r) would be ~r^2 times that of
  // the result; (x r) is O(1)).
  auto mrr = mx::multiply(mx::multiply(m, r, s), r, s);
  auto gx = mx::subtract(mx::multiply(r, v, s),
                         mx::multiply(mx::multiply(xf, r, s), mrr, s), s);
  std::vector<mx::array> out = {mx::astype(gx, x.dtype(), s)};
  if (g_h) {
    // in compute_type(h's dtype): float64 for float64
    auto hct = compute_type(x.dtype());
    out[0] = mx::astype(mx::add(mx::astype(out[0], hct, s), mx::astype(*g_h, hct, s), s),
                        x.dtype(), s);
  }
  if (w && need_gw)
    out.push_back(mx::astype(column_sum(mx::multiply(gf, mx::multiply(xf, r, s), s), s),
                             w->dtype(), s));
  return out;
}

}  // namespace rms

namespace layer {

mx::Dtype result_type(const mx::array& x, const std::optional<mx::array>& w,
                      const std::optional<mx::array>& b) {
  if (!w) return x.dtype();
  return b ? mx::promote_types(mx::promote_types(x.dtype(), w->dtype()), b->dtype())
           : mx::promote_types(x.dtype(), w->dtype());
}

std::vector<mx::array> forward(const mx::array& x_in, const std::optional<mx::array>& residual,
                               const std::optional<mx::array>& w,
                               const std::optional<mx::array>& b, float eps,
                               mx::Dtype out_type, mx::Stream s) {
  auto x = residual ? mx::add(x_in, *residual, s) : x_in;
  auto ct = compute_type(out_type);
  auto xf = mx::astype(x, ct, s);
  auto d = mx::subtract(xf, mx::mean(xf, -1, /*keepdims=*/true, s), s);
  auto var = mx::mean(mx::square(d, s), -1, /*keepdims=*/true, s);
  auto y = mx::multiply(d, mx::rsqrt(mx::add(var, scalar(eps, ct), s), s), s);
  if (w) y = mx::multiply(y, mx::astype(*w, ct, s), s);
  if (b) y = mx::add(y, mx::astype(*b, ct, s), s);
  y = mx::astype(y, out_type, s);
  if (residual) return {y, x};
  return {y};
}

std::vector<mx::array> backward(const mx::array& x, const std::optional<mx::array>& w,
                                const std::optional<mx::array>& b, const mx::array& g,
                                const std::optional<mx::array>& g_h, float eps, bool need_gw,
                                bool need_gb, mx::Stream s) {
  auto ct = compute_type(w ? mx::promote_types(x.dtype(), w->dtype()) : x.dtype());
  if (g.dtype() == mx::float64) ct = mx::float64;
  auto xf = mx::astype(x, ct, s);
  auto gf = mx::astype(g, ct, s);
  auto d = mx::subtract(xf, mx::mean(xf, -1, /*keepdims=*/true, s), s);
  auto var = mx::mean(mx::square(d, s), -1, /*keepdims=*/true, s);
  auto r = mx::rsqrt(mx::add(var, scalar(eps, ct), s), s);
  auto xh = mx::multiply(d, r, s);
  auto v = w ? mx::multiply(gf, mx::astype(*w, ct, s), s) : gf;
  auto mv = mx::mean(v, -1, /*keepdims=*/true, s);
  auto c = mx::mean(mx::multiply(v, xh, s), -1, /*keepdims=*/true, s);
  auto gx = mx::multiply(r, mx::subtract(mx::subtract(v, mv, s), mx::multiply(xh, c, s), s), s);
  if (g_h) gx = mx::add(gx, mx::astype(*g_h, ct, s), s);
  std::vector<mx::array> out = {mx::astype(gx, x.dtype(), s)};
  if (w && need_gw)
    out.push_back(mx::astype(column_sum(mx::multiply(gf, xh, s), s), w->dtype(), s));
  if (b && need_gb) out.push_back(mx::astype(column_sum(gf, s), b->dtype(), s));
  return out;
}

}  // namespace layer

}  // namespace mlx_rmsnorm::reference
