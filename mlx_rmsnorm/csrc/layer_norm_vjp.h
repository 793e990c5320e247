// LayerNorm backward: the op and its primitive.
#pragma once

#include <optional>
#include <vector>

#include "mlx/primitives.h"
#include "mlx/utils.h"

namespace mlx_rmsnorm {

namespace mx = mlx::core;

// (gx, gw, gb) of y = layer_norm(x, weight, bias, eps) against the cotangent
// g; gw is absent without a weight or with need_gw false, gb without a bias
// or with need_gb false (no work is done for them). Inputs as layer_norm
// takes them; g is cast to the output's dtype when it differs.
std::vector<std::optional<mx::array>> layer_norm_vjp(
    const mx::array& x, const std::optional<mx::array>& weight,
    const std::optional<mx::array>& bias, const mx::array& g, float eps,
    bool need_gw = true, bool need_gb = true, mx::StreamOrDevice s = {});

namespace detail {
// The LayerNormVJP node for inputs that passed the op's checks and casts
// (x, w, b in the kernels' dtypes, g in the output's): {gx, [gw], [gb]}.
std::vector<mx::array> make_layer_vjp(const mx::array& x,
                                      const std::optional<mx::array>& w,
                                      const std::optional<mx::array>& b,
                                      const mx::array& g, float eps, bool need_gw,
                                      bool need_gb, mx::Stream s);
}  // namespace detail

// Inputs (x, [w], [b], g): b only when gb is wanted (its dtype is gb's; the
// kernels do not read it). Outputs gx, then gw if has_gw(), gb if need_gb.
class LayerNormVJP : public mx::Primitive {
 public:
  LayerNormVJP(mx::Stream stream, float eps, bool has_weight, bool need_gw,
               bool need_gb)
      : mx::Primitive(stream),
        eps_(eps),
        has_weight_(has_weight),
        need_gw_(need_gw),
        need_gb_(need_gb) {}

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

  const char* name() const override { return "LayerNormPluginVJP"; }
  bool is_equivalent(const mx::Primitive& other) const override;

  float eps() const { return eps_; }
  bool has_weight() const { return has_weight_; }
  bool has_gw() const { return has_weight_ && need_gw_; }
  bool need_gb() const { return need_gb_; }

 private:
  float eps_;
  bool has_weight_;
  bool need_gw_;  // (with has_weight_) gw is an output
  bool need_gb_;  // gb is an output (b is then an input)
};

}  // namespace mlx_rmsnorm
