// The copy-bandwidth ceiling the benchmarks compare with: out = x + g over
// the same bytes as the backward moves (two tensors read, one written), with
// 16-byte accesses and a grid-stride loop, and nothing else. A kernel that
// reaches this rate is at the memory limit for its traffic.
#pragma once

#include "common.cuh"

namespace rmsnorm {

template <typename T>
__global__ void __launch_bounds__(256) copy_ceiling(const CopyArgs a) {
  constexpr int VEC = 16 / sizeof(T);
  using V = Vec<T, VEC>;
  const V* x = static_cast<const V*>(a.x);
  const V* g = static_cast<const V*>(a.g);
  V* out = static_cast<V*>(a.out);
  const int64_t nvec = a.count / VEC;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  // Two vectors a thread per trip: four 16-byte loads in flight before use.
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + stride < nvec; i += 2 * stride) {
    V x0 = x[i], g0 = g[i], x1 = x[i + stride], g1 = g[i + stride];
    V o0, o1;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      o0.v[k] = from_float<T>(to_float(x0.v[k]) + to_float(g0.v[k]));
      o1.v[k] = from_float<T>(to_float(x1.v[k]) + to_float(g1.v[k]));
    }
    out[i] = o0;
    out[i + stride] = o1;
  }
  if (i < nvec) {
    V x0 = x[i], g0 = g[i], o0;
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      o0.v[k] = from_float<T>(to_float(x0.v[k]) + to_float(g0.v[k]));
    out[i] = o0;
  }
  // The tail of a count that is not a whole number of vectors.
  const int64_t tail = nvec * VEC + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (tail < a.count) {
    const T* xs = static_cast<const T*>(a.x);
    const T* gs = static_cast<const T*>(a.g);
    static_cast<T*>(a.out)[tail] = from_float<T>(to_float(xs[tail]) + to_float(gs[tail]));
  }
}

}  // namespace rmsnorm
