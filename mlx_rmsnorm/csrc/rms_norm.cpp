// The RMSNorm family: rms_norm, add_rms_norm and their backward ops (ops.h),
// the RMSNorm / RMSNormVJP primitives' references and the forward's
// backward node. One forward and one backward builder serve both ops, with
// the residual add as a switch.
#include <numeric>
#include <stdexcept>

#include "mlx/fast.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "op_util.h"
#include "primitives.h"
#include "reference.h"
#include "routing.h"

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

mx::array builtin_rms_norm(const mx::array& x, const std::optional<mx::array>& w,
                           float eps, float offset, mx::StreamOrDevice s) {
  count(Counted::BuiltinRmsNorm);
  if (offset == 0.f || !w) return mx::fast::rms_norm(x, w, eps, s);
  // offset + w in fp32, then y cast back to result_type(x, w).
  auto out_type = reference::rms::result_type(x, w);
  auto scale = mx::add(mx::astype(*w, mx::float32, s), mx::array(offset, mx::float32), s);
  return mx::astype(mx::fast::rms_norm(x, scale, eps, s), out_type, s);
}

namespace {

// The RMSNormVJP node for inputs that passed the op's checks and casts (x or
// h and w in the kernels' dtypes, g in y's, g_h in h's): {gx} or {gx, gw}.
std::vector<mx::array> make_rms_vjp(const mx::array& x, const std::optional<mx::array>& w,
                                    const mx::array& g, const std::optional<mx::array>& g_h,
                                    float eps, Algorithm algorithm, bool need_gw, mx::Stream s,
                                    float offset) {
  NormParams p{.eps = eps, .offset = offset, .add = g_h.has_value(),
               .has_weight = w.has_value(), .need_gw = need_gw && w.has_value(),
               .algorithm = algorithm};
  std::vector<mx::array> inputs = {x};
  std::vector<mx::Dtype> dtypes = {x.dtype()};
  if (w) inputs.push_back(*w);
  if (p.need_gw) dtypes.push_back(w->dtype());
  inputs.push_back(g);
  if (g_h) inputs.push_back(*g_h);
  return NormPrimitive::make(std::make_shared<RMSNormVJP>(s, p), std::move(inputs), dtypes);
}

// What the built-in's own backward gives, for rms_norm_vjp in an export
// trace or on a stream without our kernels: MLX's ops only.
std::vector<mx::array> builtin_vjp(const mx::array& x, const std::optional<mx::array>& weight,
                                   const mx::array& g, float eps, bool need_gw, mx::Stream s) {
  bool with_w = weight && need_gw;
  auto f = [&](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{
        mx::fast::rms_norm(in[0], with_w ? std::optional(in[1]) : weight, eps, s)};
  };
  std::vector<mx::array> primals = {x};
  if (with_w) primals.push_back(*weight);
  return mx::vjp(f, primals, {mx::astype(g, reference::rms::result_type(x, weight), s)}).second;
}

// rms_norm (residual null: {y}) and add_rms_norm ({y, h}). Inputs go to the
// primitive as they are: no Contiguous node (eval_cpu and eval_gpu read
// strided inputs, or copy them, themselves) and a cast only where a dtype is
// one the kernels do not read.
std::vector<mx::array> rms_forward(const char* op, const mx::array& x,
                                   const mx::array* residual,
                                   const std::optional<mx::array>& weight, float eps,
                                   float offset, mx::StreamOrDevice s) {
  mx::Shape shape;  // h's (with a residual)
  mx::Dtype h_type = x.dtype(), out_type = x.dtype();
  if (residual) {
    auto t = check_add_inputs(op, x, *residual, weight);
    shape = std::move(t.shape), h_type = t.h_type, out_type = t.out_type;
  } else {
    out_type = check_inputs(op, x, weight);
  }
  check_offset(op, weight, offset);
  auto stream = mx::to_stream(s);
  if (builtin_only(stream)) {
    if (!residual) return {builtin_rms_norm(x, weight, eps, offset, stream)};
    auto h = mx::add(x, *residual, stream);
    return {builtin_rms_norm(h, weight, eps, offset, stream), h};
  }
  // An h the kernels do not store (integer or bool inputs, as rms_norm
  // accepts them, and float64): the composition itself, MLX's add and our
  // rms_norm (which casts h, or runs float64 in float64).
  if (residual && !is_kernel_dtype(h_type)) {
    auto h = mx::add(x, *residual, stream);
    return {rms_forward("rms_norm", h, nullptr, weight, eps, offset, stream)[0], h};
  }
  // With a residual, x and it in h's dtype and shape (expand_to: on the GPU
  // an expanded one is copied into a row-contiguous temporary, one more
  // write and read of h's size).
  auto xk = residual ? expand_to(x, shape, h_type, stream) : kernel_input(x, out_type, stream);
  std::optional<mx::array> rk;
  if (residual) rk = expand_to(*residual, shape, h_type, stream);
  auto w = kernel_input(weight, out_type, stream);
  // No elements: zeros, no kernel launch and no reduction (op_util.h).
  // float64: MLX ops in float64 (reference.h); the kernels read 16/32-bit
  // floats.
  if (xk.size() == 0)
    return no_elements(reference::rms::forward(xk, rk, w, eps, offset, stream), stream);
  if (out_type == mx::float64) return reference::rms::forward(xk, rk, w, eps, offset, stream);
  std::vector<mx::array> inputs = {xk};
  if (rk) inputs.push_back(*rk);
  if (w) inputs.push_back(*w);
  NormParams p{.eps = eps, .offset = offset, .add = residual != nullptr,
               .has_weight = w.has_value()};
  count(residual ? Counted::AddRMSNormPlugin : Counted::RMSNormPlugin);
  std::vector<mx::Dtype> dtypes = {out_type};
  if (residual) dtypes.push_back(h_type);
  return NormPrimitive::make(std::make_shared<RMSNorm>(stream, p), std::move(inputs),
                             std::move(dtypes));
}

// rms_norm_vjp (g_h null) and add_rms_norm_vjp (x is the forward's h).
std::vector<mx::array> rms_backward(const char* op, const mx::array& x,
                                    const std::optional<mx::array>& weight, const mx::array& g,
                                    const mx::array* g_h, float eps, float offset,
                                    Algorithm algorithm, bool need_gw, mx::StreamOrDevice s) {
  auto out_type = check_vjp_inputs(op, x, weight, std::nullopt, offset, g, g_h);
  auto stream = mx::to_stream(s);
  // Without the add, MLX's own backward of mx.fast.rms_norm; the fused add's
  // is the reference below, in MLX ops as well.
  const bool builtin = builtin_only(stream);
  if (builtin && !g_h) return builtin_vjp(x, weight, g, eps, need_gw, stream);
  auto xk = kernel_input(x, out_type, stream);
  auto w = kernel_input(weight, out_type, stream);
  // g is read in the dtype of y, the tensor it is the gradient of; g_h in h's.
  auto gy = cast(g, out_type, stream);
  std::optional<mx::array> gh;
  if (g_h) gh = cast(*g_h, xk.dtype(), stream);
  need_gw = need_gw && w.has_value();
  // MLX ops: float64, and the fused add's builtin; no elements: zeros, as in
  // rms_norm.
  if (builtin || out_type == mx::float64 || xk.size() == 0) {
    auto grads = reference::rms::backward(xk, w, gy, gh, eps, need_gw, offset, stream);
    return xk.size() == 0 && !builtin ? no_elements(grads, stream) : grads;
  }
  return make_rms_vjp(xk, w, gy, gh, eps, algorithm, need_gw, stream, offset);
}

}  // namespace

mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& weight, float eps,
                   mx::StreamOrDevice s, float offset) {
  return rms_forward("rms_norm", x, nullptr, weight, eps, offset, s)[0];
}

std::vector<mx::array> add_rms_norm(const mx::array& x, const mx::array& residual,
                                    const std::optional<mx::array>& weight, float eps,
                                    float offset, mx::StreamOrDevice s) {
  return rms_forward("add_rms_norm", x, &residual, weight, eps, offset, s);
}

std::vector<mx::array> rms_norm_vjp(const mx::array& x, const std::optional<mx::array>& weight,
                                    const mx::array& g, float eps, Algorithm algorithm,
                                    bool need_gw, mx::StreamOrDevice s) {
  return rms_backward("rms_norm_vjp", x, weight, g, nullptr, eps, 0.f, algorithm, need_gw, s);
}

std::vector<mx::array> add_rms_norm_vjp(const mx::array& h,
                                        const std::optional<mx::array>& weight,
                                        const mx::array& g_y, const mx::array& g_h, float eps,
                                        float offset, bool need_gw, mx::StreamOrDevice s) {
  return rms_backward("add_rms_norm_vjp", h, weight, g_y, &g_h, eps, offset, Algorithm::Auto,
                      need_gw, s);
}

std::vector<mx::array> RMSNorm::reference(const std::vector<mx::array>& in) {
  std::optional<mx::array> residual;
  if (add()) residual = in[1];
  return reference::rms::forward(in[0], residual, weight(in), eps(), offset(), stream());
}

