// Host-side helpers for the planners: kernel handles, occupancy, dtype
// dispatch. Internal to cuda/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>

#include "rmsnorm.h"

namespace rmsnorm::detail {

[[noreturn]] void fail(const char* what, cudaError_t err);

inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) fail(what, err);
}

// What the current device runs our code as (cached per device).
struct Target {
  int device;  // the CUDA runtime's current device when it was asked for
  int family;  // 90, 80 or 75: the plan tables' family (plans.h)
  int sms;     // multiprocessors
};
// Throws std::runtime_error naming the GPU, the architectures this build has
// code for and the rebuild command when there is no code for this GPU.
const Target& target();

inline int sm_count() { return target().sms; }

// Resident blocks per SM for a kernel, block size and dynamic shared memory.
// 0 when `smem` is more than the kernel can have. Cached.
int blocks_per_sm(const void* host_fn, int block, unsigned smem);

// Thread-block clusters of a kernel with a compiled-in cluster shape that the
// whole GPU holds at once (its clusters stay within a GPC, so this is not SMs
// x blocks_per_sm / cluster), for a block size and dynamic shared memory; 0
// when they do not fit. Cached.
int clusters_resident(const void* host_fn, int block, unsigned smem);

// The units a persistent grid walks with: blocks, or (cluster > 1, the
// kernel's compiled-in shape) clusters, as many as the whole GPU holds at
// once; 0 when they do not fit.
inline int units_resident(const void* host_fn, int block, unsigned smem, int cluster) {
  return cluster > 1 ? clusters_resident(host_fn, block, smem)
                     : sm_count() * blocks_per_sm(host_fn, block, smem);
}

// A call record with the driver handle resolved (cached per kernel); cluster:
// the kernel's compiled-in cluster shape (KernelCall::cluster).
KernelCall make_call(const void* host_fn, dim3 grid, dim3 block, unsigned smem,
                     const char* name, int cluster = 1);

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(Tag<A>{}, Tag<B>{}) for the (a, b) storage types the kernels are
// built for: b is either a itself or fp32 (g and y follow result_type(x, w),
// which for our dtypes is x's dtype or float32).
template <typename F>
decltype(auto) with_types(DType a, DType b, F&& f) {
  auto same_or_f32 = [&](auto ta) -> decltype(auto) {
    using A = typename decltype(ta)::type;
    if (b == DType::F32) return f(ta, Tag<float>{});
    return f(ta, Tag<A>{});
  };
  bool ok = b == a || b == DType::F32;
  if (!ok) throw std::invalid_argument("rmsnorm: unsupported dtype pairing");
  switch (a) {
    case DType::F32:
      return same_or_f32(Tag<float>{});
    case DType::F16:
      return same_or_f32(Tag<__half>{});
    case DType::BF16:
      return same_or_f32(Tag<__nv_bfloat16>{});
    default:
      throw std::invalid_argument("rmsnorm: unsupported dtype");
  }
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline std::size_t align_up(std::size_t v) { return (v + 255) / 256 * 256; }

}  // namespace rmsnorm::detail
