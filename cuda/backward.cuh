// RMSNorm backward kernels.
//
// With r = rsqrt(mean(x^2) + eps) per row and v = g * w:
//   gx = r * v - x * (mean(v * x) * r^3)
//   gw = sum over rows of g * x * r
// r is recomputed here from x rather than saved by the forward: x has to be
// read for gx anyway, so the sum of squares rides along in the same pass for
// free, and the backward then works for any caller (no forward state).
#pragma once

#include <iterator>
#include <type_traits>
#include <utility>

#include "common.cuh"
#include "plans.h"
#include "row_math.cuh"

namespace rmsnorm {

// Persistent walk (the seed's design), the body of the kernels below. The
// grid is sized by the machine; unit u walks row steps u, u + units, ...
// (ROWS consecutive rows a step), STAGES-1 steps ahead of the compute: x and
// g land in shared memory through asynchronous copies, so loads stay in
// flight although only a few blocks are resident. gw stays in fp32 registers
// for the whole walk and is written once per unit: partials is units x n,
// summed afterwards by colsum.
//
// A unit is one block, or with CLUSTER > 1 a thread-block cluster whose
// blocks each own a contiguous slice of the row's columns (rows too long for
// one SM's shared memory). The row sums then cross the cluster once a step:
// every warp pushes its sums into every block's shared memory and each block
// adds them in a fixed order (pushed_sum, common.cuh: no block barrier and no
// blocking cluster barrier a step), so all of them see the same bits.
//
// BULK picks how a step's rows travel. false: every thread copies (cp.async,
// 16 bytes) exactly the vectors it later reads, so no barrier guards a stage.
// true: one thread hands the whole step (ROWS x n of x, then of g: two
// contiguous ranges) to the bulk copy engine, which frees the other threads'
// issue slots; a stage is refilled only after the block barrier that follows
// the last read of it, and completion is signalled on one mbarrier per stage.
//
// Row is the norm's math (row_math.cuh): its row sums (one or two passes
// over the staged row, each one reduction over the row's group of threads),
// the gx formula and its column partials (RmsRow: gw; LayerRow: gw and gb),
// each an fp32 register array for the whole walk, stored once per unit to its
// own region of the scratch (region p at partials + p * units * n) and summed
// by colsum. A row's group is a sub-warp, the block, or (LayerRow's float4
// sums only: common.cuh group_sum) a run of whole warps, several rows a step.
// A shifted row (LayerRow) in a cluster takes its shift from the row's first
// vector, which thread 0 of every block stages beside its slice (first_x).
template <typename Row, typename X, typename G, int BLOCK, int GROUP, int CHUNKS,
          int STAGES, bool BULK, int CLUSTER>
__device__ __forceinline__ void persistent_walk(const BwdArgs& a) {
  // Extra streams (AddRmsRow): g_h (x's dtype) is a third operand of every
  // stage, after g, moved the same way as x and g (bulk or per thread), and
  // gx leaves as Row::gx_out(gx, g_h).
  static_assert(Row::kExtraIn == Row::kExtraOut && Row::kExtraIn <= 1,
                "one extra stream each way, or none");
  constexpr bool kExtra = Row::kExtraIn == 1;
  constexpr int P = Row::kPartials;
  constexpr int VEC = 16 / sizeof(X);
  constexpr int ROWS = BLOCK / GROUP;
  // A weight-in-registers row on sm_12x (Row::kWReload) whose weight would
  // take 32 floats a thread (512 x 4 of 16-bit x; those of 16 did not spill):
  // the weight re-read at each use, and per-thread copies (arch::kWeightReload
  // says why).
  constexpr bool kWReload = !Row::kWShared && Row::kWReload && CHUNKS * VEC >= 32;
  // Bulk copies where the family has the copy engine; elsewhere the same
  // plan row moves its rows with per-thread copies (arch::kBulkCopy).
  constexpr bool kBulk = BULK && arch::kBulkCopy && !kWReload;
  static_assert(!BULK || STAGES >= 2, "the bulk pipeline refills mid-step");
  static_assert(CLUSTER == 1 || ROWS == 1, "a cluster splits one row a step");
  constexpr bool kClusterShift = CLUSTER > 1 && Row::kShift;
  static_assert(!kClusterShift || !BULK, "the row's first vector is a per-thread copy");
  using Sums = typename Row::Sums;
  constexpr bool kWShared = Row::kWShared;
  using XV = Vec<X, VEC>;
  using GV = Vec<G, VEC>;
  const int n = a.n;
  const int lane = threadIdx.x % GROUP;
  const int r = threadIdx.x / GROUP;
  // This block's columns: vectors [v0, v0 + nvec) of the row.
  const int rank = blockIdx.x % CLUSTER;
  const int per_rank = (n / VEC + CLUSTER - 1) / CLUSTER;
  const int v0 = rank * per_rank;
  const int nvec = max(0, min(n / VEC - v0, per_rank));

  // Stage s: ROWS rows of x (nvec vectors each), then ROWS rows of g, then
  // (kExtra) ROWS rows of g_h. kWShared: the fp32 weight after the last stage.
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ Sums red[32];
  __shared__ unsigned long long landed[STAGES];  // kBulk: one mbarrier a stage
  // CLUSTER: the warps' sums of every block of the cluster (pushed_sum)
  __shared__ std::conditional_t<(CLUSTER > 1), PushedSums<CLUSTER, BLOCK / 32, Sums>, char> pushed;
  if constexpr (CLUSTER > 1) pushed_sums_init(pushed);
  __shared__ XV first_x[kClusterShift ? STAGES : 1];  // kClusterShift: by stage
  const size_t stage_bytes =
      (size_t)ROWS * nvec * (sizeof(XV) + sizeof(GV) + (kExtra ? sizeof(XV) : 0));
  auto stage_x = [&](int s, int row) {
    return reinterpret_cast<XV*>(smem + s * stage_bytes) + (size_t)row * nvec;
  };
  auto stage_g = [&](int s, int row) {
    return reinterpret_cast<GV*>(smem + s * stage_bytes +
                                 (size_t)ROWS * nvec * sizeof(XV)) +
           (size_t)row * nvec;
  };
  auto stage_e = [&](int s, int row) {  // kExtra: g_h
    return reinterpret_cast<XV*>(smem + s * stage_bytes +
                                 (size_t)ROWS * nvec * (sizeof(XV) + sizeof(GV))) +
           (size_t)row * nvec;
  };

  const int64_t unit = blockIdx.x / CLUSTER;
  const int64_t stride = (int64_t)(gridDim.x / CLUSTER) * ROWS;
  const int64_t unit_row = unit * ROWS;
  const int64_t steps =
      unit_row < a.rows ? (a.rows - unit_row + stride - 1) / stride : 0;
  // Rows start at the slice: offsets below are within it.
  const X* x = static_cast<const X*>(a.x) + (size_t)v0 * VEC;
  const G* g = static_cast<const G*>(a.g) + (size_t)v0 * VEC;
  X* gx = static_cast<X*>(a.gx) + (size_t)v0 * VEC;
  const X* e = kExtra ? static_cast<const X*>(a.gh) + (size_t)v0 * VEC : nullptr;

  // Starts the copies of step `step` into its stage (step < steps).
  auto prefetch = [&](int64_t step) {
    const int s = step % STAGES;
    const int64_t first = unit_row + step * stride;
    if constexpr (kBulk) {
      if (threadIdx.x != 0) return;
      // One range per operand: ROWS whole rows, or (ROWS == 1) the slice.
      const int64_t count = min((int64_t)ROWS, a.rows - first);
      const unsigned bytes_x = count * nvec * sizeof(XV);
      const unsigned bytes_g = count * nvec * sizeof(GV);
      bulk_expect(&landed[s], bytes_x + bytes_g + (kExtra ? bytes_x : 0));
      bulk_copy(stage_x(s, 0), x + first * n, bytes_x, &landed[s]);
      bulk_copy(stage_g(s, 0), g + first * n, bytes_g, &landed[s]);
      if constexpr (kExtra) bulk_copy(stage_e(s, 0), e + first * n, bytes_x, &landed[s]);
    } else {
      const int64_t row = first + r;
      if (row >= a.rows) return;
      const XV* xr = reinterpret_cast<const XV*>(x + row * n);
      const GV* gr = reinterpret_cast<const GV*>(g + row * n);
      const XV* er = reinterpret_cast<const XV*>(e + row * n);  // kExtra
#pragma unroll
      for (int j = 0; j < CHUNKS; ++j) {
        int v = j * GROUP + lane;
        if (v < nvec) {
          copy_async(&stage_x(s, r)[v], &xr[v]);
          copy_async(&stage_g(s, r)[v], &gr[v]);
          if constexpr (kExtra) copy_async(&stage_e(s, r)[v], &er[v]);
        }
      }
      if constexpr (kClusterShift) {
        if (threadIdx.x == 0)
          copy_async(&first_x[s], reinterpret_cast<const XV*>(static_cast<const X*>(a.x) + row * n));
      }
    }
  };

  if constexpr (kBulk) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < STAGES; ++s) mbarrier_init(&landed[s]);
    }
    __syncthreads();
  }
  // The first rows go out before anything else: the weight loads below then
  // overlap with them. Per-thread copies: one commit group per step, empty
  // past the end, so that waiting for all but the newest STAGES-1 groups
  // always means "step t has landed".
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < steps) prefetch(s);
    if constexpr (!kBulk) __pipeline_commit();
  }

  // kWShared: the weight as VEC / 4 planes of float4, plane q holding
  // elements 4q..4q+3 of every vector, so that a warp's lanes (consecutive
  // vectors) read consecutive 16-byte words: no bank conflicts.
  float4* sw = reinterpret_cast<float4*>(smem + STAGES * stage_bytes);
  float w[kWShared || kWReload ? 1 : CHUNKS][VEC];
  float acc[P][CHUNKS][VEC] = {};
