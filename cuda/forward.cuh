// RMSNorm forward kernels: y = x * rsqrt(mean(x^2) + eps) * w, one fused pass.
#pragma once

#include "common.cuh"

namespace rmsnorm {

// Row in registers. The grid is capped at what stays resident, so each group
// of GROUP threads walks rows with a grid stride and loads w (any dtype, fp32
// in registers) once for all of them. The many resident warps, each with
// CHUNKS 16-byte loads in flight, hide the memory latency without staging.
template <typename X, typename O, int BLOCK, int GROUP, int CHUNKS>
__global__ void __launch_bounds__(BLOCK) fwd_rows(const FwdArgs a) {
  constexpr int VEC = 16 / sizeof(X);
  constexpr int ROWS = BLOCK / GROUP;
  using XV = Vec<X, VEC>;
  using OV = Vec<O, VEC>;
  __shared__ float2 red[32];
  const int n = a.n;
  const int nvec = n / VEC;
  const int lane = threadIdx.x % GROUP;
  const int r = threadIdx.x / GROUP;

  float w[CHUNKS][VEC];
#pragma unroll
  for (int j = 0; j < CHUNKS; ++j) {
    int v = j * GROUP + lane;
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      w[j][k] = v < nvec ? load_as_float(a.w, a.w_dtype, (int64_t)v * VEC + k)
                         : 0.f;
  }

  const int64_t stride = (int64_t)gridDim.x * ROWS;
  // All threads of a block make the same number of steps (barriers inside
  // group_sum when GROUP == BLOCK); rows past the end are masked.
  for (int64_t base = (int64_t)blockIdx.x * ROWS; base < a.rows; base += stride) {
    const int64_t row = base + r;
    const bool valid = row < a.rows;
    const XV* xr = reinterpret_cast<const XV*>(static_cast<const X*>(a.x) + row * n);
    XV xv[CHUNKS];
    float2 sums = make_float2(0.f, 0.f);
#pragma unroll
    for (int j = 0; j < CHUNKS; ++j) {
      int v = j * GROUP + lane;
      if (valid && v < nvec) {
        xv[j] = xr[v];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          float xf = to_float(xv[j].v[k]);
          sums.x += xf * xf;
        }
      }
    }
    sums = group_sum<GROUP, BLOCK>(sums, red);
    const float rstd = rsqrtf(sums.x / n + a.eps);
    if (!valid) continue;
    OV* yr = reinterpret_cast<OV*>(static_cast<O*>(a.y) + row * n);
#pragma unroll
    for (int j = 0; j < CHUNKS; ++j) {
      int v = j * GROUP + lane;
      if (v < nvec) {
        OV out;
#pragma unroll
        for (int k = 0; k < VEC; ++k)
          out.v[k] = from_float<O>(to_float(xv[j].v[k]) * rstd * w[j][k]);
        yr[v] = out;
      }
    }
  }
}

// Any N, any alignment (VEC = 1 when needed): a block per row, a first pass
// for the sum of squares and a second that re-reads the row (from L1/L2: a
// resident block's row is at most a few hundred KiB) to write y.
template <typename X, typename O, int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK) fwd_looped(const FwdArgs a) {
  using XV = Vec<X, VEC>;
  using OV = Vec<O, VEC>;
  __shared__ float2 red[32];
  const int n = a.n;
  const int nvec = n / VEC;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const XV* xr = reinterpret_cast<const XV*>(static_cast<const X*>(a.x) + row * n);
    float2 sums = make_float2(0.f, 0.f);
    for (int v = threadIdx.x; v < nvec; v += BLOCK) {
      XV xv = xr[v];
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        float xf = to_float(xv.v[k]);
        sums.x += xf * xf;
      }
    }
    sums = group_sum<BLOCK, BLOCK>(sums, red);
    const float rstd = rsqrtf(sums.x / n + a.eps);
    OV* yr = reinterpret_cast<OV*>(static_cast<O*>(a.y) + row * n);
    for (int v = threadIdx.x; v < nvec; v += BLOCK) {
      XV xv = xr[v];
      OV out;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        float wf = load_as_float(a.w, a.w_dtype, (int64_t)v * VEC + k);
        out.v[k] = from_float<O>(to_float(xv.v[k]) * rstd * wf);
      }
      yr[v] = out;
    }
  }
}

}  // namespace rmsnorm
