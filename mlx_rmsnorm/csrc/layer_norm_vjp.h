// LayerNorm backward: the op and its primitive.
#pragma once

#include <optional>
#include <vector>

#include "norm_primitive.h"

namespace mlx_rmsnorm {

// (gx, gw, gb) of y = layer_norm(x, weight, bias, eps) against the cotangent
// g; gw is absent without a weight or with need_gw false, gb without a bias
// or with need_gb false (no work is done for them). Inputs as layer_norm
// takes them; g is cast to the output's dtype when it differs.
std::vector<std::optional<mx::array>> layer_norm_vjp(
    const mx::array& x, const std::optional<mx::array>& weight,
    const std::optional<mx::array>& bias, const mx::array& g, float eps,
    bool need_gw = true, bool need_gb = true, mx::StreamOrDevice s = {});

namespace detail {
// What a LayerNorm backward node is made of (LayerNormVJP's; the fused add's
// AddLayerNormVJP appends g_h to the inputs): its params, its inputs (x, [w],
// [b], g; b only when gb is wanted: it gives gb its dtype) and the dtypes of
// its outputs (gx, [gw], [gb]).
struct LayerVjpNode {
  NormParams params;
  std::vector<mx::array> inputs;
  std::vector<mx::Dtype> dtypes;
};
LayerVjpNode layer_vjp_node(const mx::array& x, const std::optional<mx::array>& w,
                            const std::optional<mx::array>& b, const mx::array& g, float eps,
                            bool need_gw, bool need_gb);
// layer_reference::backward with gb's dtype taken from b (given when gb is
// wanted) and g_h for the fused add: the ops' float64 path and the VJP
// primitives' references.
std::vector<mx::array> layer_vjp_reference(const mx::array& x, const std::optional<mx::array>& w,
                                           const std::optional<mx::array>& b, const mx::array& g,
                                           float eps, bool need_gw, bool need_gb, mx::Stream s,
                                           const std::optional<mx::array>& g_h = std::nullopt);
// (gx, gw, gb) as the vjp ops return them, from a backward's outputs
// (gx, [gw], [gb]).
std::vector<std::optional<mx::array>> layer_vjp_outputs(const std::vector<mx::array>& grads,
                                                        bool need_gw, bool need_gb);
// The LayerNormVJP node for inputs that passed the op's checks and casts
// (x, w, b in the kernels' dtypes, g in the output's): {gx, [gw], [gb]}.
std::vector<mx::array> make_layer_vjp(const mx::array& x, const std::optional<mx::array>& w,
                                      const std::optional<mx::array>& b, const mx::array& g,
                                      float eps, bool need_gw, bool need_gb, mx::Stream s);
}  // namespace detail

// Inputs (x, [w], [b], g): b only when gb is wanted (its dtype is gb's; the
// kernels do not read it). Outputs gx, then gw if has_gw(), gb if need_gb().
// Params: eps, has_weight, need_gw, has_bias = need_gb.
class LayerNormVJP : public NormPrimitive {
  MLX_RMSNORM_NORM_PRIMITIVE(LayerNormVJP, "LayerNormPluginVJP", .tail_rows = 1)
};

}  // namespace mlx_rmsnorm
