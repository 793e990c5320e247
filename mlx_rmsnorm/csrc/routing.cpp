#include "routing.h"

#include <iterator>

#ifdef MLX_RMSNORM_CUDA
#include "gpu_util.h"
#endif

namespace mlx_rmsnorm {

bool layer_gpu_planned(mx::Dtype x_type, mx::Dtype out_type, int n, const mx::Stream& s,
                       bool add) {
#ifdef MLX_RMSNORM_CUDA
  gpu::use_device(s);
  return rmsnorm::layer_norm_planned(gpu::kernel_dtype(x_type), gpu::kernel_dtype(out_type), n,
                                     add);
#else
  (void)x_type, (void)out_type, (void)n, (void)s, (void)add;
  return false;
#endif
}

bool vector_rows(mx::Dtype x_type, int n) {
  return n % (16 / static_cast<int>(mx::size_of(x_type))) == 0;
}

std::atomic<std::uint64_t> op_counters[static_cast<int>(Counted::Count_)] = {};

std::vector<std::pair<const char*, std::uint64_t>> op_counts() {
  static constexpr const char* kKeys[] = {"RMSNormPlugin",      "AddRMSNormPlugin",
                                          "LayerNormPlugin",    "AddLayerNormPlugin",
                                          "builtin_rms_norm",   "builtin_layer_norm"};
  static_assert(std::size(kKeys) == static_cast<std::size_t>(Counted::Count_));
  std::vector<std::pair<const char*, std::uint64_t>> out;
  for (int i = 0; i < static_cast<int>(Counted::Count_); ++i)
    out.emplace_back(kKeys[i], op_counters[i].load(std::memory_order_relaxed));
  return out;
}

}  // namespace mlx_rmsnorm
