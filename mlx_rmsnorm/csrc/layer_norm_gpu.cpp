// GPU evaluation of the LayerNorm family: records cuda/layer_norm.cu's plans
// into MLX's CUDA graph (the fused add's rows are AddLayerRow: the residual
// beside x and h beside y, g_h staged beside g). The kernels read rows in
// 16-byte vectors only (the ops send other rows elsewhere), so a row input
// whose data starts off that boundary is copied. CUDA flavor of MLX only.
#ifdef MLX_RMSNORM_CUDA

#include "gpu_util.h"
#include "primitives.h"

namespace mlx_rmsnorm {

void LayerNorm::eval_gpu(const std::vector<mx::array>& inputs,
                         std::vector<mx::array>& outputs) {
  gpu::ForwardCall call(*this, inputs, outputs, /*aligned16=*/true);
  call.run(rmsnorm::plan_layer_forward(call.args));
}

void LayerNormVJP::eval_gpu(const std::vector<mx::array>& inputs,
                            std::vector<mx::array>& outputs) {
  gpu::BackwardCall call(*this, inputs, outputs, /*aligned16=*/true);
  call.run(rmsnorm::plan_layer_backward(call.args));
}

}  // namespace mlx_rmsnorm

#endif  // MLX_RMSNORM_CUDA
