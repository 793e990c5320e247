// Device helpers shared by the RMSNorm kernels: element conversion, 16-byte
// vectors, asynchronous copies and fixed-order (deterministic) reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <type_traits>
#include <utility>

#include "rmsnorm.h"

namespace rmsnorm {

// What the architecture being compiled has: the one place where a kernel's
// path depends on the GPU family (nvcc compiles device code once per
// architecture, __CUDA_ARCH__ says which). Which *plans* run where is the
// host's choice (plans.h); these flags keep every kernel correct on every
// family (a copy path a family lacks falls back to one it has), and
// builds_family leaves out the code of plan rows this architecture never runs.
namespace arch {
#if defined(__CUDA_ARCH__)
inline constexpr int kVersion = __CUDA_ARCH__ / 10;  // 75, 80, 86, 90, 100, 120
#else
inline constexpr int kVersion = 0;  // host pass: no device code is generated
#endif
inline constexpr bool kAsyncCopy = kVersion >= 80;  // cp.async (16-byte, per thread)
inline constexpr bool kBulkCopy = kVersion >= 90;   // cp.async.bulk + mbarrier tx counts
// sm_12x (kVersion 120, 121): the backward walk of a weight-in-registers
// row (row_math.cuh WeightInRegisters, LayerNorm's rows whose fp32 weight
// does not fit shared memory) of 512 x 4 with 16-bit x (32 floats of weight
// a thread, 128 registers) re-reads the weight (L1) at each use instead of
// holding it, and copies its rows per thread: ptxas there spilled 336-456
// bytes a thread with the weight held and bulk copies (28-68 in the cluster
// rows), where sm_90 fits the same code in 128 registers without spills;
// re-read, 122-128 and none (ptxas, nvcc 13.0; backward.cuh persistent_walk).
inline constexpr bool kWeightReload = kVersion >= 120;
// Whether this architecture's code serves plan family `family` (launch.cu
// target(): 90 from sm_90 on; 80, whose tables serve sm_75 too, below it),
// so builds the kernels of that family's plan rows (RowPlan::family). The
// host pass keeps every kernel's stub.
constexpr bool builds_family(int family) {
  return kVersion == 0 || (kVersion >= 90) == (family >= 90);
}
}  // namespace arch

// A kernel's compile-time cluster shape (clusters, like bulk copies, from
// sm_90); families without clusters get none (nvcc rejects the attribute
// there) and their cluster helpers trap.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define RMSNORM_CLUSTER_DIMS(n) __cluster_dims__(n, 1, 1)
#else
#define RMSNORM_CLUSTER_DIMS(n)
#endif

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ float to_float(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  return static_cast<T>(v);
}
template <>
__device__ __forceinline__ __half from_float(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float v) {
  return __float2bfloat16_rn(v);
}

// Element i of a buffer whose dtype is only known at run time. Used for the
// weight and gw, which are touched once per block, never per row.
__device__ __forceinline__ float load_as_float(const void* p, DType t,
                                               int64_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(p)[i];
    case DType::F16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case DType::BF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default:
      return 1.f;  // no weight: the identity scale
  }
}

__device__ __forceinline__ void store_from_float(void* p, DType t, int64_t i,
                                                 float v) {
  switch (t) {
    case DType::F32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::F16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    case DType::BF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    default:
      break;
  }
}

// Host: the kernel of row `row` of a plan table of K rows, where
// kernel_of(std::integral_constant<std::size_t, I>{}) names row I's host stub
// (a captureless lambda at each call site); the K stubs are taken once.
template <typename KernelOf, std::size_t... I>
const void* kernel_by_row(int row, KernelOf kernel_of, std::index_sequence<I...>) {
  static const void* const kernels[] = {kernel_of(std::integral_constant<std::size_t, I>{})...};
  return kernels[row];
}
template <std::size_t K, typename KernelOf>
const void* kernel_by_row(int row, KernelOf kernel_of) {
  return kernel_by_row(row, kernel_of, std::make_index_sequence<K>{});
}

// VEC elements of T moved as one access: 16 bytes when VEC * sizeof(T) == 16;
// a 32-byte Vec (fp32 g beside bf16 x) asks only for 16-byte alignment, so
// the pointers checked by vector_width() suffice and it splits in two loads.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC < 16 ? sizeof(T) * VEC : 16) Vec {
  T v[VEC];
};

