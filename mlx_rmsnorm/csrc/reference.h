// RMSNorm written with MLX ops. The primitives use these only where no kernel
// of ours applies: as the function that jvp, vmap and second-order vjp
// differentiate, never for the plain forward or backward.
#pragma once

#include <optional>

#include "mlx/array.h"
#include "mlx/utils.h"

namespace mlx_rmsnorm::reference {

namespace mx = mlx::core;

// y, computed in fp32 and cast to result_type(x, w).
mx::array forward(const mx::array& x, const std::optional<mx::array>& w,
                  float eps, mx::StreamOrDevice s = {});

// {gx, gw} (gw only with a weight), in fp32 and cast to x's and w's dtypes.
std::vector<mx::array> backward(const mx::array& x,
                                const std::optional<mx::array>& w,
                                const mx::array& g, float eps,
                                mx::StreamOrDevice s = {});

// Tangents for every primal: the given ones at `argnums`, zeros elsewhere
// (what mx::jvp of the reference function needs).
std::vector<mx::array> full_tangents(const std::vector<mx::array>& primals,
                                     const std::vector<mx::array>& tangents,
                                     const std::vector<int>& argnums,
                                     mx::StreamOrDevice s = {});

// Unpack the primitives' input lists: (x, [w]) and (x, [w], g).
std::optional<mx::array> weight_of(const std::vector<mx::array>& inputs,
                                   bool has_weight);

}  // namespace mlx_rmsnorm::reference
