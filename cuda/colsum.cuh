// Column sums that finish gw, in a fixed order (no atomics): the same inputs
// give the same bits on every run.
#pragma once

#include "common.cuh"

namespace rmsnorm {

// A 1024-thread block owns COLS columns (threadIdx.x, coalesced) and
// 1024 / COLS row lanes (threadIdx.y) that stride down the rows of its slice,
// several loads in flight each; the lanes are then added pairwise in a fixed
// tree through shared memory. The walk down the rows is latency-bound when
// there are few columns and many partial rows (N = 128: over a thousand), so
// narrow blocks (COLS = 8) give such sums more blocks and shorter walks.
//   FINAL:  partials (partial_rows x n, fp32) -> gw (n, w_dtype); grid.y == 1.
//  !FINAL:  the naive chain's M x n rows (x dtype) -> partials, grid.y slices.
template <typename S, bool FINAL, int COLS>
__global__ void __launch_bounds__(1024) colsum(const BwdArgs a) {
  constexpr int LANES = 1024 / COLS;
  __shared__ float lanes[LANES][COLS + 1];
  const int n = a.n;
  const int col = blockIdx.x * COLS + threadIdx.x;
  const S* in = FINAL ? reinterpret_cast<const S*>(a.partials)
                      : static_cast<const S*>(a.naive_rows);
  const int64_t rows = FINAL ? a.partial_rows : a.rows;
  const int64_t per_slice = (rows + gridDim.y - 1) / gridDim.y;
  const int64_t begin = blockIdx.y * per_slice;
  const int64_t end = min(rows, begin + per_slice);

  float s = 0.f;
  if (col < n) {
#pragma unroll 4
    for (int64_t row = begin + threadIdx.y; row < end; row += LANES)
      s += to_float(in[row * n + col]);
  }
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
#pragma unroll
  for (int half = LANES / 2; half > 0; half /= 2) {
    if (threadIdx.y < half) lanes[threadIdx.y][threadIdx.x] += lanes[threadIdx.y + half][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && col < n) {
    const float total = lanes[0][threadIdx.x];
    if constexpr (FINAL) {
      store_from_float(a.gw, a.w_dtype, col, total);
    } else {
      a.partials[(int64_t)blockIdx.y * n + col] = total;
    }
  }
}

// The gw column sum folded into the backward kernel itself (one graph node
// a call instead of two: on the host a node costs about as much as a small
// kernel does on the GPU). Units (blocks, or clusters) write their partial
// rows, then climb a tree of fan-in FANIN: the last of a node's children to
// arrive adds the children's rows, in child order, into the first child's
// row and arrives at the parent; the unit that completes the root writes gw.
// The arrival counters only decide *who* adds: the order of the additions is
// fixed by the tree, so gw has the same bits whatever order units finish in.
// No unit ever waits for another (no spinning: safe with any residency).
//
// `arrivals` holds one counter per tree node above the leaves, level by
// level, zero when the kernel starts; every counter is reset by its last
// arriver, so the kernel leaves them zero again for the next call (the
// caller keeps zeroed scratch for them: see Plan::arrival_bytes).
//
// Every thread of the block calls this after its last write of the
// partial row `unit` (of a.partial_rows).
template <int BLOCK, int FANIN>
__device__ void fold_partials(const BwdArgs& a, int64_t unit) {
  __shared__ bool last;
  const int n = a.n;
  const bool vec4 = n % 4 == 0;
  const int cols = vec4 ? n / 4 : n;
  unsigned* counter = a.arrivals;
  int64_t nodes = a.partial_rows;  // at this level
  int64_t stride = 1;              // partial rows between two nodes' rows
  int64_t node = unit;
  float* rows = a.partials;
  while (nodes > 1) {
    const int64_t parent = node / FANIN;
    const int64_t first = parent * FANIN;
    const int children = static_cast<int>(nodes - first < FANIN ? nodes - first : FANIN);
    // Release: this block's row is visible device-wide before it arrives.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      last = atomicAdd(&counter[parent], 1u) == unsigned(children - 1);
      if (last) counter[parent] = 0;  // every child has arrived: reusable
    }
    __syncthreads();
    if (!last) return;
    __threadfence();  // acquire: the siblings' rows, read past L1 below
    float* dst = rows + first * stride * n;
    for (int c = threadIdx.x; c < cols; c += BLOCK) {
      if (vec4) {
        float4 v[FANIN];
#pragma unroll
        for (int k = 0; k < FANIN; ++k)
          if (k < children)
            v[k] = __ldcg(reinterpret_cast<const float4*>(dst + k * stride * n) + c);
        float4 s = v[0];
#pragma unroll
        for (int k = 1; k < FANIN; ++k) {
          if (k < children) {
            s.x += v[k].x; s.y += v[k].y; s.z += v[k].z; s.w += v[k].w;
          }
        }
        reinterpret_cast<float4*>(dst)[c] = s;
      } else {
        float v[FANIN];
#pragma unroll
        for (int k = 0; k < FANIN; ++k)
          if (k < children) v[k] = __ldcg(dst + k * stride * n + c);
        float s = v[0];
#pragma unroll
        for (int k = 1; k < FANIN; ++k)
          if (k < children) s += v[k];
        dst[c] = s;
      }
    }
    counter += (nodes + FANIN - 1) / FANIN;
    nodes = (nodes + FANIN - 1) / FANIN;
    stride *= FANIN;
    node = parent;
  }
  // The root: row 0 holds the sum over every unit (or this block wrote it
  // alone). Its own writes are visible to its own threads after a barrier.
  __syncthreads();
  for (int col = threadIdx.x; col < n; col += BLOCK)
    store_from_float(a.gw, a.w_dtype, col, __ldcg(rows + col));
}

// Counters fold_partials needs for `units` partial rows (0 for one unit).
inline std::size_t fold_counters(int64_t units, int fanin) {
  std::size_t total = 0;
  for (int64_t nodes = units; nodes > 1; nodes = (nodes + fanin - 1) / fanin)
    total += (nodes + fanin - 1) / fanin;
  return total;
}

}  // namespace rmsnorm