#pragma unroll
  for (int j = 0; j < (kWReload ? 0 : CHUNKS); ++j) {
    int v = j * GROUP + lane;
    float(&wj)[VEC] = w[kWShared ? 0 : j];
    if (v < nvec) {
      load_w(a.w, a.w_dtype, v0 + v, aligned16(a.w), wj);
      add_offset(wj, a.offset);  // the scale offset + w (Gemma), fp32
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) wj[k] = 0.f;
    }
    if constexpr (kWShared) {
      if (r == 0 && v < nvec) {
#pragma unroll
        for (int q = 0; q < VEC / 4; ++q)
          sw[q * nvec + v] = make_float4(wj[4 * q], wj[4 * q + 1], wj[4 * q + 2], wj[4 * q + 3]);
      }
    }
  }
  if constexpr (kWShared) __syncthreads();  // the weight, before any row reads it
  // The weight of vector v (chunk j) for the element loops: the registers, or
  // `local` filled from shared memory (kWShared) or from w itself (kWReload:
  // the same fp32 values as the registers would hold).
  auto weight = [&](int j, int v, float(&local)[VEC]) -> const float(&)[VEC] {
    if constexpr (kWShared) {
#pragma unroll
      for (int q = 0; q < VEC / 4; ++q) {
        const float4 f = sw[q * nvec + v];
        local[4 * q] = f.x;
        local[4 * q + 1] = f.y;
        local[4 * q + 2] = f.z;
        local[4 * q + 3] = f.w;
      }
      return local;
    } else if constexpr (kWReload) {
      load_w(a.w, a.w_dtype, v0 + v, aligned16(a.w), local);
      add_offset(local, a.offset);
      return local;
    } else {
      return w[j];
    }
  };

  for (int64_t t = 0; t < steps; ++t) {
    const int s = t % STAGES;
    if constexpr (kBulk) {
      mbarrier_wait(&landed[s], (t / STAGES) & 1);
    } else {
      // Refills the stage computed on at t-1: the same thread read it then.
      if (t + STAGES - 1 < steps) prefetch(t + STAGES - 1);
      __pipeline_commit();
      __pipeline_wait_prior(STAGES - 1);
    }

    const int64_t row = unit_row + r + t * stride;
    const bool valid = row < a.rows;  // uniform when ROWS == 1
    const XV* sx = stage_x(s, r);
    const GV* sg = stage_g(s, r);

    // The row's sums, pass by pass (each pass reads the staged row again and
    // is one block reduction).
    typename Row::Stats st{};
    if constexpr (Row::kShift) {
      // The mean of the row's first vector, the same in every thread of it.
      if constexpr (GROUP <= 32) {
        // The group's lane 0 staged that vector itself (or the stage has
        // landed whole: bulk), and passes its mean along.
        float k = 0.f;
        if (lane == 0) k = vec_mean(sx[0]);
        st.shift = __shfl_sync(0xffffffffu, k, 0, GROUP < 32 ? GROUP : 32);
      } else {
        // Per-thread copies: thread 0 staged it (in a cluster: first_x);
        // its copies are complete (its pipeline wait), and visible to the
        // block after a barrier.
        if constexpr (!kBulk) __syncthreads();
        st.shift = vec_mean(kClusterShift ? first_x[s] : sx[0]);
      }
    }
    auto pass_sums = [&](auto pass_index) {
      constexpr int PASS = decltype(pass_index)::value;
      Sums sums = zero_sums<Sums>();
#pragma unroll
      for (int j = 0; j < CHUNKS; ++j) {
        int v = j * GROUP + lane;
        if (valid && v < nvec) {
          XV xv = sx[v];
          GV gv = sg[v];
          float local[VEC];
          const float(&wj)[VEC] = weight(j, v, local);
#pragma unroll
          for (int k = 0; k < VEC; ++k)
            Row::template add<PASS>(sums, element(xv, k), element(gv, k),
                                    wj[k], st);
        }
      }
      // (a cluster adds the warps' sums of all its blocks: pushed_sum)
      if constexpr (CLUSTER > 1)
        return warp_sum(sums);
      else
        return group_sum<GROUP, BLOCK>(sums, red);
    };
    Sums sums = pass_sums(std::integral_constant<int, 0>{});
    if constexpr (kBulk) {
      // Every thread is past its reads of step t-1 (the barrier in group_sum,
      // or this one when a row lives inside a warp or its block's sums are
      // a cluster's, pushed_sum): its stage can refill.
      if constexpr (GROUP <= 32 || CLUSTER > 1) __syncthreads();
      if (t + STAGES - 1 < steps) prefetch(t + STAGES - 1);
    }
    // Cluster sums alternate two sets of slots by the parity of their count.
    if constexpr (CLUSTER > 1)
      sums = pushed_sum(sums, pushed, Row::kPasses * t, t == 0);
    Row::template finish<0>(sums, n, a.eps, st);
    if constexpr (Row::kPasses > 1) {
      sums = pass_sums(std::integral_constant<int, 1>{});
      if constexpr (CLUSTER > 1) sums = pushed_sum(sums, pushed, Row::kPasses * t + 1, false);
      Row::template finish<1>(sums, n, a.eps, st);
    }

    if (valid) {
      XV* gxr = reinterpret_cast<XV*>(gx + row * n);
#pragma unroll
      for (int j = 0; j < CHUNKS; ++j) {
        int v = j * GROUP + lane;
        if (v < nvec) {
          XV xv = sx[v];
          GV gv = sg[v];
          XV ev;  // kExtra: g_h
          if constexpr (kExtra) ev = stage_e(s, r)[v];
          float local[VEC];
          const float(&wj)[VEC] = weight(j, v, local);
          XV out;
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            float xf = element(xv, k);
            float gf = element(gv, k);
            float o = Row::gx(xf, gf, wj[k], st);
            if constexpr (kExtra) o = Row::gx_out(o, element(ev, k));
            out.v[k] = from_float<X>(o);
#pragma unroll
            for (int p = 0; p < P; ++p) acc[p][j][k] += Row::partial(p, xf, gf, st);
          }
          gxr[v] = out;
        }
      }
    }
  }
  if constexpr (!kBulk) __pipeline_wait_prior(0);
  // (no cluster barrier before the partials: every push to this block is
  // one it waited for, and it reads its own slots only)
  if constexpr (CLUSTER > 1) pushed_sums_done(steps > 0);

  // Each wanted partial leaves through shared memory (the stages are free
  // now), so that every global store is a 16-byte vector of consecutive
  // columns. Stored straight from acc, a warp's lanes sit VEC floats apart and
  // each store instruction touched 32 sectors for 4 bytes of each: under ncu
  // the gw kernel took 13 us longer than the same kernel without gw at
  // 16384x8192 and 4096x8192, for a 13 MB write. Several rows a step
  // (ROWS > 1) add the ROWS partials of this block there in a fixed order
  // (row lane 0, 1, ...) and write one row. Unwanted partials (no weight, or
  // a frozen one; no bias) are neither stored nor summed.
  static_assert(VEC % 4 == 0, "acc leaves as float4");
  // n floats fit in the stages (plans.h), short of kWShared's weight after them.
  float* sacc = reinterpret_cast<float*>(smem);
  const int64_t units = gridDim.x / CLUSTER;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    if (!Row::wants(a, p)) continue;
    __syncthreads();  // every thread is past its reads of the last stage / sacc
    for (int rr = 0; rr < ROWS; ++rr) {
      if (r == rr) {
#pragma unroll
        for (int j = 0; j < CHUNKS; ++j) {
          int v = j * GROUP + lane;
          if (v < nvec) {
            float4* dst = reinterpret_cast<float4*>(sacc + v * VEC);
#pragma unroll
            for (int q = 0; q < VEC / 4; ++q) {
              float4 sum = make_float4(acc[p][j][4 * q], acc[p][j][4 * q + 1],
                                       acc[p][j][4 * q + 2], acc[p][j][4 * q + 3]);
              if (rr > 0) {
                const float4 prev = dst[q];
                sum = make_float4(prev.x + sum.x, prev.y + sum.y, prev.z + sum.z,
                                  prev.w + sum.w);
              }
              dst[q] = sum;
            }
          }
        }
      }
      __syncthreads();
    }
    // partials rows are n floats, n a multiple of VEC, and the scratch is
    // 16-byte aligned: out is too.
    float4* out = reinterpret_cast<float4*>(a.partials + (p * units + unit) * n +
                                            (size_t)v0 * VEC);
    const float4* src = reinterpret_cast<const float4*>(sacc);
    for (int i = threadIdx.x; i < nvec * VEC / 4; i += BLOCK) out[i] = src[i];
  }
}

