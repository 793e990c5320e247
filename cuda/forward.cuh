// Norm forward kernels. RMSNorm: y = x * rsqrt(mean(x^2) + eps) * w, one
// fused pass; fwd_rows also runs LayerNorm (row_math.cuh).
#pragma once

#include <iterator>
#include <type_traits>
#include <utility>

#include "common.cuh"
#include "plans.h"
#include "row_math.cuh"

namespace rmsnorm {

// Row in registers. Each group of GROUP threads takes ROWS = BLOCK / GROUP
// rows a step; blocks walk steps with a grid stride.
//
// PERSISTENT: the grid is what stays resident, and w (any dtype) is read
// once into fp32 registers for all the block's rows. STAGES == 2 issues the
// loads of the next step before reducing the current one, so a block keeps
// two rows in flight instead of idling on each row's latency.
// !PERSISTENT: a block per step; w is read after the reduction (from L2, in
// its own dtype, vectorized), which keeps registers low, so many small
// blocks are resident and many more rows' loads are in flight. At mid N
// this moves more bytes at once than w in registers allows.
//
// Row is the norm's math (row_math.cuh): its reduction passes over the row in
// registers (RmsRow: sum x^2; LayerRow: sum d and sum d^2 of d = x - shift,
// one reduction) and the output formula; with Row::kBias, b is read beside w
// (absent: 0).
//
// W_AS_X (a block per step only; the planner checks that w and b, both
// given, have x's dtype and 16-byte aligned bases): w and b are read as
// x-typed vectors and widened where y uses them. The general read widens
// them to fp32 as they arrive, and since every chunk's reads are issued
// before the first is used, a thread then holds CHUNKS * VEC fp32 of each
// (the fp32 weight's case sets the registers of all dtypes). LayerNorm's
// rows lost occupancy to exactly that: 64 registers against RMSNorm's 40 at
// 128 x 2 (ncu 32768x1280: 50% theoretical occupancy, 43% of DRAM peak,
// against 75% and 65%), 78 against 63 at 256 x 4 (docs/NOTES.md). With
// W_AS_X: 55 and 64 (ptxas, sm_90, bf16); a branch for an absent b cost 13
// of them back at 256 x 4, so a LayerNorm without bias reads w as x under its
// own policy (WithoutBias, row_math.cuh: no b at all).
//
// CLUSTER > 1 (sm_90 on; rows past what one block holds in registers): a
// row a step spans a thread-block cluster, each block holding a contiguous
// slice of its columns; every warp pushes its sums into every block's
// shared memory and each block adds them in a fixed order (pushed_sum,
// common.cuh: no block barrier and no blocking cluster barrier a row), so
// every block scales by the same rstd and a row is read once (fwd_looped
// reads it twice).
template <typename X, typename O, int BLOCK, int GROUP, int CHUNKS, int STAGES,
          bool PERSISTENT, typename Row, bool W_AS_X = false, int CLUSTER = 1>
__device__ __forceinline__ void fwd_rows_body(const FwdArgs& a) {
  static_assert(!(W_AS_X && PERSISTENT), "the persistent rows keep fp32 w in registers");
  // A shifted row (LayerRow) takes its shift from the row's first vector in
  // global memory (kFirst, below), so every block of a cluster has the same.
  static_assert(CLUSTER == 1 || (GROUP == BLOCK && GROUP > 32 && Row::kFwdPasses == 1),
                "a cluster takes one row a step, of one sum");
  static_assert(STAGES == 1 || STAGES == 2, "one row, or one more loading");
  // Extra streams (AddRmsRow): the residual is loaded beside x, the row
  // value row_in(x, residual) replaces x in registers, and it is written to
  // FwdArgs::h beside y.
  static_assert(Row::kExtraIn == Row::kExtraOut && Row::kExtraIn <= 1,
                "one extra stream each way, or none");
  constexpr bool kExtra = Row::kExtraIn == 1;
  constexpr int VEC = 16 / sizeof(X);
  constexpr int ROWS = BLOCK / GROUP;
  constexpr int W_REGS = PERSISTENT ? CHUNKS : 1;  // fp32 w kept for the walk
  constexpr int B_REGS = Row::kBias ? W_REGS : 1;  // and b, when the norm has one
  using XV = Vec<X, VEC>;
  using OV = Vec<O, VEC>;
  // Row::kShift: the shift is the mean of the row's first vector. A group
  // within a warp has it in its lane 0 (chunk 0); a row over several warps
  // reads it again when the row is reduced (kFirst): one more 16-byte load a
  // thread, of the line the row's lane 0 has loaded (an L1 hit, no DRAM
  // bytes). Held in registers from the row's loads on instead, as it once
  // was, it cost 8 registers a thread (ptxas, sm_90, bf16 LayerNorm rows
  // 128 x 2: 55 -> 47, 256 x 4: 64 -> 63, 70 -> 63 with the general read of
  // w and b), and registers set these rows' occupancy.
  constexpr bool kFirst = Row::kShift && GROUP > 32;
  __shared__ float2 red[32];
  // CLUSTER: the warps' sums of every block of the cluster (pushed_sum)
  constexpr int kWarps = BLOCK / 32;
  __shared__ std::conditional_t<(CLUSTER > 1), PushedSums<CLUSTER, kWarps>, char> pushed;
  const int n = a.n;
  // This block's columns: vectors [v0, v0 + nvec) of the row (all of it
  // without a cluster); row pointers below start at v0.
  const int rank = blockIdx.x % CLUSTER;
  const int per_rank = (n / VEC + CLUSTER - 1) / CLUSTER;
  const int v0 = rank * per_rank;
  // (without a cluster exactly n / VEC: the code of the rows stays as it was)
  const int nvec = CLUSTER == 1 ? n / VEC : max(0, min(n / VEC - v0, per_rank));
  const int lane = threadIdx.x % GROUP;
  const int r = threadIdx.x / GROUP;
  const int64_t stride = (int64_t)(gridDim.x / CLUSTER) * ROWS;
  const int64_t first = (int64_t)(blockIdx.x / CLUSTER) * ROWS;
  const bool w_aligned = aligned16(a.w);
  auto row_vectors = [&](const void* base, int64_t row) {
    return reinterpret_cast<const XV*>(static_cast<const X*>(base) + row * n) + v0;
  };

  auto load = [&](XV (&xv)[CHUNKS], int64_t base) {
    const int64_t row = base + r;
    if (row >= a.rows) return;
    const XV* xr = row_vectors(a.x, row);
    if constexpr (kExtra) {
      // Every load of both operands is issued before the first use.
      const XV* er = row_vectors(a.residual, row);
      XV ev[CHUNKS];
#pragma unroll
      for (int j = 0; j < CHUNKS; ++j) {
        int v = j * GROUP + lane;
        if (v < nvec) {
          xv[j] = xr[v];
          ev[j] = er[v];
        }
      }
#pragma unroll
      for (int j = 0; j < CHUNKS; ++j) xv[j] = Row::row_in(xv[j], ev[j]);
    } else {
#pragma unroll
      for (int j = 0; j < CHUNKS; ++j) {
        int v = j * GROUP + lane;
        if (v < nvec) xv[j] = xr[v];
      }
    }
  };
  float w[W_REGS][VEC];
  float b[B_REGS][VEC];
  const bool has_b = Row::kBias && a.b != nullptr;
  const bool b_aligned = Row::kBias && aligned16(a.b);
  // b as floats (0 when absent), read like w.
  auto load_b = [&](int v, float(&bj)[VEC]) {  // v: a vector of the row
    if (has_b) {
      load_w(a.b, a.b_dtype, v, b_aligned, bj);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) bj[k] = 0.f;
    }
  };
  // All threads of a block make the same steps (barriers inside group_sum
  // when GROUP == BLOCK); rows past the end are masked.
  auto finish = [&](XV (&xv)[CHUNKS], int64_t base) {
    const int64_t row = base + r;
    const bool valid = row < a.rows;
    typename Row::FwdStats st{};
    if constexpr (Row::kShift) {
      if constexpr (kFirst) {
        // (a masked row reads row 0's: any value serves it)
        const int64_t start = (valid ? row : 0) * n;
        XV first = reinterpret_cast<const XV*>(static_cast<const X*>(a.x) + start)[0];
        if constexpr (kExtra) {  // the shift is h's: its first vector
          const XV e0 = reinterpret_cast<const XV*>(static_cast<const X*>(a.residual) + start)[0];
          first = Row::row_in(first, e0);
        }
        st.shift = vec_mean(first);
      } else {
        st.shift = __shfl_sync(0xffffffffu, vec_mean(xv[0]), 0, GROUP < 32 ? GROUP : 32);
      }
    }
    auto pass = [&](auto pass_index) {
      constexpr int PASS = decltype(pass_index)::value;
      float2 sums = make_float2(0.f, 0.f);
#pragma unroll
      for (int j = 0; j < CHUNKS; ++j) {
        int v = j * GROUP + lane;
        if (valid && v < nvec) {
#pragma unroll
          for (int k = 0; k < VEC; ++k)
            Row::template fwd_add<PASS>(sums, element(xv[j], k), st);
        }
      }
      // (every block of a cluster makes the same steps: they share the rows)
      if constexpr (CLUSTER > 1)
        sums = pushed_sum(warp_sum(sums), pushed, base / stride, base == first);
      else
        sums = group_sum<GROUP, BLOCK>(sums, red);
      Row::template fwd_finish<PASS>(sums, n, a.eps, st);
    };
    pass(std::integral_constant<int, 0>{});
    if constexpr (Row::kFwdPasses > 1) pass(std::integral_constant<int, 1>{});
    if (!valid) return;
    OV* yr = reinterpret_cast<OV*>(static_cast<O*>(a.y) + row * n) + v0;
    XV* hr = reinterpret_cast<XV*>(static_cast<X*>(a.h) + row * n) + v0;  // kExtra
#pragma unroll
    for (int j = 0; j < CHUNKS; ++j) {
      int v = j * GROUP + lane;
      if (v < nvec) {
        if constexpr (kExtra) hr[v] = xv[j];  // the row value: h
        float(&wj)[VEC] = w[PERSISTENT ? j : 0];
        float(&bj)[VEC] = b[PERSISTENT && Row::kBias ? j : 0];
        XV wv, bv;  // W_AS_X: w and b as stored, widened below
        if constexpr (W_AS_X) {
          wv = static_cast<const XV*>(a.w)[v0 + v];
          if constexpr (Row::kBias) bv = static_cast<const XV*>(a.b)[v0 + v];
        } else if constexpr (!PERSISTENT) {
          load_w(a.w, a.w_dtype, v0 + v, w_aligned, wj);
          add_offset(wj, a.offset);
          if constexpr (Row::kBias) load_b(v0 + v, bj);
        }
        OV out;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float wk = W_AS_X ? to_float(wv.v[k]) + a.offset : wj[k];
          float bk = 0.f;
          if constexpr (Row::kBias) bk = W_AS_X ? to_float(bv.v[k]) : bj[k];
          out.v[k] = from_float<O>(Row::y(element(xv[j], k), wk, bk, st));
        }
        yr[v] = out;
      }
    }
  };

  // The first rows go out before w is read: w (from L2 after the first
  // blocks) then arrives while x is in flight.
  XV cur[CHUNKS], next[CHUNKS];
  load(cur, first);
  // (after the first loads are issued: set up at the kernel's start, the
  // mbarriers and the cluster arrive cost LayerNorm's general-read rows up to
  // 176 bytes of spills, ptxas sm_90)
  if constexpr (CLUSTER > 1) pushed_sums_init(pushed);
  if constexpr (PERSISTENT) {
#pragma unroll
    for (int j = 0; j < CHUNKS; ++j) {
      int v = j * GROUP + lane;
      if (v < nvec) {
        load_w(a.w, a.w_dtype, v0 + v, w_aligned, w[j]);
        add_offset(w[j], a.offset);
      }
      if constexpr (Row::kBias)
        if (v < nvec) load_b(v0 + v, b[j]);
    }
  }

  if constexpr (STAGES == 1) {
    for (int64_t base = first; base < a.rows; base += stride) {
      if (base != first) load(cur, base);
      finish(cur, base);
    }
  } else {
    // Unrolled by two so that both buffers stay in registers.
    for (int64_t base = first; base < a.rows; base += 2 * stride) {
      load(next, base + stride);
      finish(cur, base);
      if (base + stride >= a.rows) break;
      load(cur, base + 2 * stride);
      finish(next, base + stride);
    }
  }
  // (no barrier before leaving: every push to this block is one it waited
  // for, and it reads its own slots only)
}

