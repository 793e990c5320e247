// RMSNorm written with MLX ops. The primitives use these only where no kernel
// of ours applies: float64 (MLX's GPU has no float64, and our kernels read
// 16- and 32-bit floats only), and as the function that jvp, vmap and
// second-order vjp differentiate; never for the plain fp32/fp16/bf16 forward
// or backward.
//
// One formula for every path, the kernels' (cuda/backward.cuh, eval_cpu.cpp):
//   r = rsqrt(mean(x^2) + eps), c = ((mean(v * x) * r) * r) * r, v = g * w,
//   gx = r * v - x * c, gw = sum over rows of g * x * r,
// multiplied in that order so that no intermediate is larger than r^2: with
// eps = 0 and rows of RMS down to ~1e-19 nothing overflows in fp32 (r^3 alone
// would from RMS ~1e-13). Here x * c is grouped as (x * r) * ((m * r) * r)
// and r is computed from x scaled by a power of two (rstd() in the .cpp), so
// that their derivatives of every order and mode (jvp, vjp, jvp of a vjp,
// second-order gradients) stay finite where the first-order ones are. Plain
// MLX ops only: every node can infer its output shape, so these graphs
// compile with mx.compile(..., shapeless=True).
#pragma once

#include <optional>

#include "mlx/array.h"
#include "mlx/utils.h"

namespace mlx_rmsnorm::reference {

namespace mx = mlx::core;

// The dtype of y: result_type(x, w), the promotion of x's and w's dtypes.
mx::Dtype result_type(const mx::array& x, const std::optional<mx::array>& w);

// The dtype the reference computes in for a result of type `out_type`:
// float64 for float64, fp32 otherwise.
mx::Dtype compute_type(mx::Dtype out_type);

// y, computed in compute_type(result_type(x, w)) and cast to that result type.
// With a weight the scale is offset + w, formed in the compute type (Gemma's
// 1 + w without rounding it to the weight's dtype first).
mx::array forward(const mx::array& x, const std::optional<mx::array>& w,
                  float eps, mx::StreamOrDevice s = {}, float offset = 0.f);

// {gx} or {gx, gw} (gw only with a weight and need_gw), computed in
// compute_type(result_type(x, w)) and cast to x's and w's dtypes.
std::vector<mx::array> backward(const mx::array& x,
                                const std::optional<mx::array>& w,
                                const mx::array& g, float eps, bool need_gw,
                                mx::StreamOrDevice s = {}, float offset = 0.f);

}  // namespace mlx_rmsnorm::reference