// The kernels: bwd_persistent; a row a cluster (rows past one SM's shared
// memory, sm_90 on) bwd_persistent_cluster; with a register cap
// bwd_persistent_capped. Each runs the walk of a row of family FAMILY's table
// (RowPlan::family; clusters are family 90's): on the other family's
// architectures its body is a trap, since the planners never launch it there.
template <int FAMILY, typename Row, typename X, typename G, int BLOCK, int GROUP, int CHUNKS,
          int STAGES, bool BULK, int CLUSTER>
__device__ __forceinline__ void walk_of_family(const BwdArgs& a) {
  if constexpr (arch::builds_family(FAMILY)) {
    persistent_walk<Row, X, G, BLOCK, GROUP, CHUNKS, STAGES, BULK, CLUSTER>(a);
  } else {
    __trap();
  }
}

template <typename X, typename G, int BLOCK, int GROUP, int CHUNKS, int STAGES,
          bool BULK, typename Row = RmsRow, int FAMILY = 90>
__global__ void __launch_bounds__(BLOCK) bwd_persistent(const BwdArgs a) {
  walk_of_family<FAMILY, Row, X, G, BLOCK, GROUP, CHUNKS, STAGES, BULK, 1>(a);
}

template <typename X, typename G, int BLOCK, int GROUP, int CHUNKS, int STAGES,
          bool BULK, int CLUSTER, typename Row = RmsRow>