// The k-th element of v as fp32. 16-bit types widen from the 32-bit word
// that holds the pair (bf16: a shift or a mask; fp16: the pair's low or high
// half): __bfloat162float and __half2float take a 16-bit register, and ptxas
// then keeps every element of a row held in registers unpacked in a register
// of its own, nearly twice a packed row's registers.
template <typename T, int VEC>
__device__ __forceinline__ float element(const Vec<T, VEC>& v, int k) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    uint32_t word;
    memcpy(&word, &v.v[k & ~1], sizeof(word));
    return __uint_as_float(k % 2 == 0 ? word << 16 : word & 0xffff0000u);
  } else if constexpr (std::is_same_v<T, __half> && VEC % 2 == 0) {
    __half2 pair;
    memcpy(&pair, &v.v[k & ~1], sizeof(pair));
    return k % 2 == 0 ? __low2float(pair) : __high2float(pair);
  } else {
    return to_float(v.v[k]);
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void load_vec_as_float(const void* p, int64_t v,
                                                  float (&out)[VEC]) {
  const Vec<T, VEC> vec = static_cast<const Vec<T, VEC>*>(p)[v];
#pragma unroll
  for (int k = 0; k < VEC; ++k) out[k] = to_float(vec.v[k]);
}

__device__ __forceinline__ bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Elements [v * VEC, v * VEC + VEC) of the weight as floats: one access of
// VEC elements (two 16-byte loads for fp32 beside a 2-byte x) when `aligned`
// (the weight's base is 16-byte aligned), else element by element.
template <int VEC>
__device__ __forceinline__ void load_w(const void* w, DType t, int64_t v,
                                       bool aligned, float (&out)[VEC]) {
  if (!aligned || t == DType::None) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = load_as_float(w, t, v * VEC + k);
    return;
  }
  switch (t) {
    case DType::F32:
      return load_vec_as_float<float, VEC>(w, v, out);
    case DType::F16:
      return load_vec_as_float<__half, VEC>(w, v, out);
    default:
      return load_vec_as_float<__nv_bfloat16, VEC>(w, v, out);
  }
}

// The scale offset + w in fp32 (Gemma's 1 + w, which rounded to a bf16
// weight first loses up to half a bf16 ulp of the scale), added once to a
// weight vector that load_w has read.
template <int VEC>
__device__ __forceinline__ void add_offset(float (&w)[VEC], float offset) {
#pragma unroll
  for (int k = 0; k < VEC; ++k) w[k] += offset;
}

// x + r rounded to T, element by element: the residual add's h, exactly as
// an unfused add stores it (the fp32 sum of two 16-bit values, rounded once).
// The elements widen from their packed words (element()): a held row of x
// and the residual then fits 64 registers (ptxas, sm_90, bf16 1024 x 4: 64
// and no spills, against 272 bytes of spills widening each element alone).
template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> add_round(const Vec<T, VEC>& x, const Vec<T, VEC>& r) {
  Vec<T, VEC> h;
#pragma unroll
  for (int k = 0; k < VEC; ++k) h.v[k] = from_float<T>(element(x, k) + element(r, k));
  return h;
}

// Copy one Vec global -> shared without staging through registers where the
// hardware can (sm_80 on: 4, 8 or 16-byte pieces). Narrower vectors, and
// sm_75, which has no cp.async, take a plain vectorized load and store: still
// correct inside the pipeline (its waits and commits then have nothing to
// wait for), only not overlapped with the compute.
template <typename T, int VEC>
__device__ __forceinline__ void copy_async(Vec<T, VEC>* dst,
                                           const Vec<T, VEC>* src) {
  constexpr int bytes = sizeof(Vec<T, VEC>);
  if constexpr (!arch::kAsyncCopy) {
    *dst = *src;
  } else if constexpr (bytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < bytes / 16; ++i) {
      __pipeline_memcpy_async(reinterpret_cast<char*>(dst) + 16 * i,
                              reinterpret_cast<const char*>(src) + 16 * i, 16);
    }
  } else if constexpr (bytes == 4 || bytes == 8) {
    __pipeline_memcpy_async(dst, src, bytes);
  } else {
    *dst = *src;
  }
}

