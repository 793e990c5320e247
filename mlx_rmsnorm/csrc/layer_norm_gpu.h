// LayerNorm's GPU evaluation, shared by its primitives (layer_norm_gpu.cpp)
// and the fused residual add's (add_layer_norm_gpu.cpp): the same plans of
// cuda/layer_norm.cu, which take the residual and g_h as extra streams. CUDA
// flavor of MLX only.
#pragma once

#ifdef MLX_RMSNORM_CUDA

#include <vector>

#include "norm_primitive.h"

namespace mlx_rmsnorm::gpu {

// The forward of `prim` (LayerNorm or AddLayerNorm). Inputs (x, [residual],
// [w], [b]); outputs y, and with `add` h = x + residual (rounded to h's
// dtype, the row the kernel normalizes).
void layer_forward(NormPrimitive& prim, const std::vector<mx::array>& inputs,
                   std::vector<mx::array>& outputs, bool add);

// The backward of `prim` (LayerNormVJP or AddLayerNormVJP). Inputs (x, [w],
// [b], g, [g_h]); b only gives gb its dtype (the kernels do not read it).
// Outputs gx, [gw], [gb]. With `add`, x is the forward's h and
// gx = g_h + d(norm)/dh.
void layer_backward(NormPrimitive& prim, const std::vector<mx::array>& inputs,
                    std::vector<mx::array>& outputs, bool add);

}  // namespace mlx_rmsnorm::gpu

#endif  // MLX_RMSNORM_CUDA
