// Backward of the fused residual add + LayerNorm: the op and its primitive.
#pragma once

#include <optional>
#include <vector>

#include "norm_primitive.h"

namespace mlx_rmsnorm {

// (gx, gw, gb) of (y, h) = add_layer_norm(x, residual, weight, bias, eps)
// against the cotangents g_y and g_h, from the forward's h: gx = g_h +
// d(norm)/dh is the gradient of x and of residual alike. gw is absent without
// a weight or with need_gw false, gb without a bias or with need_gb false (no
// work is done for them). g_y is cast to y's dtype, g_h to h's. The op behind
// mx.grad of add_layer_norm, callable directly (benchmarks, custom backward
// passes).
std::vector<std::optional<mx::array>> add_layer_norm_vjp(
    const mx::array& h, const std::optional<mx::array>& weight,
    const std::optional<mx::array>& bias, const mx::array& g_y, const mx::array& g_h, float eps,
    bool need_gw = true, bool need_gb = true, mx::StreamOrDevice s = {});

// AddRMSNormVJP's node with LayerNorm's bias: inputs (h, [w], [b], g_y, g_h),
// b only when gb is wanted (as in LayerNormVJP), outputs gx, then gw if
// has_gw(), gb if need_gb(). Params: eps, has_weight, need_gw, has_bias =
// need_gb.
class AddLayerNormVJP : public NormPrimitive {
  MLX_RMSNORM_NORM_PRIMITIVE(AddLayerNormVJP, "AddLayerNormPluginVJP", .tail_rows = 2)
};

namespace detail {
// That node for inputs already in the kernels' dtypes (b in gb's, g_y in y's,
// g_h in h's).
std::vector<mx::array> make_add_layer_vjp(const mx::array& h, const std::optional<mx::array>& w,
                                          const std::optional<mx::array>& b,
                                          const mx::array& g_y, const mx::array& g_h, float eps,
                                          bool need_gw, bool need_gb, mx::Stream s);
}  // namespace detail

}  // namespace mlx_rmsnorm
