// RMSNorm forward: the op and its primitive.
#pragma once

#include <optional>

#include "norm_primitive.h"

namespace mlx_rmsnorm {

// y = x * rsqrt(mean(x^2, axis=-1) + eps) * weight, with the contract of
// mx.fast.rms_norm: x has at least one dimension, weight is 1-D of size
// x.shape[-1] or absent, y has dtype result_type(x, weight), which must be
// floating. Integer and bool inputs are cast to that type first (as the
// built-in does); float64 runs reference.h in float64 (our kernels read
// 16/32-bit floats only; on a GPU stream MLX refuses float64, as it does for
// the built-in); while an export is being traced (export_tracing()) the op
// is the built-in's, so the exported file holds what mx.fast.rms_norm writes.
// `offset` (Gemma: 1) scales by offset + weight, formed in fp32 by the
// kernels instead of rounded to the weight's dtype; it needs a weight.
mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& weight,
                   float eps, mx::StreamOrDevice s = {}, float offset = 0.f);

// What mx.fast.rms_norm computes for our y = rms_norm(x) * (offset + w):
// the exported form (MLX ops only) of a norm with an offset. With offset 0
// it is the built-in's own call.
mx::array builtin_rms_norm(const mx::array& x, const std::optional<mx::array>& w,
                           float eps, float offset, mx::StreamOrDevice s);

// Inputs (x, [w]); output y. Params: eps, has_weight, offset.
class RMSNorm : public NormPrimitive {
  MLX_RMSNORM_NORM_PRIMITIVE(RMSNorm, "RMSNormPlugin")
  MLX_RMSNORM_NORM_VJP

 protected:
  std::pair<std::vector<mx::array>, std::vector<int>> vmap_reference(
      const std::vector<mx::array>& inputs, const std::vector<int>& axes) override;
};

}  // namespace mlx_rmsnorm
