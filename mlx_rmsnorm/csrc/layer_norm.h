// LayerNorm forward: the op and its primitive.
#pragma once

#include <optional>
#include <vector>

#include "mlx/primitives.h"
#include "mlx/utils.h"

namespace mlx_rmsnorm {

namespace mx = mlx::core;

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

// Validates x, weight and bias as mx.fast.layer_norm does (ValueError on the
// Python side) and returns the output dtype.
mx::Dtype check_layer_inputs(const char* op, const mx::array& x,
                             const std::optional<mx::array>& weight,
                             const std::optional<mx::array>& bias);

namespace detail {
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
// float64 path, and the functions that jvp, vmap and second-order vjp
// differentiate. The same formulas as row_math.cuh's LayerRow.
namespace layer_reference {
mx::array forward(const mx::array& x, const std::optional<mx::array>& w,
                  const std::optional<mx::array>& b, float eps, mx::Dtype out_type,
                  mx::Stream s);
// {gx, [gw], [gb]}: gw with a weight and need_gw, gb with need_gb (b's dtype
// given as b_dtype), in x's, w's and b's dtypes.
std::vector<mx::array> backward(const mx::array& x, const std::optional<mx::array>& w,
                                const mx::array& g, float eps, bool need_gw,
                                std::optional<mx::Dtype> gb_dtype, mx::Stream s);
}  // namespace layer_reference

// Inputs (x, [w], [b]).
class LayerNorm : public mx::Primitive {
 public:
  LayerNorm(mx::Stream stream, float eps, bool has_weight, bool has_bias)
      : mx::Primitive(stream), eps_(eps), has_weight_(has_weight), has_bias_(has_bias) {}

  void eval_cpu(const std::vector<mx::array>& inputs,
                std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs,
                std::vector<mx::array>& outputs) override;

  std::vector<mx::array> jvp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& tangents,
                             const std::vector<int>& argnums) override;
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>& outputs) override;
  std::pair<std::vector<mx::array>, std::vector<int>> vmap(
      const std::vector<mx::array>& inputs,
      const std::vector<int>& axes) override;
  std::vector<mx::Shape> output_shapes(
      const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

  const char* name() const override { return "LayerNormPlugin"; }
  bool is_equivalent(const mx::Primitive& other) const override;

  float eps() const { return eps_; }
  bool has_weight() const { return has_weight_; }
  bool has_bias() const { return has_bias_; }

 private:
  float eps_;
  bool has_weight_;
  bool has_bias_;
};

}  // namespace mlx_rmsnorm
