// Fused residual add + RMSNorm: the op and its primitive.
#pragma once

#include <optional>
#include <vector>

#include "mlx/primitives.h"
#include "mlx/utils.h"

namespace mlx_rmsnorm {

namespace mx = mlx::core;

// h = x + residual (rounded to h's dtype, result_type(x, residual)), and
// y = rms_norm(h, weight, eps, offset): the pre-norm transformer's
// `h = x + r; y = norm(h)` in one pass over memory (read x and residual,
// write y and h). Returns {y, h}; y has dtype result_type(h, weight). The
// norm reads h as stored (rounded), exactly as the unfused composition does.
// x and residual take any shapes that x + residual broadcasts (the
// broadcast one is expanded: on the GPU a copy, see add_rms_norm.cpp); weight
// is 1-D of size h.shape[-1] or absent; offset (Gemma: 1) scales by offset + weight formed
// in fp32 and needs a weight. While an export is traced the op writes MLX's
// own ops (x + residual and mx.fast.rms_norm).
std::vector<mx::array> add_rms_norm(const mx::array& x, const mx::array& residual,
                                    const std::optional<mx::array>& weight,
                                    float eps, float offset = 0.f,
                                    mx::StreamOrDevice s = {});

// Inputs (x, residual, [w]); outputs (y, h).
class AddRMSNorm : public mx::Primitive {
 public:
  AddRMSNorm(mx::Stream stream, float eps, bool has_weight, float offset)
      : mx::Primitive(stream), eps_(eps), has_weight_(has_weight), offset_(offset) {}

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
    return {inputs[0].shape(), inputs[0].shape()};
  }

  const char* name() const override { return "AddRMSNormPlugin"; }
  bool is_equivalent(const mx::Primitive& other) const override;

  float eps() const { return eps_; }
  bool has_weight() const { return has_weight_; }
  float offset() const { return offset_; }

 private:
  float eps_;
  bool has_weight_;
  float offset_;
};

}  // namespace mlx_rmsnorm
