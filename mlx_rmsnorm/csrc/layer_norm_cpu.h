// LayerNorm's CPU evaluation, shared by its primitives (layer_norm_cpu.cpp)
// and the fused residual add's (add_layer_norm_cpu.cpp): one row code, so
// that add_layer_norm's y is layer_norm's of the same h bit for bit.
#pragma once

#include <vector>

#include "norm_primitive.h"

namespace mlx_rmsnorm::cpu {

// The forward of `prim` (LayerNorm or AddLayerNorm). Inputs (x, [residual],
// [w], [b]); outputs y, and with `add` h: the row normed is then
// h = x + residual rounded to h's dtype, stored as the unfused add stores it.
void layer_forward(NormPrimitive& prim, const std::vector<mx::array>& inputs,
                   std::vector<mx::array>& outputs, bool add);

// The backward of `prim` (LayerNormVJP or AddLayerNormVJP). Inputs (x, [w],
// [b], g, [g_h]); outputs gx, [gw], [gb]. With `add`, x is the forward's h
// and gx = g_h + d(norm)/dh.
void layer_backward(NormPrimitive& prim, const std::vector<mx::array>& inputs,
                    std::vector<mx::array>& outputs, bool add);

}  // namespace mlx_rmsnorm::cpu