__global__ void RMSNORM_CLUSTER_DIMS(CLUSTER) __launch_bounds__(BLOCK)
    bwd_persistent_cluster(const BwdArgs a) {
  walk_of_family<90, Row, X, G, BLOCK, GROUP, CHUNKS, STAGES, BULK, CLUSTER>(a);
}

// The walk with a register cap: at least MIN_BLOCKS blocks of BLOCK threads
// a SM (LayerNorm rows whose two partials would otherwise cost a resident
// block, plans.h).
template <typename X, typename G, int BLOCK, int GROUP, int CHUNKS, int STAGES,
          bool BULK, int MIN_BLOCKS, typename Row, int FAMILY = 90>
__global__ void __launch_bounds__(BLOCK, MIN_BLOCKS) bwd_persistent_capped(const BwdArgs a) {
  walk_of_family<FAMILY, Row, X, G, BLOCK, GROUP, CHUNKS, STAGES, BULK, 1>(a);
}

// The host stub of plan row Table[I] (plans.h) with policy Row.
template <typename X, typename G, typename Row, const auto& Table, std::size_t I>
const void* persistent_kernel_for() {
  constexpr int kBlock = Table[I].block, kGroup = Table[I].group, kChunks = Table[I].chunks,
                kStages = Table[I].stages, kMinBlocks = Table[I].min_blocks,
                kCluster = Table[I].cluster, kFamily = Table[I].family;
  constexpr bool kBulk = Table[I].bulk;
  static_assert(kCluster == 1 || kMinBlocks == 0, "cluster rows take no register cap");
  static_assert(kCluster == 1 || kFamily >= 90, "clusters from sm_90 on");
  if constexpr (kCluster > 1) {
    return reinterpret_cast<const void*>(
        &bwd_persistent_cluster<X, G, kBlock, kGroup, kChunks, kStages, kBulk, kCluster, Row>);
  } else if constexpr (kMinBlocks > 0) {
    return reinterpret_cast<const void*>(
        &bwd_persistent_capped<X, G, kBlock, kGroup, kChunks, kStages, kBulk, kMinBlocks, Row,
                               kFamily>);
  } else {
    return reinterpret_cast<const void*>(
        &bwd_persistent<X, G, kBlock, kGroup, kChunks, kStages, kBulk, Row, kFamily>);
  }
}

