// Column sums that finish gw, in a fixed order (no atomics): the same inputs
// give the same bits on every run.
#pragma once

#include <type_traits>

#include "common.cuh"
#include "dispatch.cuh"
#include "plans.h"

namespace rmsnorm {

// A 1024-thread block owns COLS columns (threadIdx.x, coalesced) and
// 1024 / COLS row lanes (threadIdx.y) that stride down the rows of its slice,
// several loads in flight each; the lanes are then added pairwise in a fixed
// tree through shared memory. The walk down the rows is latency-bound when
// there are few columns and many partial rows (N = 128: over a thousand), so
// narrow blocks (COLS = 8) give such sums more blocks and shorter walks; the
// other way round (the cluster rows: 7-66 partial rows, N >= 32768), wide
// blocks (COLS = 128 by 8 lanes, 512 by 2 past N = 131072) keep the grid to a
// wave or two, where 32 x 32 blocks of one or two loads a thread took many
// (plans::colsum_cols).
//   FINAL:  partials (partial_rows x n, fp32) -> gw (n, w_dtype); grid.y == 1.
//  !FINAL:  the naive chain's M x n rows (x dtype) -> partials, grid.y slices.
// PART (FINAL only) picks the column partial: 0 gw, 1 gb (LayerNorm), whose
// partials follow gw's in the scratch; kBothParts: both in one pass, each
// thread summing its column of gw and of gb (grid.y == 1). LayerNorm's two
// sums as two grid rows of blocks took two waves of 1024-thread blocks where
// RMSNorm's one took one (ncu, H200, 8192x2048: 512 blocks, 8.4 us against
// 5.8); one pass keeps RMSNorm's grid and puts twice the loads in flight.
inline constexpr int kBothParts = 2;
template <typename S, bool FINAL, int COLS, int PART = 0>
__global__ void __launch_bounds__(1024) colsum(const BwdArgs a) {
  static_assert(PART == 0 || FINAL, "only the final sum has a gb");
  constexpr int kParts = PART == kBothParts ? 2 : 1;
  constexpr int LANES = 1024 / COLS;
  __shared__ float lanes[kParts][LANES][COLS + 1];
  const int n = a.n;
  const int col = blockIdx.x * COLS + threadIdx.x;
  // part p of this thread's sums is partial first_part + p
  const int first_part = PART == kBothParts ? 0 : PART;
  const int64_t part_stride = FINAL ? (int64_t)a.partial_rows * n : 0;
  const S* in = FINAL ? reinterpret_cast<const S*>(a.partials + first_part * part_stride)
                      : static_cast<const S*>(a.naive_rows);
  const int64_t rows = FINAL ? a.partial_rows : a.rows;
  const int64_t per_slice = (rows + gridDim.y - 1) / gridDim.y;
  const int64_t begin = blockIdx.y * per_slice;
  const int64_t end = min(rows, begin + per_slice);

  float s[kParts] = {};
  if (col < n) {
#pragma unroll 4
    for (int64_t row = begin + threadIdx.y; row < end; row += LANES) {
#pragma unroll
      for (int p = 0; p < kParts; ++p) s[p] += to_float(in[p * part_stride + row * n + col]);
    }
  }
#pragma unroll
  for (int p = 0; p < kParts; ++p) lanes[p][threadIdx.y][threadIdx.x] = s[p];
  // bar.sync is .aligned (a warp reaches it converged): each barrier follows
  // a branch on col or threadIdx.y, and compute-sanitizer synccheck reported
  // divergent lanes at the one in the loop below (fp32, N = 40000), so each
  // warp is brought back together first (bwd_split_cols does the same).
  __syncwarp();
  __syncthreads();
#pragma unroll
  for (int half = LANES / 2; half > 0; half /= 2) {
    if (threadIdx.y < half) {
#pragma unroll
      for (int p = 0; p < kParts; ++p)
        lanes[p][threadIdx.y][threadIdx.x] += lanes[p][threadIdx.y + half][threadIdx.x];
    }
    __syncwarp();
    __syncthreads();
  }
  if (threadIdx.y == 0 && col < n) {
#pragma unroll
    for (int p = 0; p < kParts; ++p) {
      const float total = lanes[p][0][threadIdx.x];
      if constexpr (FINAL) {
        if (first_part + p == 0) {
          store_from_float(a.gw, a.w_dtype, col, total);
        } else {
          store_from_float(a.gb, a.b_dtype, col, total);
        }
      } else {
        a.partials[(int64_t)blockIdx.y * n + col] = total;
      }
    }
  }
}

// The host stub of colsum<S, FINAL, COLS, PART> for COLS =
// plans::colsum_cols(n, FINAL) (8, 32; FINAL only: 128, 512).
template <typename S, bool FINAL, int PART = 0>
const void* colsum_kernel(int cols) {
  auto stub = [](auto c) {
    return reinterpret_cast<const void*>(&colsum<S, FINAL, decltype(c)::value, PART>);
  };
  if (cols == 8) return stub(std::integral_constant<int, 8>{});
  if constexpr (FINAL) {
    if (cols == 128) return stub(std::integral_constant<int, 128>{});
    if (cols == 512) return stub(std::integral_constant<int, 512>{});
  }
  return stub(std::integral_constant<int, 32>{});
}

// The one launch of a column sum over n columns, for the planners and the
// standalone tools alike: blocks of plans::colsum_cols(n, FINAL) columns by
// 1024 / cols row lanes, across the columns and `slices` row slices down
// (grid.y; the final sum takes 1).
struct ColsumLaunch {
  const void* fn;
  dim3 grid, block;
};
template <typename S, bool FINAL, int PART = 0>
ColsumLaunch colsum_launch(int n, int slices = 1) {
  const int cols = plans::colsum_cols(n, FINAL);
  return {colsum_kernel<S, FINAL, PART>(cols), dim3(detail::ceil_div(n, cols), slices),
          dim3(cols, 1024 / cols)};
}

// Its call record for a plan (driver handle resolved: launch.cu).
template <typename S, bool FINAL, int PART = 0>
KernelCall colsum_call(int n, const char* name, int slices = 1) {
  const ColsumLaunch l = colsum_launch<S, FINAL, PART>(n, slices);
  return detail::make_call(l.fn, l.grid, l.block, 0, name);
}

}  // namespace rmsnorm