// The bulk copy engine (sm_90 on): one thread moves a whole contiguous range
// global -> shared, and completion is counted in bytes on an mbarrier that
// the consumers wait on. Ranges are multiples of 16 bytes, 16-byte aligned.
// Callers take this path only where arch::kBulkCopy holds; older families
// compile these helpers to a trap, so a wrong call cannot go unnoticed.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarrier_init(unsigned long long* bar) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar))
               : "memory");
  // Make the initialised barrier visible to the copy engine (async proxy).
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#else
  __trap();
#endif
}

// Arms `bar` for `bytes` of incoming copies and starts one copy into `dst`.
__device__ __forceinline__ void bulk_expect(unsigned long long* bar,
                                            unsigned bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                   smem_addr(bar)),
               "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src,
                                          unsigned bytes,
                                          unsigned long long* bar) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
#else
  __trap();
#endif
}

// Waits until phase `parity` of `bar` has completed.
__device__ __forceinline__ void mbarrier_wait(unsigned long long* bar,
                                              unsigned parity) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
#else
  __trap();
#endif
}

// Sums added over WIDTH consecutive lanes of a warp (xor butterfly: every
// lane of them gets the same bits).
template <int WIDTH = 32>
__device__ __forceinline__ float2 warp_sum(float2 v) {
#pragma unroll
  for (int off = WIDTH / 2; off > 0; off /= 2) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, off, WIDTH);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, off, WIDTH);
  }
  return v;
}
template <int WIDTH = 32>
__device__ __forceinline__ float4 warp_sum(float4 v) {
#pragma unroll
  for (int off = WIDTH / 2; off > 0; off /= 2) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, off, WIDTH);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, off, WIDTH);
    v.z += __shfl_xor_sync(0xffffffffu, v.z, off, WIDTH);
    v.w += __shfl_xor_sync(0xffffffffu, v.w, off, WIDTH);
  }
  return v;
}

// Sum of a float2 over GROUP consecutive threads; every thread of the group
// gets the total. GROUP <= 32 stays inside a warp (shuffles only); a larger
// GROUP must be the whole block and goes through `smem` (one float2 per warp).
// The order of additions is fixed by the thread layout, so results are
// bitwise reproducible.
template <int GROUP, int BLOCK>
__device__ __forceinline__ float2 group_sum(float2 v, float2* smem) {
  static_assert(GROUP <= 32 || GROUP == BLOCK, "group is a sub-warp or the block");
  v = warp_sum<GROUP < 32 ? GROUP : 32>(v);
  if constexpr (GROUP > 32) {
    constexpr int warps = BLOCK / 32;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = warp_sum(lane < warps ? smem[lane] : make_float2(0.f, 0.f));
    __syncthreads();  // smem is free again for the next row
  }
  return v;
}

// group_sum of four sums at once (LayerRow's backward: one reduction a row
// instead of two of two), in a fixed order, so as reproducible. Besides a
// sub-warp or the block, a group may be a run of whole warps inside the block
// (several rows a step of more than 32 threads each): its warps' sums are
// then added in warp order by every thread of the group.
template <int GROUP, int BLOCK>
__device__ __forceinline__ float4 group_sum(float4 v, float4* smem) {
  static_assert(GROUP <= 32 || (GROUP % 32 == 0 && BLOCK % GROUP == 0),
                "group is a sub-warp or whole warps");
  v = warp_sum<GROUP < 32 ? GROUP : 32>(v);
  if constexpr (GROUP > 32) {
    constexpr int warps = BLOCK / 32;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    if constexpr (GROUP == BLOCK) {
      v = warp_sum(lane < warps ? smem[lane] : make_float4(0.f, 0.f, 0.f, 0.f));
    } else {
      constexpr int per_group = GROUP / 32;
      const float4* mine = smem + warp / per_group * per_group;
      v = mine[0];
#pragma unroll
      for (int q = 1; q < per_group; ++q) {
        const float4 o = mine[q];
        v = make_float4(v.x + o.x, v.y + o.y, v.z + o.z, v.w + o.w);
      }
    }
    __syncthreads();  // smem is free again for the next row
  }
  return v;
}

