#include "layer_norm.h"

#include <numeric>

#include "layer_norm_vjp.h"
#include "mlx/fast.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "op_util.h"
#include "reference.h"
#ifdef MLX_RMSNORM_CUDA
#include "gpu_util.h"
#endif

namespace mlx_rmsnorm {

namespace {

mx::array scalar(double v, mx::Dtype t) { return mx::array(v, t); }

// (x, [w], [b]) of the op's inputs, cast as layer_norm casts them.
std::optional<mx::array> weight_in(const std::vector<mx::array>& in, bool has_w) {
  if (!has_w) return std::nullopt;
  return in[1];
}
std::optional<mx::array> bias_in(const std::vector<mx::array>& in, bool has_w, bool has_b) {
  if (!has_b) return std::nullopt;
  return in[has_w ? 2 : 1];
}

}  // namespace

namespace layer_reference {

mx::Dtype result_type(const mx::array& x, const std::optional<mx::array>& w,
                      const std::optional<mx::array>& b) {
  if (!w) return x.dtype();
  return b ? mx::promote_types(mx::promote_types(x.dtype(), w->dtype()), b->dtype())
           : mx::promote_types(x.dtype(), w->dtype());
}

mx::array forward(const mx::array& x, const std::optional<mx::array>& w,
                  const std::optional<mx::array>& b, float eps, mx::Dtype out_type,
                  mx::Stream s) {
  auto ct = reference::compute_type(out_type);
  auto xf = mx::astype(x, ct, s);
  auto d = mx::subtract(xf, mx::mean(xf, -1, /*keepdims=*/true, s), s);
  auto var = mx::mean(mx::square(d, s), -1, /*keepdims=*/true, s);
  auto y = mx::multiply(d, mx::rsqrt(mx::add(var, scalar(eps, ct), s), s), s);
  if (w) y = mx::multiply(y, mx::astype(*w, ct, s), s);
  if (b) y = mx::add(y, mx::astype(*b, ct, s), s);
  return mx::astype(y, out_type, s);
}

std::vector<mx::array> backward(const mx::array& x, const std::optional<mx::array>& w,
                                const mx::array& g, float eps, bool need_gw,
                                std::optional<mx::Dtype> gb_dtype, mx::Stream s,
                                const std::optional<mx::array>& g_h) {
  auto ct = reference::compute_type(w ? mx::promote_types(x.dtype(), w->dtype()) : x.dtype());
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
  std::vector<int> rows(x.ndim() - 1);
  std::iota(rows.begin(), rows.end(), 0);
  auto col_sum = [&](mx::array a) { return rows.empty() ? a : mx::sum(a, rows, false, s); };
  if (w && need_gw) out.push_back(mx::astype(col_sum(mx::multiply(gf, xh, s)), w->dtype(), s));
  if (gb_dtype) out.push_back(mx::astype(col_sum(gf), *gb_dtype, s));
  return out;
}

}  // namespace layer_reference

namespace detail {

bool gpu_planned(mx::Dtype x_type, mx::Dtype out_type, int n, const mx::Stream& s, bool add) {
#ifdef MLX_RMSNORM_CUDA
  gpu::use_device(s);
  return rmsnorm::layer_norm_planned(gpu::kernel_dtype(x_type), gpu::kernel_dtype(out_type), n,
                                     add);
#else
  (void)x_type, (void)out_type, (void)n, (void)s, (void)add;
  return false;
#endif
}

bool vector_rows(mx::Dtype x_type, int n) {
  return n % (16 / static_cast<int>(mx::size_of(x_type))) == 0;
}

mx::array builtin_forward_reference_backward(const std::vector<mx::array>& inputs,
                                             bool has_w, bool has_b, float eps,
                                             mx::Stream s) {
  auto fun = [has_w, has_b, eps, s](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{mx::fast::layer_norm(
        in[0], weight_in(in, has_w), bias_in(in, has_w, has_b), eps, s)};
  };
  auto vjp = [has_w, has_b, eps, s](const std::vector<mx::array>& primals,
                                    const std::vector<mx::array>& cotangents,
                                    const std::vector<mx::array>&) {
    auto b = bias_in(primals, has_w, has_b);
    std::optional<mx::Dtype> gb_dtype;
    if (b) gb_dtype = b->dtype();
    // (gx, [gw], [gb]): the primals' order
    return layer_reference::backward(primals[0], weight_in(primals, has_w), cotangents[0], eps,
                                     true, gb_dtype, s);
  };
  return mx::custom_function(fun, vjp)(inputs)[0];
}

}  // namespace detail

mx::array layer_norm(const mx::array& x, const std::optional<mx::array>& weight,
                     const std::optional<mx::array>& bias, float eps,
                     mx::StreamOrDevice s) {
  auto out_type = check_inputs("layer_norm", x, weight, bias);
  if (export_tracing()) return mx::fast::layer_norm(x, weight, bias, eps, s);
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs = {kernel_input(x, out_type, stream)};
  if (weight) inputs.push_back(kernel_input(*weight, out_type, stream));
  if (bias) inputs.push_back(kernel_input(*bias, out_type, stream));
  const bool has_w = weight.has_value(), has_b = bias.has_value();
  // No elements: zeros, as in rms_norm. float64: MLX ops in float64.
  if (out_type == mx::float64 || x.size() == 0) {
    auto y = layer_reference::forward(inputs[0], weight_in(inputs, has_w),
                                      bias_in(inputs, has_w, has_b), eps, out_type, stream);
    return x.size() == 0 ? no_elements({y}, stream)[0] : y;
  }
  if (stream.device.type == mx::Device::DeviceType::gpu &&
      !detail::gpu_planned(inputs[0].dtype(), out_type, x.shape(-1), stream)) {
    // Rows too long for our tables: the built-in, both directions. Rows that
    // are not a whole number of 16-byte vectors: the built-in's forward but
    // our fp32 reference backward, since MLX 0.32.4's LayerNormVJP on the GPU
    // gets gx wrong there for 16-bit dtypes (H200, N = 100: 7.5-9.5% of the
    // largest element for float16 and bfloat16 alike; docs/layernorm.md).
    if (detail::vector_rows(inputs[0].dtype(), x.shape(-1)))
      return mx::fast::layer_norm(x, weight, bias, eps, s);
    return detail::builtin_forward_reference_backward(inputs, has_w, has_b, eps, stream);
  }
  NormParams p{.eps = eps, .has_weight = has_w, .has_bias = has_b};
  return NormPrimitive::make(std::make_shared<LayerNorm>(stream, p), std::move(inputs),
                             {out_type})[0];
}

std::vector<mx::array> LayerNorm::reference(const std::vector<mx::array>& in) {
  auto w = weight(in), b = bias(in);
  return {layer_reference::forward(in[0], w, b, eps(), layer_reference::result_type(in[0], w, b),
                                   stream())};
}

std::vector<mx::array> LayerNorm::vjp(const std::vector<mx::array>& primals,
                                      const std::vector<mx::array>& cotangents,
                                      const std::vector<int>& argnums,
                                      const std::vector<mx::array>&) {
  auto w = weight(primals), b = bias(primals);
  const int w_arg = has_weight() ? 1 : -1;
  const int b_arg = has_bias() ? (has_weight() ? 2 : 1) : -1;
  const bool need_gw = wanted(argnums, w_arg), need_gb = wanted(argnums, b_arg);
  auto g = cast(cotangents[0], layer_reference::result_type(primals[0], w, b), stream());
  auto grads = detail::make_layer_vjp(primals[0], w, b, g, eps(), need_gw, need_gb, stream());
  std::vector<mx::array> out;
  out.reserve(argnums.size());
  for (int i : argnums) {
    if (i == 0) out.push_back(grads[0]);
    else if (i == w_arg) out.push_back(grads[1]);
    else out.push_back(grads[need_gw ? 2 : 1]);
  }
  return out;
}

}  // namespace mlx_rmsnorm
