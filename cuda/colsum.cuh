// Column sums that finish gw, in a fixed order (no atomics): the same inputs
// give the same bits on every run.
#pragma once

#include "common.cuh"

namespace rmsnorm {

// A block owns 32 columns (threadIdx.x, coalesced) and kColsumLanes row
// lanes (threadIdx.y) that stride down the rows of its slice; the lanes are
// then added 0, 1, ... through shared memory. Many lanes, each with several
// loads in flight: at small N there are only a few blocks (4 at N = 128) and
// over a thousand partial rows, so the walk down the rows is latency-bound.
//   FINAL:  partials (partial_rows x n, fp32) -> gw (n, w_dtype); grid.y == 1.
//  !FINAL:  the naive chain's M x n rows (x dtype) -> partials, grid.y slices.
inline constexpr int kColsumLanes = 32;

template <typename S, bool FINAL>
__global__ void __launch_bounds__(32 * kColsumLanes) colsum(const BwdArgs a) {
  __shared__ float lanes[kColsumLanes][33];
  const int n = a.n;
  const int col = blockIdx.x * 32 + threadIdx.x;
  const S* in = FINAL ? reinterpret_cast<const S*>(a.partials)
                      : static_cast<const S*>(a.naive_rows);
  const int64_t rows = FINAL ? a.partial_rows : a.rows;
  const int64_t per_slice = (rows + gridDim.y - 1) / gridDim.y;
  const int64_t begin = blockIdx.y * per_slice;
  const int64_t end = min(rows, begin + per_slice);

  float s = 0.f;
  if (col < n) {
#pragma unroll 4
    for (int64_t row = begin + threadIdx.y; row < end; row += kColsumLanes)
      s += to_float(in[row * n + col]);
  }
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
    float total = 0.f;
#pragma unroll
    for (int y = 0; y < kColsumLanes; ++y) total += lanes[y][threadIdx.x];
    if constexpr (FINAL) {
      store_from_float(a.gw, a.w_dtype, col, total);
    } else {
      a.partials[(int64_t)blockIdx.y * n + col] = total;
    }
  }
}

}  // namespace rmsnorm
