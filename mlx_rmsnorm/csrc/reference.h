// Both norms written with MLX ops: reference::rms and reference::layer. The
// primitives use these only where no kernel of ours applies: float64 (MLX's
// GPU has no float64, and our kernels read 16- and 32-bit floats only),
// arrays of no elements (their shapes and dtypes), and as the function that
// jvp, vmap and second-order vjp differentiate; never for the plain
// fp32/fp16/bf16 forward or backward. Each takes the fused residual add as a
// switch, as the primitives do: a forward given a residual returns {y, h}
// with h = x + residual; a backward given g_h (x being the forward's h)
// returns gx + g_h.
//
// RMSNorm: one formula for every path, the kernels' (cuda/backward.cuh,
// rms_norm_cpu.cpp):
//   r = rsqrt(mean(x^2) + eps), c = ((mean(v * x) * r) * r) * r, v = g * w,
//   gx = r * v - x * c, gw = sum over rows of g * x * r,
// multiplied in that order so that no intermediate is larger than r^2: with
// eps = 0 and rows of RMS down to ~1e-19 nothing overflows in fp32 (r^3 alone
// would from RMS ~1e-13). Here x * c is grouped as (x * r) * ((m * r) * r)
// and r is computed from x scaled by a power of two (rstd() in the .cpp), so
// that their derivatives of every order and mode (jvp, vjp, jvp of a vjp,
// second-order gradients) stay finite where the first-order ones are.
//
// LayerNorm: the formulas of row_math.cuh's LayerRow, in fp32 (float64 for
// float64 results).
//
// Plain MLX ops only: every node can infer its output shape, so these graphs
// compile with mx.compile(..., shapeless=True).
#pragma once

#include <optional>
#include <vector>

#include "mlx/array.h"
#include "mlx/utils.h"

namespace mlx_rmsnorm::reference {

namespace mx = mlx::core;

// The dtype a reference computes in for a result of type `out_type`:
// float64 for float64, fp32 otherwise.
mx::Dtype compute_type(mx::Dtype out_type);

namespace rms {

// The dtype of y: result_type(x, w), the promotion of x's and w's dtypes.
mx::Dtype result_type(const mx::array& x, const std::optional<mx::array>& w);

// {y}, or with a residual {y, h}: y computed in compute_type(result_type(x,
// w)) (x being h with a residual) and cast to that result type. With a
// weight the scale is offset + w, formed in the compute type (Gemma's 1 + w
// without rounding it to the weight's dtype first).
std::vector<mx::array> forward(const mx::array& x, const std::optional<mx::array>& residual,
                               const std::optional<mx::array>& w, float eps, float offset,
                               mx::Stream s);

// {gx} or {gx, gw} (gw only with a weight and need_gw), computed in
// compute_type(result_type(x, w)) and cast to x's and w's dtypes. With g_h,
// gx (so rounded to x's dtype) + g_h is added in compute_type(x's dtype) and
// rounded again.
std::vector<mx::array> backward(const mx::array& x, const std::optional<mx::array>& w,
                                const mx::array& g, const std::optional<mx::array>& g_h,
                                float eps, bool need_gw, float offset, mx::Stream s);

}  // namespace rms

namespace layer {

// The built-in's output dtype: result_type(x, w[, b]) with a weight, x's
// without one (a bias alone does not promote).
mx::Dtype result_type(const mx::array& x, const std::optional<mx::array>& w,
                      const std::optional<mx::array>& b);

// {y}, or with a residual {y, h}, y in out_type.
std::vector<mx::array> forward(const mx::array& x, const std::optional<mx::array>& residual,
                               const std::optional<mx::array>& w,
                               const std::optional<mx::array>& b, float eps,
                               mx::Dtype out_type, mx::Stream s);

// {gx, [gw], [gb]}: gw with a weight and need_gw, gb with need_gb and a b
// (which gives gb its dtype), in x's, w's and b's dtypes. With g_h: gx =
// g_h + d(norm)/dx, added in the compute type and rounded once, as the
// kernels do.
std::vector<mx::array> backward(const mx::array& x, const std::optional<mx::array>& w,
                                const std::optional<mx::array>& b, const mx::array& g,
                                const std::optional<mx::array>& g_h, float eps, bool need_gw,
                                bool need_gb, mx::Stream s);

}  // namespace layer

}  // namespace mlx_rmsnorm::reference