// The kernels: fwd_rows; with a register cap (at least MIN_BLOCKS blocks a
// SM: LayerNorm's rows, plans.h) fwd_rows_capped; a row a cluster (CLUSTER
// blocks, sm_90 on, capped alike) fwd_rows_cluster.
template <typename X, typename O, int BLOCK, int GROUP, int CHUNKS, int STAGES,
          bool PERSISTENT, typename Row = RmsRow, bool W_AS_X = false>
__global__ void __launch_bounds__(BLOCK) fwd_rows(const FwdArgs a) {
  fwd_rows_body<X, O, BLOCK, GROUP, CHUNKS, STAGES, PERSISTENT, Row, W_AS_X>(a);
}

template <typename X, typename O, int BLOCK, int GROUP, int CHUNKS, int STAGES,
          bool PERSISTENT, int MIN_BLOCKS, typename Row, bool W_AS_X = false>
__global__ void __launch_bounds__(BLOCK, MIN_BLOCKS) fwd_rows_capped(const FwdArgs a) {
  fwd_rows_body<X, O, BLOCK, GROUP, CHUNKS, STAGES, PERSISTENT, Row, W_AS_X>(a);
}

// (MIN_BLOCKS 0: no cap beyond one block a SM, which BLOCK alone sets)
template <typename X, typename O, int BLOCK, int GROUP, int CHUNKS, int STAGES,
          bool PERSISTENT, int CLUSTER, int MIN_BLOCKS, typename Row, bool W_AS_X>
