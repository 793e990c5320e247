// Backward of the fused residual add + RMSNorm: the op and its primitive.
#pragma once

#include <optional>
#include <vector>

#include "norm_primitive.h"

namespace mlx_rmsnorm {

// (gx, [gw]) of (y, h) = add_rms_norm(x, residual, weight, eps, offset)
// against the cotangents g_y and g_h, from the forward's h: gx is the
// gradient of x and of residual alike. gw only with a weight and need_gw.
// g_y is cast to y's dtype, g_h to h's. The op behind mx.grad of
// add_rms_norm, callable directly (benchmarks, custom backward passes).
std::vector<mx::array> add_rms_norm_vjp(const mx::array& h,
                                        const std::optional<mx::array>& weight,
                                        const mx::array& g_y, const mx::array& g_h,
                                        float eps, float offset = 0.f,
                                        bool need_gw = true, mx::StreamOrDevice s = {});

namespace detail {
// The AddRMSNormVJP node for inputs already in the kernels' dtypes: h (the
// forward's second output), w, g_y in y's dtype, g_h in h's. Returns {gx}
// or {gx, gw}: gx = g_h + d(norm)/dh, the gradient of both x and residual.
std::vector<mx::array> make_add_vjp(const mx::array& h, const std::optional<mx::array>& w,
                                    const mx::array& g_y, const mx::array& g_h, float eps,
                                    float offset, bool need_gw, mx::Stream s);
}  // namespace detail

// Inputs (h, [w,] g_y, g_h); outputs gx, and gw when has_gw(). The forward's
// h is read instead of x and residual: one tensor, not two, and the very
// values the norm saw. Params: eps, has_weight, need_gw, offset.
class AddRMSNormVJP : public NormPrimitive {
  MLX_RMSNORM_NORM_PRIMITIVE(AddRMSNormVJP, "AddRMSNormPluginVJP", .tail_rows = 2)
};

}  // namespace mlx_rmsnorm
