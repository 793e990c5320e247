// CPU evaluation of AddLayerNorm and AddLayerNormVJP: LayerNorm's rows
// (layer_norm_cpu.h) with the residual add in front and h's cotangent added
// into gx.
#include "add_layer_norm.h"
#include "add_layer_norm_vjp.h"
#include "layer_norm_cpu.h"

namespace mlx_rmsnorm {

void AddLayerNorm::eval_cpu(const std::vector<mx::array>& inputs,
                            std::vector<mx::array>& outputs) {
  cpu::layer_forward(*this, inputs, outputs, /*add=*/true);
}

void AddLayerNormVJP::eval_cpu(const std::vector<mx::array>& inputs,
                               std::vector<mx::array>& outputs) {
  cpu::layer_backward(*this, inputs, outputs, /*add=*/true);
}

}  // namespace mlx_rmsnorm
