// GPU evaluation of AddLayerNorm and AddLayerNormVJP: LayerNorm's recording
// (layer_norm_gpu.h) with the residual read beside x and h written beside y
// (forward), g_h staged beside g and added into gx (backward), on
// cuda/layer_norm.cu's plans (AddLayerRow). CUDA flavor of MLX only.
#ifdef MLX_RMSNORM_CUDA

#include "add_layer_norm.h"
#include "add_layer_norm_vjp.h"
#include "layer_norm_gpu.h"

namespace mlx_rmsnorm {

void AddLayerNorm::eval_gpu(const std::vector<mx::array>& inputs,
                            std::vector<mx::array>& outputs) {
  gpu::layer_forward(*this, inputs, outputs, /*add=*/true);
}

void AddLayerNormVJP::eval_gpu(const std::vector<mx::array>& inputs,
                               std::vector<mx::array>& outputs) {
  gpu::layer_backward(*this, inputs, outputs, /*add=*/true);
}

}  // namespace mlx_rmsnorm

#endif  // MLX_RMSNORM_CUDA
