// GPU evaluation of the RMSNorm family: records our kernels (cuda/) into
// MLX's CUDA graph, on cuda/rmsnorm.h's RMSNorm plans; the fused add reads
// the residual beside x and writes h beside y (forward), streams g_h beside
// g and adds it into gx (the persistent walk, or the split plan). Rows of
// any alignment (the kernels check each pointer). CUDA flavor of MLX only.
#ifdef MLX_RMSNORM_CUDA

#include "gpu_util.h"
#include "primitives.h"

namespace mlx_rmsnorm {

void RMSNorm::eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  gpu::ForwardCall call(*this, inputs, outputs, /*aligned16=*/false);
  call.run(rmsnorm::plan_forward(call.args));
}

void RMSNormVJP::eval_gpu(const std::vector<mx::array>& inputs,
                          std::vector<mx::array>& outputs) {
  gpu::BackwardCall call(*this, inputs, outputs, /*aligned16=*/false);
  call.run(rmsnorm::plan_backward(call.args, gpu::kernel_algorithm(algorithm())));
}

}  // namespace mlx_rmsnorm

#endif  // MLX_RMSNORM_CUDA
