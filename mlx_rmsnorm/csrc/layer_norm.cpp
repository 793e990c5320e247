// The LayerNorm family: layer_norm, add_layer_norm and their backward ops
// (ops.h), the LayerNorm / LayerNormVJP primitives' references and the
// forward's backward node. One forward and one backward builder serve both
// ops, with the residual add as a switch.
#include "mlx/fast.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "op_util.h"
#include "primitives.h"
#include "reference.h"
#include "routing.h"

namespace mlx_rmsnorm {

mx::array builtin_layer_norm(const mx::array& x, const std::optional<mx::array>& w,
                             const std::optional<mx::array>& b, float eps,
                             mx::StreamOrDevice s) {
  count(Counted::BuiltinLayerNorm);
  return mx::fast::layer_norm(x, w, b, eps, s);
}

namespace {

bool on_gpu(const mx::Stream& s) { return s.device.type == mx::Device::DeviceType::gpu; }

// (x, [w], [b]) of the op's inputs, cast as layer_norm casts them.
std::optional<mx::array> weight_in(const std::vector<mx::array>& in, bool has_w) {
  if (!has_w) return std::nullopt;
  return in[1];
}
std::optional<mx::array> bias_in(const std::vector<mx::array>& in, bool has_w, bool has_b) {
  if (!has_b) return std::nullopt;
  return in[has_w ? 2 : 1];
}

// The LayerNormVJP node for inputs that passed the op's checks and casts (x
// or h, w, b in the kernels' dtypes, g in y's, g_h in h's): {gx, [gw],
// [gb]}. b is an input only when gb is wanted: it gives gb its dtype.
std::vector<mx::array> make_layer_vjp(const mx::array& x, const std::optional<mx::array>& w,
                                      const std::optional<mx::array>& b, const mx::array& g,
                                      const std::optional<mx::array>& g_h, float eps,
                                      bool need_gw, bool need_gb, mx::Stream s) {
  need_gb = need_gb && b.has_value();
  NormParams p{.eps = eps, .add = g_h.has_value(), .has_weight = w.has_value(),
               .has_bias = need_gb, .need_gw = need_gw && w.has_value(), .need_gb = need_gb};
  std::vector<mx::array> inputs = {x};
  std::vector<mx::Dtype> dtypes = {x.dtype()};
  if (w) inputs.push_back(*w);
  if (p.need_gw) dtypes.push_back(w->dtype());
  if (need_gb) inputs.push_back(*b), dtypes.push_back(b->dtype());
  inputs.push_back(g);
  if (g_h) inputs.push_back(*g_h);
  return NormPrimitive::make(std::make_shared<LayerNormVJP>(s, p), std::move(inputs),
                             std::move(dtypes));
}

// (gx, gw, gb) as the vjp ops return them, from a backward's outputs
// (gx, [gw], [gb]).
std::vector<std::optional<mx::array>> vjp_outputs(const std::vector<mx::array>& grads,
                                                  bool need_gw, bool need_gb) {
  std::vector<std::optional<mx::array>> out = {grads[0], std::nullopt, std::nullopt};
  if (need_gw) out[1] = grads[1];
  if (need_gb) out[2] = grads[need_gw ? 2 : 1];
  return out;
}

// What the built-in's own backward gives (an export trace, a stream without
// our kernels, and rows no plan of ours covers on the GPU): the graph then
// holds only MLX's ops.
std::vector<std::optional<mx::array>> builtin_vjp(
    const mx::array& x, const std::optional<mx::array>& weight,
    const std::optional<mx::array>& bias, const mx::array& g, float eps, bool need_gw,
    bool need_gb, mx::Dtype out_type, mx::Stream s) {
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
  return vjp_outputs(grads, with_w, with_b);
}

// layer_norm (residual null: {y}) and add_layer_norm ({y, h}).
std::vector<mx::array> layer_forward(const char* op, const mx::array& x,
                                     const mx::array* residual,
                                     const std::optional<mx::array>& weight,
                                     const std::optional<mx::array>& bias, float eps,
                                     mx::StreamOrDevice s) {
  mx::Shape shape;  // h's (with a residual)
  mx::Dtype h_type = x.dtype(), out_type = x.dtype();
  if (residual) {
    auto t = check_add_inputs(op, x, *residual, weight, bias);
    shape = std::move(t.shape), h_type = t.h_type, out_type = t.out_type;
  } else {
    out_type = check_inputs(op, x, weight, bias);
  }
  auto stream = mx::to_stream(s);
  // The unfused composition, MLX's add and then our layer_norm, which casts
  // h, runs float64 in float64 and sends rows it has no GPU plan for to the
  // built-in: what the fused op is where it has no kernel.
  auto composition = [&]() -> std::vector<mx::array> {
    auto h = mx::add(x, *residual, stream);
    return {layer_forward("layer_norm", h, nullptr, weight, bias, eps, stream)[0], h};
  };
  if (builtin_only(stream)) {
    if (!residual) return {builtin_layer_norm(x, weight, bias, eps, stream)};
    auto h = mx::add(x, *residual, stream);
    return {builtin_layer_norm(h, weight, bias, eps, stream), h};
  }
  // An h the kernels do not store (integer or bool inputs, as layer_norm
  // accepts them, and float64): the composition itself.
  if (residual && !is_kernel_dtype(h_type)) return composition();
  // With a residual, x and it in h's dtype and shape (expand_to; ops.h says
  // what an expanded one costs on the GPU).
  auto xk = residual ? expand_to(x, shape, h_type, stream) : kernel_input(x, out_type, stream);
  std::optional<mx::array> rk;
  if (residual) rk = expand_to(*residual, shape, h_type, stream);
  auto w = kernel_input(weight, out_type, stream);
  auto b = kernel_input(bias, out_type, stream);
  // No elements: zeros of the reference's shapes and dtypes, no reduction
  // (op_util.h). float64: MLX ops in float64.
  if (out_type == mx::float64 || xk.size() == 0) {
    auto y = reference::layer::forward(xk, rk, w, b, eps, out_type, stream);
    return xk.size() == 0 ? no_elements(y, stream) : y;
  }
  const int n = xk.shape(-1);
  if (on_gpu(stream) &&
      !layer_gpu_planned(xk.dtype(), out_type, n, stream, /*add=*/residual != nullptr)) {
    // The fused add: the composition, whose layer_norm decides between its
    // kernels and the built-in. Rows too long for our tables: the built-in,
    // both directions. Rows that are not a whole number of 16-byte vectors:
    // the built-in's forward but our fp32 reference backward, since MLX
    // 0.32.4's LayerNormVJP on the GPU gets gx wrong there for 16-bit dtypes
    // (H200, N = 100: 7.5-9.5% of the largest element for float16 and
    // bfloat16 alike; docs/layernorm.md).
    if (residual) return composition();
    if (vector_rows(xk.dtype(), n)) return {builtin_layer_norm(x, weight, bias, eps, stream)};
    std::vector<mx::array> inputs = {xk};
    if (w) inputs.push_back(*w);
    if (b) inputs.push_back(*b);
    return {detail::builtin_forward_reference_backward(inputs, w.has_value(), b.has_value(), eps,
                                                       stream)};
  }
  std::vector<mx::array> inputs = {xk};
  if (rk) inputs.push_back(*rk);
  if (w) inputs.push_back(*w);
  if (b) inputs.push_back(*b);
  NormParams p{.eps = eps, .add = residual != nullptr, .has_weight = w.has_value(),
               .has_bias = b.has_value()};
  count(residual ? Counted::AddLayerNormPlugin : Counted::LayerNormPlugin);
  std::vector<mx::Dtype> dtypes = {out_type};
  if (residual) dtypes.push_back(h_type);
  return NormPrimitive::make(std::make_shared<LayerNorm>(stream, p), std::move(inputs),
                             std::move(dtypes));
}

// layer_norm_vjp (g_h null) and add_layer_norm_vjp (x is the forward's h).
std::vector<std::optional<mx::array>> layer_backward(
    const char* op, const mx::array& x, const std::optional<mx::array>& weight,
    const std::optional<mx::array>& bias, const mx::array& g, const mx::array* g_h, float eps,
    bool need_gw, bool need_gb, mx::StreamOrDevice s) {
  auto out_type = check_vjp_inputs(op, x, weight, bias, 0.f, g, g_h);
  auto stream = mx::to_stream(s);
  const bool builtin = builtin_only(stream);
  if (builtin && !g_h)
    return builtin_vjp(x, weight, bias, g, eps, need_gw, need_gb, out_type, stream);
  auto xk = kernel_input(x, out_type, stream);
  bool reference_only = out_type == mx::float64 || x.size() == 0;
  const int n = x.shape(-1);
  if (builtin || (!reference_only && on_gpu(stream) &&
                  !layer_gpu_planned(xk.dtype(), out_type, n, stream, /*add=*/g_h != nullptr))) {
    // The fused add (MLX's ops, or rows its kernels do not take on the GPU):
    // layer_norm_vjp of h (the built-in's backward, or its own kernels or
    // reference as it decides), plus g_h. Without the add, as layer_norm:
    // the built-in past our tables, our fp32 reference where rows are not a
    // whole number of 16-byte vectors (the built-in's gx is wrong there for
    // 16-bit dtypes).
    if (g_h) {
      auto grads = layer_backward("layer_norm_vjp", x, weight, bias, g, nullptr, eps, need_gw,
                                  need_gb, stream);
      grads[0] = mx::add(*grads[0], cast(*g_h, grads[0]->dtype(), stream), stream);
      return grads;
    }
    if (vector_rows(xk.dtype(), n))
      return builtin_vjp(x, weight, bias, g, eps, need_gw, need_gb, out_type, stream);
    reference_only = true;
  }
  auto w = kernel_input(weight, out_type, stream);
  auto b = kernel_input(bias, out_type, stream);
  need_gw = need_gw && w.has_value();
  need_gb = need_gb && b.has_value();
  // g in y's dtype, g_h in h's, as the kernels read them. Without the add,
  // the reference reads g as given: its fp32 path for rows that are not
  // whole vectors then sees g before any rounding to y's dtype.
  auto gy = cast(g, out_type, stream);
  std::optional<mx::array> gh;
  if (g_h) gh = cast(*g_h, xk.dtype(), stream);
  std::vector<mx::array> grads;
  if (reference_only) {
    grads = reference::layer::backward(xk, w, b, g_h ? gy : g, gh, eps, need_gw, need_gb, stream);
    if (x.size() == 0) grads = no_elements(grads, stream);  // zeros, as in rms_norm
  } else {
    grads = make_layer_vjp(xk, w, b, gy, gh, eps, need_gw, need_gb, stream);
  }
  return vjp_outputs(grads, need_gw, need_gb);
}

}  // namespace

namespace detail {

mx::array builtin_forward_reference_backward(const std::vector<mx::array>& inputs,
                                             bool has_w, bool has_b, float eps,
                                             mx::Stream s) {
  count(Counted::BuiltinLayerNorm);
  auto fun = [has_w, has_b, eps, s](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{mx::fast::layer_norm(
        in[0], weight_in(in, has_w), bias_in(in, has_w, has_b), eps, s)};
  };
  auto vjp = [has_w, has_b, eps, s](const std::vector<mx::array>& primals,
                                    const std::vector<mx::array>& cotangents,
                                    const std::vector<mx::array>&) {
    // (gx, [gw], [gb]): the primals' order
    return reference::layer::backward(primals[0], weight_in(primals, has_w),
                                      bias_in(primals, has_w, has_b), cotangents[0],
                                      std::nullopt, eps, true, true, s);
  };
  return mx::custom_function(fun, vjp)(inputs)[0];
}

}  // namespace detail

mx::array layer_norm(const mx::array& x, const std::optional<mx::array>& weight,
                     const std::optional<mx::array>& bias, float eps, mx::StreamOrDevice s) {
  return layer_forward("layer_norm", x, nullptr, weight, bias, eps, s)[0];
}

std::vector<mx::array> add_layer_norm(const mx::array& x, const mx::array& residual,
                                      const std::optional<mx::array>& weight,
                                      const std::optional<mx::array>& bias, float eps,
                                      mx::StreamOrDevice s) {
  return layer_forward("add_layer_norm", x, &residual, weight, bias, eps, s);
}

std::vector<std::optional<mx::array>> layer_norm_vjp(
    const mx::array& x, const std::optional<mx::array>& weight,
    const std::optional<mx::array>& bias, const mx::array& g, float eps, bool need_gw,
    bool need_gb, mx::StreamOrDevice s) {
  return layer_backward("layer_norm_vjp", x, weight, bias, g, nullptr, eps, need_gw, need_gb, s);
}

std::vector<std::optional<mx::array>> add_layer_norm_vjp(
    const mx::array& h, const std::optional<mx::array>& weight,
    const std::optional<mx::array>& bias, const mx::array& g_y, const mx::array& g_h, float eps,
    bool need_gw, bool need_gb, mx::StreamOrDevice s) {
  return layer_backward("add_layer_norm_vjp", h, weight, bias, g_y, &g_h, eps, need_gw, need_gb,
                        s);
}

std::vector<mx::array> LayerNorm::reference(const std::vector<mx::array>& in) {
  auto w = weight(in), b = bias(in);
  std::optional<mx::array> residual;
  if (add()) residual = in[1];
  // in[0] is x (with the add, in h's dtype)
  return reference::layer::forward(in[0], residual, w, b, eps(),
                                   reference::layer::result_type(in[0], w, b), stream());
}

std::vector<mx::array> LayerNorm::vjp(const std::vector<mx::array>& primals,
                                      const std::vector<mx::array>& cotangents,
                                      const std::vector<int>& argnums,
                                      const std::vector<mx::array>& outputs) {
  // As RMSNorm::vjp: gw and gb only where asked for; with the add, from the
  // forward's h, x and residual both getting gx.
  auto w = weight(primals), b = bias(primals);
  const int w_arg = weight_arg(), b_arg = bias_arg();
  const bool need_gw = wanted(argnums, w_arg), need_gb = wanted(argnums, b_arg);
  auto g = cast(cotangents[0], reference::layer::result_type(primals[0], w, b), stream());
  std::optional<mx::array> g_h;
  if (add()) g_h = cast(cotangents[1], outputs[1].dtype(), stream());
  auto grads = make_layer_vjp(add() ? outputs[1] : primals[0], w, b, g, g_h, eps(), need_gw,
                              need_gb, stream());
  std::vector<mx::array> out;
  out.reserve(argnums.size());
  for (int i : argnums) {
    if (i == w_arg) out.push_back(grads[1]);
    else if (i == b_arg) out.push_back(grads[need_gw ? 2 : 1]);
    else out.push_back(grads[0]);  // x (and residual)
  }
  return out;
}

std::vector<mx::array> LayerNormVJP::reference(const std::vector<mx::array>& in) {
  std::optional<mx::array> g_h;
  if (add()) g_h = tail(in, 1);
  return reference::layer::backward(in[0], weight(in), bias(in), tail(in, 0), g_h, eps(),
                                    has_gw(), need_gb(), stream());
}

}  // namespace mlx_rmsnorm