__global__ void RMSNORM_CLUSTER_DIMS(CLUSTER)
    __launch_bounds__(BLOCK, MIN_BLOCKS > 0 ? MIN_BLOCKS : 1) fwd_rows_cluster(const FwdArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // no clusters before sm_90: the planners never launch it there
#else
  fwd_rows_body<X, O, BLOCK, GROUP, CHUNKS, STAGES, PERSISTENT, Row, W_AS_X, CLUSTER>(a);
#endif
}

// The host stub of plan row Table[I] (plans.h) with policy Row, as the
// table gives it; a caller may load w beside x (PERSISTENT, fwd_rows), drop
// the register cap (MIN_BLOCKS 0) or read w and b as x (W_AS_X).
template <typename X, typename O, typename Row, const auto& Table, std::size_t I,
          bool PERSISTENT = Table[I].persistent, int MIN_BLOCKS = Table[I].min_blocks,
          bool W_AS_X = false>
const void* fwd_kernel_for() {
  constexpr int kBlock = Table[I].block, kGroup = Table[I].group, kChunks = Table[I].chunks,
                kStages = Table[I].stages, kCluster = Table[I].cluster;
  if constexpr (kCluster > 1) {
    return reinterpret_cast<const void*>(
        &fwd_rows_cluster<X, O, kBlock, kGroup, kChunks, kStages, PERSISTENT, kCluster,
                          MIN_BLOCKS, Row, W_AS_X>);
  } else if constexpr (MIN_BLOCKS > 0) {
    return reinterpret_cast<const void*>(
        &fwd_rows_capped<X, O, kBlock, kGroup, kChunks, kStages, PERSISTENT, MIN_BLOCKS, Row,
                         W_AS_X>);
  } else {
    return reinterpret_cast<const void*>(
        &fwd_rows<X, O, kBlock, kGroup, kChunks, kStages, PERSISTENT, Row, W_AS_X>);
  }
}

