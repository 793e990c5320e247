// Backward of the fused residual add + RMSNorm: the op and its primitive.
#pragma once

#include <optional>
#include <vector>

#include "mlx/primitives.h"
#include "mlx/utils.h"

namespace mlx_rmsnorm {

namespace mx = mlx::core;

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
std::vector<mx::array> make_add_vjp(const mx::array& h,
                                    const std::optional<mx::array>& w,
                                    const mx::array& g_y, const mx::array& g_h,
                                    float eps, float offset, bool need_gw,
                                    mx::Stream s);
}  // namespace detail

// Inputs (h, [w,] g_y, g_h); outputs (gx) and gw when has_weight && need_gw.
// The forward's h is read instead of x and residual: one tensor, not two, and
// the very values the norm saw.
class AddRMSNormVJP : public mx::Primitive {
 public:
  AddRMSNormVJP(mx::Stream stream, float eps, bool has_weight, bool need_gw,
                float offset)
      : mx::Primitive(stream),
        eps_(eps),
        has_weight_(has_weight),
        need_gw_(need_gw),
        offset_(offset) {}

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
      const std::vector<mx::array>& inputs) override;

  const char* name() const override { return "AddRMSNormPluginVJP"; }
  bool is_equivalent(const mx::Primitive& other) const override;

  float eps() const { return eps_; }
  bool has_weight() const { return has_weight_; }
  bool has_gw() const { return has_weight_ && need_gw_; }
  float offset() const { return offset_; }

 private:
  float eps_;
  bool has_weight_;
  bool need_gw_;
  float offset_;
};

}  // namespace mlx_rmsnorm
