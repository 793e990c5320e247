// Fused residual add + LayerNorm: the op and its primitive.
#pragma once

#include <optional>
#include <vector>

#include "norm_primitive.h"

namespace mlx_rmsnorm {

// h = x + residual (rounded to h's dtype, result_type(x, residual)), and
// y = layer_norm(h, weight, bias, eps): the pre-norm transformer's
// `h = x + r; y = norm(h)` with a LayerNorm (GPT-2, GPT-NeoX, StarCoder2),
// in one pass over memory (read x and residual, write y and h). Returns
// {y, h}; y has layer_norm's dtype for h: result_type(h, weight[, bias]) with
// a weight, h's without one (a bias alone does not promote). The norm reads h
// as stored (rounded), exactly as the unfused composition does. x and
// residual take any shapes that x + residual broadcasts (the broadcast one is
// expanded, as in add_rms_norm); weight and bias are each 1-D of size
// h.shape[-1] or absent. While an export is traced the op writes MLX's own
// ops (x + residual and mx.fast.layer_norm); on a GPU stream, rows that no
// plan of the fused add covers run x + residual and then layer_norm (which
// has its own fallbacks).
std::vector<mx::array> add_layer_norm(const mx::array& x, const mx::array& residual,
                                      const std::optional<mx::array>& weight,
                                      const std::optional<mx::array>& bias, float eps,
                                      mx::StreamOrDevice s = {});

// Inputs (x, residual, [w], [b]); outputs (y, h). Params: eps, has_weight,
// has_bias.
class AddLayerNorm : public NormPrimitive {
  MLX_RMSNORM_NORM_PRIMITIVE(AddLayerNorm, "AddLayerNormPlugin", .lead_rows = 2, .row_outputs = 2)
  MLX_RMSNORM_NORM_VJP
};

}  // namespace mlx_rmsnorm