std::vector<mx::array> RMSNorm::vjp(const std::vector<mx::array>& primals,
                                    const std::vector<mx::array>& cotangents,
                                    const std::vector<int>& argnums,
                                    const std::vector<mx::array>& outputs) {
  // The primals passed the op's checks already: build the backward node
  // directly, with gw only when the weight's gradient is asked for (frozen
  // norms, LoRA). With the add, it reads the forward's h (outputs[1]) rather
  // than x and residual, which both get gx.
  auto w = weight(primals);
  auto g = cast(cotangents[0], reference::rms::result_type(primals[0], w), stream());
  std::optional<mx::array> g_h;
  if (add()) g_h = cast(cotangents[1], outputs[1].dtype(), stream());
  const int w_arg = weight_arg();
  auto grads = make_rms_vjp(add() ? outputs[1] : primals[0], w, g, g_h, eps(), Algorithm::Auto,
                            wanted(argnums, w_arg), stream(), offset());
  std::vector<mx::array> out;
  out.reserve(argnums.size());
  for (int i : argnums) out.push_back(i == w_arg ? grads[1] : grads[0]);
  return out;
}

// The weight carries the batch (x too, or not): batch axes in front, the
// weight broadcast over x's rows as (B, 1, ..., 1, N), and the op-level
// formula on the broadcast arrays. Not mx::vmap of that formula: a graph
// vmapped that way failed mx.compile(..., shapeless=True) on a new row
// count ("[broadcast_shapes] Shapes (3,7,1) and (1,4,1)"), while these
// ops (expand_dims, no reshape to fixed sizes) infer every shape. The fused
// add maps its reference.
std::pair<std::vector<mx::array>, std::vector<int>> RMSNorm::vmap_reference(
    const std::vector<mx::array>& inputs, const std::vector<int>& axes) {
  if (add()) return NormPrimitive::vmap_reference(inputs, axes);
  auto s = stream();
  auto x = axes[0] >= 0 ? mx::moveaxis(inputs[0], axes[0], 0, s)
                        : mx::expand_dims(inputs[0], 0, s);
  auto wb = mx::moveaxis(inputs[1], axes[1], 0, s);
  std::vector<int> row_axes(x.ndim() - 2);
  std::iota(row_axes.begin(), row_axes.end(), 1);
  if (!row_axes.empty()) wb = mx::expand_dims(wb, row_axes, s);
  return {reference::rms::forward(x, std::nullopt, wb, eps(), offset(), s), {0}};
}

std::vector<mx::array> RMSNormVJP::reference(const std::vector<mx::array>& in) {
  std::optional<mx::array> g_h;
  if (add()) g_h = tail(in, 1);
  return reference::rms::backward(in[0], weight(in), tail(in, 0), g_h, eps(), has_gw(),
                                  offset(), stream());
}

}  // namespace mlx_rmsnorm
