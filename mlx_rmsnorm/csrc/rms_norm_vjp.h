// RMSNorm backward: the op and its primitive.
#pragma once

#include <optional>
#include <string>

#include "mlx/primitives.h"
#include "mlx/utils.h"

namespace mlx_rmsnorm {

namespace mx = mlx::core;

// Which GPU backward runs. Auto: persistent wherever a row fits its launch
// plan, split otherwise. Naive: the seed's 3-kernel chain (the baseline).
// The CPU path ignores it.
enum class Algorithm { Auto = 0, Persistent = 1, Split = 2, Naive = 3 };

Algorithm parse_algorithm(const std::string& name);

// (gx, gw) of y = rms_norm(x, weight, eps) against the cotangent g. gw is
// absent when weight is. g is cast to result_type(x, weight) first.
std::vector<mx::array> rms_norm_vjp(const mx::array& x,
                                    const std::optional<mx::array>& weight,
                                    const mx::array& g, float eps,
                                    Algorithm algorithm = Algorithm::Auto,
                                    mx::StreamOrDevice s = {});

// Inputs (x, [w,] g); outputs (gx, [gw]).
class RMSNormVJP : public mx::Primitive {
 public:
  RMSNormVJP(mx::Stream stream, float eps, bool has_weight, Algorithm algorithm)
      : mx::Primitive(stream),
        eps_(eps),
        has_weight_(has_weight),
        algorithm_(algorithm) {}

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

  const char* name() const override { return "RMSNormPluginVJP"; }
  bool is_equivalent(const mx::Primitive& other) const override;

  float eps() const { return eps_; }
  bool has_weight() const { return has_weight_; }
  Algorithm algorithm() const { return algorithm_; }

 private:
  float eps_;
  bool has_weight_;
  Algorithm algorithm_;
};

}  // namespace mlx_rmsnorm