// Table's kernels with policy Row, by row.
template <typename X, typename O, typename Row, const auto& Table>
const void* fwd_kernel_for(int row) {
  return kernel_by_row<std::size(Table)>(
      row, [](auto i) { return fwd_kernel_for<X, O, Row, Table, decltype(i)::value>(); });
}

// The kernel the planners run for row Table[I] of the norms' shared forward
// rows (plans::kForward, plans::kLayerForward) with policy Row:
// - the fused add (Row::kExtraIn) holds its residual beside x, so it runs
//   uncapped (under LayerNorm's cap it spilled 190-330 bytes a thread, ptxas,
//   sm_90, bf16) and has no kernel (null) on the cluster rows: sm_90 runs
//   plans::kForwardAddLong past N = 16384, other GPUs the looped kernel
//   (add_rms_norm) or the built-in (add_layer_norm);
// - W_FIRST: w loaded beside x (PERSISTENT's read) on rows of one block of at
//   most 512 threads (1024 threads' 64 registers cannot hold it: spills);
// - W_AS_X: w and b read in x's dtype on the rows that read them per step
//   (the persistent rows keep them in fp32 registers either way).
template <typename X, typename O, typename Row, const auto& Table, bool W_FIRST, bool W_AS_X,
          std::size_t I>
const void* planned_fwd_kernel() {
  constexpr const plans::RowPlan& c = Table[I];
  constexpr bool kAdd = Row::kExtraIn > 0;
  if constexpr (kAdd && c.cluster > 1) {
    return nullptr;
  } else {
    return fwd_kernel_for<X, O, Row, Table, I,
                          c.persistent || (W_FIRST && c.block <= 512 && c.cluster == 1),
                          kAdd ? 0 : c.min_blocks, W_AS_X && !c.persistent>();
  }
}
template <typename X, typename O, typename Row, const auto& Table, bool W_FIRST = false,
          bool W_AS_X = false>