// Zeroed sums of a pass (float2 or float4).
template <typename S>
__device__ __forceinline__ S zero_sums();
template <>
__device__ __forceinline__ float2 zero_sums<float2>() {
  return make_float2(0.f, 0.f);
}
template <>
__device__ __forceinline__ float4 zero_sums<float4>() {
  return make_float4(0.f, 0.f, 0.f, 0.f);
}
__device__ __forceinline__ float2 sums_plus(float2 a, float2 b) {
  return make_float2(a.x + b.x, a.y + b.y);
}
__device__ __forceinline__ float4 sums_plus(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// The mean of one vector's elements (LayerRow's shift: row_math.cuh).
template <typename T, int VEC>
__device__ __forceinline__ float vec_mean(const Vec<T, VEC>& v) {
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < VEC; ++k) s += to_float(v.v[k]);
  return s * (1.f / VEC);
}

// Thread-block clusters (sm_90 on: the rows past one SM; older families have
// no clusters: a trap, as for the bulk copies). A cluster's sums are pushed,
// not pulled: every warp stores its sums (float2 or float4) into a slot of
// every block of the cluster (st.async, counted in bytes on the receiving
// block's mbarrier), and each block waits on its own mbarrier only, then
// adds the CLUSTER * WARPS slots in a fixed order: no block barrier and no
// blocking cluster barrier a step, and every block gets the same bits. Slots
// and mbarriers come in two sets by step parity: a block pushes step t + 1
// into one set while a slower block still reads step t's from the other, and
// no block reaches step t + 2 before all have pushed step t + 1, which each
// warp does only after reading step t's.
// A block's wait also means that all of its own warps have pushed this step,
// so are done with everything they read before it (the backward's stages).
template <int CLUSTER, int WARPS, typename S = float2>
struct PushedSums {
  S slot[2][CLUSTER * WARPS];  // [parity][rank * WARPS + warp]
  unsigned long long bar[2];
};

// Every thread, once, before the first pushed_sum: thread 0 sets up the
// mbarriers, and the cluster is told so by an arrive whose wait comes with
// the first push (pushed_sum(first)), after this block's first loads; a
// walk that makes no step waits at its end (pushed_sums_done).
template <int CLUSTER, int WARPS, typename S>
__device__ __forceinline__ void pushed_sums_init(PushedSums<CLUSTER, WARPS, S>& ps) {
#if __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0) {
    for (auto& bar : ps.bar)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#else
  __trap();
#endif
}

// The arrive of pushed_sums_init gets its wait here when no step took it.
__device__ __forceinline__ void pushed_sums_done(bool made_steps) {
#if __CUDA_ARCH__ >= 900
  if (!made_steps) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
}

// One warp's sums into the slot at `slot` of a peer (a shared::cluster
// address), counted on that peer's mbarrier at `bar`.
__device__ __forceinline__ void push_sums(unsigned slot, float2 v, unsigned bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];"
               ::"r"(slot), "f"(v.x), "f"(v.y), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void push_sums(unsigned slot, float4 v, unsigned bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
               ::"r"(slot), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(bar)
               : "memory");
}

// The cluster's total of the warps' sums `v` (each warp's lanes hold the
// same v, as warp_sum leaves them) at step `step` of the walk; `first`: the
// walk's first step. Every thread of every block of the cluster calls it,
// the same steps.
template <int CLUSTER, int WARPS, typename S>
__device__ __forceinline__ S pushed_sum(S v, PushedSums<CLUSTER, WARPS, S>& ps, int64_t step,
                                        bool first) {
#if __CUDA_ARCH__ < 900
  __trap();
  return v;
#else
  static_assert(CLUSTER <= 32, "a lane a peer");
  const int set = static_cast<int>(step & 1);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // (the peers' mbarriers are set up: pushed_sums_init's arrive)
  if (first) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  if (threadIdx.x == 0) bulk_expect(&ps.bar[set], CLUSTER * WARPS * sizeof(S));
  if (lane < CLUSTER) {
    unsigned rank;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    unsigned slot, bar;
    asm("mapa.shared::cluster.u32 %0, %1, %2;"
        : "=r"(slot)
        : "r"(smem_addr(&ps.slot[set][rank * WARPS + warp])), "r"(lane));
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(bar) : "r"(smem_addr(&ps.bar[set])), "r"(lane));
    push_sums(slot, v, bar);
  }
  mbarrier_wait(&ps.bar[set], static_cast<unsigned>((step >> 1) & 1));
  S total = zero_sums<S>();
#pragma unroll
  for (int i = lane; i < CLUSTER * WARPS; i += 32) total = sums_plus(total, ps.slot[set][i]);
  return warp_sum(total);
#endif
}

}  // namespace rmsnorm