// Table's kernels with policy Row, by row.
template <typename X, typename G, typename Row, const auto& Table>
const void* persistent_kernel_for(int row) {
  return kernel_by_row<std::size(Table)>(
      row, [](auto i) { return persistent_kernel_for<X, G, Row, Table, decltype(i)::value>(); });
}

// The row of Table (plans.h) for rows of nvec vectors and its kernel with
// policy Row; nulls past the table.
template <typename X, typename G, typename Row, const auto& Table>
std::pair<const plans::RowPlan*, const void*> persistent_row_of(int nvec) {
  const int row = plans::row_for(Table, nvec);
  if (row < 0) return {nullptr, nullptr};
  return {&Table[row], persistent_kernel_for<X, G, Row, Table>(row)};
}

// Sum of (x^2, g*w*x) over one row, by a whole block, VEC elements at a time.
template <typename X, typename G, int BLOCK, int VEC>
__device__ __forceinline__ float2 row_sums(const BwdArgs& a, int64_t row,
                                           float2* red) {
  using XV = Vec<X, VEC>;
  using GV = Vec<G, VEC>;
  const int nvec = a.n / VEC;
  const XV* xr = reinterpret_cast<const XV*>(static_cast<const X*>(a.x) + row * a.n);
  const GV* gr = reinterpret_cast<const GV*>(static_cast<const G*>(a.g) + row * a.n);
  const bool w_aligned = aligned16(a.w);
  float2 sums = make_float2(0.f, 0.f);
  for (int v = threadIdx.x; v < nvec; v += BLOCK) {
    XV xv = xr[v];
    GV gv = gr[v];
    float wv[VEC];
    load_w(a.w, a.w_dtype, v, w_aligned, wv);
    add_offset(wv, a.offset);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      float xf = to_float(xv.v[k]);
      sums.x += xf * xf;
      sums.y += to_float(gv.v[k]) * wv[k] * xf;
    }
  }
  return group_sum<BLOCK, BLOCK>(sums, red);
}

