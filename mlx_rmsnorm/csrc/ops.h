// The ops of both norm families, as mlx/fast.h declares MLX's: RMSNorm and
// LayerNorm, each forward and backward, each with the residual add fused or
// not. rms_norm.cpp and layer_norm.cpp define them; the primitives they build
// are in primitives.h, where each call runs in routing.h.
//
// Shared contract. Inputs as mx.fast takes them: x has at least one
// dimension, weight and bias are each 1-D of size x.shape[-1] or absent, y
// has the built-in's dtype, which must be floating (ValueError otherwise).
// Integer and bool inputs are cast to the result type first (as the built-in
// does); float64 runs the norm in MLX ops in float64 (reference.h: our
// kernels read 16/32-bit floats; on a GPU stream MLX refuses float64, as it
// does for the built-in). While an export is traced (export_tracing()), and
// on a stream this build has no kernels for (a Metal GPU), the ops write MLX's
// own ops, so that an exported file holds what mx.fast writes and a program
// runs where the built-in does.
//
// The fused residual add: h = x + residual (rounded to h's dtype,
// result_type(x, residual)) and y = norm(h), the pre-norm transformer's
// `h = x + r; y = norm(h)` in one pass over memory (read x and residual,
// write y and h). The norm reads h as stored (rounded), exactly as the
// unfused composition does. x and residual take any shapes that
// x + residual broadcasts (the broadcast one is expanded: on the GPU a copy,
// so the fused op then moves about what the unfused add + norm moves).
// Its backward reads the forward's h and the cotangents g_y (of y, cast to
// y's dtype) and g_h (of h, cast to h's dtype), and returns gx = g_h +
// d(norm)/dh, the gradient of x and of residual alike.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "mlx/array.h"
#include "mlx/utils.h"

namespace mlx_rmsnorm {

namespace mx = mlx::core;

// Which GPU backward the RMSNorm family runs. Auto: persistent wherever a row
// fits its launch plan, split otherwise. Naive: the seed's 3-kernel chain
// (the baseline). The CPU path ignores it. Its values are those of
// cuda/rmsnorm.h's rmsnorm::Algorithm (gpu_util.cpp checks).
enum class Algorithm { Auto = 0, Persistent = 1, Split = 2, Naive = 3 };

Algorithm parse_algorithm(const std::string& name);

// ---- RMSNorm: y = x * rsqrt(mean(x^2, axis=-1) + eps) * (offset + w)

// The contract of mx.fast.rms_norm; y has dtype result_type(x, weight).
// `offset` (Gemma: 1) scales by offset + weight, formed in fp32 by the
// kernels instead of rounded to the weight's dtype; it needs a weight.
mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& weight,
                   float eps, mx::StreamOrDevice s = {}, float offset = 0.f);

// {y, h}: h = x + residual, y = rms_norm(h, weight, eps, offset); y has
// dtype result_type(h, weight).
std::vector<mx::array> add_rms_norm(const mx::array& x, const mx::array& residual,
                                    const std::optional<mx::array>& weight,
                                    float eps, float offset = 0.f,
                                    mx::StreamOrDevice s = {});

// {gx} or {gx, gw} of y = rms_norm(x, weight, eps) against the cotangent g;
// gw only with a weight and need_gw (a frozen weight: no gw work at all).
// g is cast to result_type(x, weight) when its dtype differs.
std::vector<mx::array> rms_norm_vjp(const mx::array& x,
                                    const std::optional<mx::array>& weight,
                                    const mx::array& g, float eps,
                                    Algorithm algorithm = Algorithm::Auto,
                                    bool need_gw = true,
                                    mx::StreamOrDevice s = {});

// {gx} or {gx, gw} of (y, h) = add_rms_norm(x, residual, weight, eps, offset)
// from the forward's h; the op behind mx.grad of add_rms_norm, callable
// directly (benchmarks, custom backward passes).
std::vector<mx::array> add_rms_norm_vjp(const mx::array& h,
                                        const std::optional<mx::array>& weight,
                                        const mx::array& g_y, const mx::array& g_h,
                                        float eps, float offset = 0.f,
                                        bool need_gw = true, mx::StreamOrDevice s = {});

// What mx.fast.rms_norm computes for our y = rms_norm(x) * (offset + w),
// with MLX's ops only (with offset 0 the built-in's own call): the op of an
// export trace, of a stream without our kernels, and of patch()'s routed
// calls that go to MLX.
mx::array builtin_rms_norm(const mx::array& x, const std::optional<mx::array>& w,
                           float eps, float offset, mx::StreamOrDevice s);

// ---- LayerNorm: y = (x - mean(x)) * rsqrt(var(x) + eps) * w + b

// The contract of mx.fast.layer_norm: y has dtype result_type(x, weight[,
// bias]) with a weight and x's dtype without one (a bias alone does not
// promote: the built-in's rule). On a GPU stream, rows that no LayerNorm
// plan covers go to mx.fast.layer_norm: past the tables, forward and
// backward; N not a multiple of a 16-byte vector, its forward and our fp32
// reference backward (detail::builtin_forward_reference_backward).
mx::array layer_norm(const mx::array& x, const std::optional<mx::array>& weight,
                     const std::optional<mx::array>& bias, float eps,
                     mx::StreamOrDevice s = {});

// {y, h}: h = x + residual, y = layer_norm(h, weight, bias, eps). On a GPU
// stream, rows that no plan of the fused add covers run x + residual and
// then layer_norm (which has its own fallbacks).
std::vector<mx::array> add_layer_norm(const mx::array& x, const mx::array& residual,
                                      const std::optional<mx::array>& weight,
                                      const std::optional<mx::array>& bias, float eps,
                                      mx::StreamOrDevice s = {});

// (gx, gw, gb) of y = layer_norm(x, weight, bias, eps) against the cotangent
// g; gw is absent without a weight or with need_gw false, gb without a bias
// or with need_gb false (no work is done for them). g is cast to y's dtype
// when it differs.
std::vector<std::optional<mx::array>> layer_norm_vjp(
    const mx::array& x, const std::optional<mx::array>& weight,
    const std::optional<mx::array>& bias, const mx::array& g, float eps,
    bool need_gw = true, bool need_gb = true, mx::StreamOrDevice s = {});

// (gx, gw, gb) of (y, h) = add_layer_norm(x, residual, weight, bias, eps)
// from the forward's h, as layer_norm_vjp returns them.
std::vector<std::optional<mx::array>> add_layer_norm_vjp(
    const mx::array& h, const std::optional<mx::array>& weight,
    const std::optional<mx::array>& bias, const mx::array& g_y, const mx::array& g_h, float eps,
    bool need_gw = true, bool need_gb = true, mx::StreamOrDevice s = {});

// mx.fast.layer_norm, counted as a call that ran MLX's op (routing.h).
mx::array builtin_layer_norm(const mx::array& x, const std::optional<mx::array>& w,
                             const std::optional<mx::array>& b, float eps,
                             mx::StreamOrDevice s);

namespace detail {
// mx.fast.layer_norm's forward with reference::layer's backward as its vjp,
// over (x, [w], [b]) already cast as layer_norm casts them: the GPU path for
// rows that are not a whole number of 16-byte vectors (layer_norm.cpp says
// why).
mx::array builtin_forward_reference_backward(const std::vector<mx::array>& inputs,
                                             bool has_w, bool has_b, float eps,
                                             mx::Stream s);
}  // namespace detail

}  // namespace mlx_rmsnorm