const void* planned_fwd_kernel(int row) {
  return kernel_by_row<std::size(Table)>(row, [](auto i) {
    return planned_fwd_kernel<X, O, Row, Table, W_FIRST, W_AS_X, decltype(i)::value>();
  });
}

// The fused add's kernel of plans::kForwardAddLong's row (sm_90, past N =
// 16384), under the rows' cap (both policies; AddLayerRow's shift and bias
// spill 4 bytes in bf16, 72 in fp16 with the general read of w and b, none
// with W_AS_X: ptxas, sm_90).
template <typename X, typename O, typename Row, bool W_AS_X = false>
const void* add_long_kernel(int row) {
  using plans::kForwardAddLong;
  return kernel_by_row<std::size(kForwardAddLong)>(row, [](auto i) {
    constexpr const plans::RowPlan& c = kForwardAddLong[decltype(i)::value];
    return fwd_kernel_for<X, O, Row, kForwardAddLong, decltype(i)::value, c.persistent,
                          c.min_blocks, W_AS_X && !c.persistent>();
  });
}

// Any N, any alignment (VEC = 1 when needed): a block per row, a first pass
// for the sum of squares and a second that re-reads the row (from L1/L2: a
// resident block's row is at most a few hundred KiB) to write y. RMSNorm
// only; ADD (AddRmsRow's streams): the first pass forms and writes h, the
// second reads it back (the same thread's elements).
template <typename X, typename O, int BLOCK, int VEC, bool ADD = false>
__global__ void __launch_bounds__(BLOCK) fwd_looped(const FwdArgs a) {
  using XV = Vec<X, VEC>;
  using OV = Vec<O, VEC>;
  __shared__ float2 red[32];
  const int n = a.n;
  const int nvec = n / VEC;
  const bool w_aligned = aligned16(a.w);
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const XV* xr = reinterpret_cast<const XV*>(static_cast<const X*>(a.x) + row * n);
    const XV* er = reinterpret_cast<const XV*>(static_cast<const X*>(a.residual) + row * n);
    XV* hr = reinterpret_cast<XV*>(static_cast<X*>(a.h) + row * n);
    float2 sums = make_float2(0.f, 0.f);
    for (int v = threadIdx.x; v < nvec; v += BLOCK) {
      XV xv = xr[v];
      if constexpr (ADD) {
        const XV ev = er[v];
        xv = AddRmsRow::row_in(xv, ev);
        hr[v] = xv;
      }
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
      XV xv;
      if constexpr (ADD) {
        xv = hr[v];
      } else {
        xv = xr[v];
      }
      float wv[VEC];
      load_w(a.w, a.w_dtype, v, w_aligned, wv);
      add_offset(wv, a.offset);
      OV out;
#pragma unroll
      for (int k = 0; k < VEC; ++k) out.v[k] = from_float<O>(to_float(xv.v[k]) * rstd * wv[k]);
      yr[v] = out;
    }
  }
}

}  // namespace rmsnorm