// Split plan, kernel 1: per-row statistics (rstd, mean(g*w*x) * rstd^3) for
// rows too long to keep in one block's registers or shared memory.
template <typename X, typename G, int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK) bwd_row_stats(const BwdArgs a) {
  __shared__ float2 red[32];
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    float2 s = row_sums<X, G, BLOCK, VEC>(a, row, red);
    float rstd = rsqrtf(s.x / a.n + a.eps);
    if (threadIdx.x == 0) {
      a.row_stats[2 * row] = rstd;
      a.row_stats[2 * row + 1] = s.y / a.n * rstd * rstd * rstd;
    }
  }
}

// Split plan, kernel 2: a 32-vector column tile (threadIdx.x) by 8 row lanes
// (threadIdx.y) walks the rows of its split, writes gx and leaves one fp32 gw
// partial row per split (blockIdx.y), the 8 lanes added in a fixed order.
template <typename X, typename G, int VEC>
__global__ void __launch_bounds__(256) bwd_split_cols(const BwdArgs a) {
  using XV = Vec<X, VEC>;
  using GV = Vec<G, VEC>;
  __shared__ float sacc[8][32 * VEC];
  const int n = a.n;
  const int nvec = n / VEC;
  const int v = blockIdx.x * 32 + threadIdx.x;
  const int64_t per_split = (a.rows + gridDim.y - 1) / gridDim.y;
  const int64_t begin = blockIdx.y * per_split;
  const int64_t end = min(a.rows, begin + per_split);

  float w[VEC] = {}, acc[VEC] = {};
  // g_h (add_rms_norm's backward, AddRmsRow's stream): added into gx.
  const X* gh = static_cast<const X*>(a.gh);
  if (v < nvec) {
    load_w(a.w, a.w_dtype, v, aligned16(a.w), w);
    add_offset(w, a.offset);
    for (int64_t row = begin + threadIdx.y; row < end; row += 8) {
      XV xv = reinterpret_cast<const XV*>(static_cast<const X*>(a.x) + row * n)[v];
      GV gv = reinterpret_cast<const GV*>(static_cast<const G*>(a.g) + row * n)[v];
      float rstd = a.row_stats[2 * row], c = a.row_stats[2 * row + 1];
      XV hv{};
      if (gh != nullptr) hv = reinterpret_cast<const XV*>(gh + row * n)[v];
      XV out;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        float xf = to_float(xv.v[k]);
        float gf = to_float(gv.v[k]);
        float o = rstd * w[k] * gf - xf * c;
        if (gh != nullptr) o = AddRmsRow::gx_out(o, to_float(hv.v[k]));
        out.v[k] = from_float<X>(o);
        acc[k] += gf * xf * rstd;
      }
      reinterpret_cast<XV*>(static_cast<X*>(a.gx) + row * n)[v] = out;
    }
  }
  if (a.gw == nullptr) return;
