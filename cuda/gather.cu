// A row-contiguous copy of a strided array, for inputs that are views
// (transposes, slices, broadcasts): every other kernel walks contiguous rows.
// Such inputs are rare in training graphs (MLX's ops write contiguous
// outputs), so this is a plain element-per-thread copy, not a tuned one.
#include "dispatch.cuh"

namespace rmsnorm {
namespace {

template <typename T>
__global__ void __launch_bounds__(256) gather(const GatherArgs a) {
  const T* src = static_cast<const T*>(a.src);
  T* dst = static_cast<T*>(a.dst);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < a.count;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rest = i, offset = 0;
    for (int d = a.ndim - 1; d >= 0; --d) {
      offset += (rest % a.shape[d]) * a.strides[d];
      rest /= a.shape[d];
    }
    dst[i] = src[offset];
  }
}

}  // namespace

Plan plan_gather(const GatherArgs& a) {
  Plan p;
  if (a.count == 0) return p;
  if (a.ndim > kGatherMaxDims)
    throw std::invalid_argument("[mlx_rmsnorm] inputs with more than " +
                                std::to_string(kGatherMaxDims) +
                                " dimensions must be contiguous");
  const void* fn = a.elem_bytes == 2   ? reinterpret_cast<const void*>(&gather<uint16_t>)
                   : a.elem_bytes == 4 ? reinterpret_cast<const void*>(&gather<uint32_t>)
                                       : reinterpret_cast<const void*>(&gather<uint64_t>);
  const int64_t grid = std::min<int64_t>(detail::ceil_div(a.count, 256),
                                         int64_t(detail::sm_count()) * 16);
  p.calls.push_back(detail::make_call(fn, dim3(grid), dim3(256), 0, "gather"));
  return p;
}

}  // namespace rmsnorm
