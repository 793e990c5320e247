// RMSNorm backward: the op and its primitive.
#pragma once

#include <optional>
#include <string>

#include "norm_primitive.h"

namespace mlx_rmsnorm {

// Which GPU backward runs. Auto: persistent wherever a row fits its launch
// plan, split otherwise. Naive: the seed's 3-kernel chain (the baseline).
// The CPU path ignores it.
enum class Algorithm { Auto = 0, Persistent = 1, Split = 2, Naive = 3 };

Algorithm parse_algorithm(const std::string& name);

// (gx, gw) of y = rms_norm(x, weight, eps) against the cotangent g; gw is
// absent without a weight or when need_gw is false (the weight gets no
// gradient: no gw work at all). Inputs as rms_norm takes them (integer and
// bool ones are cast to the result type first, float64 runs reference.h);
// g is cast to result_type(x, weight) when its dtype differs.
std::vector<mx::array> rms_norm_vjp(const mx::array& x,
                                    const std::optional<mx::array>& weight,
                                    const mx::array& g, float eps,
                                    Algorithm algorithm = Algorithm::Auto,
                                    bool need_gw = true,
                                    mx::StreamOrDevice s = {});

namespace detail {
// The RMSNormVJP node itself, for inputs that already passed the op's
// checks and casts (x, w in the kernels' dtypes, g in the output's).
std::vector<mx::array> make_vjp(const mx::array& x, const std::optional<mx::array>& w,
                                const mx::array& g, float eps, Algorithm algorithm,
                                bool need_gw, mx::Stream s, float offset = 0.f);
}  // namespace detail

// Inputs (x, [w,] g); outputs gx, and gw when has_gw(). Params: eps,
// has_weight, need_gw, offset, algorithm.
class RMSNormVJP : public NormPrimitive {
  MLX_RMSNORM_NORM_PRIMITIVE(RMSNormVJP, "RMSNormPluginVJP", .tail_rows = 1)
};

}  // namespace mlx_rmsnorm
