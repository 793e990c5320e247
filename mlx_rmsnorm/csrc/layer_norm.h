// LayerNorm forward: the op, its primitive, and LayerNorm in MLX ops.
#pragma once

#include <optional>
#include <vector>

#include "norm_primitive.h"

namespace mlx_rmsnorm {

// y = (x - mean(x)) * rsqrt(var(x) + eps) * weight + bias over the last axis,
// with the contract of mx.fast.layer_norm: x has at least one dimension,
// weight and bias are each 1-D of size x.shape[-1] or absent, y has dtype
// result_type(x, weight[, bias]) with a weight and x's dtype without one
// (a bias alone does not promote: the built-in's rule), which must be
// floating. Integer and bool inputs are cast to that type first; float64 runs
// MLX ops in float64 (layer_reference below); while an export is being traced
// the op is the built-in's. On a GPU stream, rows that no LayerNorm plan
// covers go to mx.fast.layer_norm: past the tables, forward and backward; N
// not a multiple of a 16-byte vector, its forward and our fp32 reference
// backward (detail::builtin_forward_reference_backward).
mx::array layer_norm(const mx::array& x, const std::optional<mx::array>& weight,
                     const std::optional<mx::array>& bias, float eps,
                     mx::StreamOrDevice s = {});

namespace detail {
// Whether our kernels take rows of n elements on this GPU stream (both
// directions have a plan; with `add`, those of the fused residual add,
// add_layer_norm); false on the CPU flavor.
bool gpu_planned(mx::Dtype x_type, mx::Dtype out_type, int n, const mx::Stream& s,
                 bool add = false);
// Whether rows of n elements of x_type are a whole number of 16-byte vectors.
bool vector_rows(mx::Dtype x_type, int n);
// mx.fast.layer_norm's forward with layer_reference's backward as its vjp,
// over (x, [w], [b]) already cast as layer_norm casts them: the GPU path for
// rows that are not a whole number of 16-byte vectors (layer_norm.cpp says why).
mx::array builtin_forward_reference_backward(const std::vector<mx::array>& inputs,
                                             bool has_w, bool has_b, float eps,
                                             mx::Stream s);
}  // namespace detail

// LayerNorm in MLX ops, computed in fp32 (float64 for float64 results): the
// float64 path, and the primitives' references. The same formulas as
// row_math.cuh's LayerRow.
namespace layer_reference {
// The built-in's output dtype: result_type(x, w[, b]) with a weight, x's
// without one (a bias alone does not promote).
mx::Dtype result_type(const mx::array& x, const std::optional<mx::array>& w,
                      const std::optional<mx::array>& b);
mx::array forward(const mx::array& x, const std::optional<mx::array>& w,
                  const std::optional<mx::array>& b, float eps, mx::Dtype out_type,
                  mx::Stream s);
// {gx, [gw], [gb]}: gw with a weight and need_gw, gb with need_gb (b's dtype
// given as b_dtype), in x's, w's and b's dtypes. With g_h (the fused residual
// add's cotangent of h, x being h): gx = g_h + d(norm)/dx, added in the
// compute type and rounded once, as the kernels do.
std::vector<mx::array> backward(const mx::array& x, const std::optional<mx::array>& w,
                                const mx::array& g, float eps, bool need_gw,
                                std::optional<mx::Dtype> gb_dtype, mx::Stream s,
                                const std::optional<mx::array>& g_h = std::nullopt);
}  // namespace layer_reference

// Inputs (x, [w], [b]); output y. Params: eps, has_weight, has_bias.
class LayerNorm : public NormPrimitive {
  MLX_RMSNORM_NORM_PRIMITIVE(LayerNorm, "LayerNormPlugin")
  MLX_RMSNORM_NORM_VJP
};

}  // namespace mlx_rmsnorm