#pragma unroll
  for (int k = 0; k < VEC; ++k) sacc[threadIdx.y][threadIdx.x * VEC + k] = acc[k];
  // bar.sync is .aligned: a warp must reach it converged. The last column
  // tile's lanes past nvec skip the row loop that the others run, and
  // compute-sanitizer synccheck reported divergent lanes here (fp32 rows past
  // N = 32768), so the warp is brought back together first.
  __syncwarp();
  __syncthreads();
  for (int i = threadIdx.y * 32 + threadIdx.x; i < 32 * VEC; i += 256) {
    int col = blockIdx.x * 32 * VEC + i;
    if (col < n) {
      float s = 0.f;
#pragma unroll
      for (int y = 0; y < 8; ++y) s += sacc[y][i];
      a.partials[(int64_t)blockIdx.y * n + col] = s;
    }
  }
}

// The seed's naive per-row kernel, kept as the baseline: a block per row
// writes gx and the row's whole gw contribution (in x's dtype, as the seed
// does) to an M x N buffer that two colsum launches then reduce. The second
// pass over the row reads x and g again, which mostly hits L1/L2.
template <typename X, typename G, int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK) bwd_naive_rows(const BwdArgs a) {
  using XV = Vec<X, VEC>;
  using GV = Vec<G, VEC>;
  __shared__ float2 red[32];
  const int n = a.n;
  const int nvec = n / VEC;
  const bool w_aligned = aligned16(a.w);
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    float2 s = row_sums<X, G, BLOCK, VEC>(a, row, red);
    const float rstd = rsqrtf(s.x / n + a.eps);
    const float c = s.y / n * rstd * rstd * rstd;
    const XV* xr = reinterpret_cast<const XV*>(static_cast<const X*>(a.x) + row * n);
    const GV* gr = reinterpret_cast<const GV*>(static_cast<const G*>(a.g) + row * n);
    XV* gxr = reinterpret_cast<XV*>(static_cast<X*>(a.gx) + row * n);
    XV* gwr = reinterpret_cast<XV*>(static_cast<X*>(a.naive_rows) + row * n);
    for (int v = threadIdx.x; v < nvec; v += BLOCK) {
      XV xv = xr[v];
      GV gv = gr[v];
      float wv[VEC];
      load_w(a.w, a.w_dtype, v, w_aligned, wv);
      add_offset(wv, a.offset);
      XV out, part;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        float xf = to_float(xv.v[k]);
        float gf = to_float(gv.v[k]);
        out.v[k] = from_float<X>(rstd * wv[k] * gf - xf * c);
        part.v[k] = from_float<X>(gf * xf * rstd);
      }
      gxr[v] = out;
      if (a.gw != nullptr) gwr[v] = part;
    }
  }
}

}  // namespace rmsnorm
