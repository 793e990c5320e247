// Fused residual add + RMSNorm: the op and its primitive.
#pragma once

#include <optional>
#include <vector>

#include "norm_primitive.h"

namespace mlx_rmsnorm {

// h = x + residual (rounded to h's dtype, result_type(x, residual)), and
// y = rms_norm(h, weight, eps, offset): the pre-norm transformer's
// `h = x + r; y = norm(h)` in one pass over memory (read x and residual,
// write y and h). Returns {y, h}; y has dtype result_type(h, weight). The
// norm reads h as stored (rounded), exactly as the unfused composition does.
// x and residual take any shapes that x + residual broadcasts (the
// broadcast one is expanded: on the GPU a copy, see add_rms_norm.cpp); weight
// is 1-D of size h.shape[-1] or absent; offset (Gemma: 1) scales by
// offset + weight formed in fp32 and needs a weight. While an export is
// traced the op writes MLX's own ops (x + residual and mx.fast.rms_norm).
std::vector<mx::array> add_rms_norm(const mx::array& x, const mx::array& residual,
                                    const std::optional<mx::array>& weight,
                                    float eps, float offset = 0.f,
                                    mx::StreamOrDevice s = {});

// Inputs (x, residual, [w]); outputs (y, h). Params: eps, has_weight, offset.
class AddRMSNorm : public NormPrimitive {
  MLX_RMSNORM_NORM_PRIMITIVE(AddRMSNorm, "AddRMSNormPlugin", .lead_rows = 2, .row_outputs = 2)
  MLX_RMSNORM_NORM_VJP
};

}  // namespace mlx_rmsnorm
