// Row-math policies of the shared row walks: fwd_rows (forward.cuh) and
// persistent_walk (backward.cuh) stage, reduce and write rows the same way
// for every norm; a policy supplies only what differs between norms.
//
// Interface of a policy (all static, all __device__ unless said):
//
//   Forward
//     kFwdPasses          reductions over the row in registers before y (1 or 2)
//     FwdStats            the row statistics they produce
//     fwd_add<P>(s, x, st)    adds one element's terms to pass P's float2 sums
//                             (st holds what passes < P finished)
//     fwd_finish<P>(s, n, eps, st)   pass P's group-summed sums -> st
//     kBias               y adds a bias vector (FwdArgs::b; absent: nullptr)
//     y(x, w, b, st)      one output element (w = 1, b = 0 when absent)
//
//   Backward
//     kPasses             reductions over the staged row before gx (1 or 2)
//     Stats, add<P>, finish<P>   as above, with (x, g, w) per element
//     gx(x, g, w, st)     one gradient element
//     kPartials           fp32 column partials per column (gw; LayerNorm: gw, gb)
//     partial(p, x, g, st)    the term one element adds to column partial p
//     wants(a, p)         (host args) whether partial p is wanted at all: an
//                         unwanted one is never stored nor summed
//
//   Sums                the type a pass reduces (float2; LayerRow: float4)
//   kShift              the walk sets st.shift (Stats and FwdStats) before
//                       the first pass: the mean of the row's first 16-byte
//                       vector, the same value in every thread of the row
//   kWShared            (backward) the fp32 weight lives in shared memory
//                       for the walk instead of in registers
//   kWReload            (backward, !kWShared) the walk re-reads the weight
//                       at each use and copies per thread instead of holding
//                       it in registers (WeightInRegisters on sm_12x only:
//                       arch::kWeightReload)
//
//   Streams (for ops that carry more than x and g / y)
//     kExtraIn, kExtraOut streamed inputs beside x (forward) or x and g
//                         (backward), and outputs beside y or gx. A fused
//                         residual add sets them to 1 (WithResidualAdd): forward
//                         reads FwdArgs::residual and writes FwdArgs::h beside
//                         y, the row value being row_in(x, residual) (a 16-byte
//                         vector of each); backward
//                         stages BwdArgs::gh beside x and g (a third operand
//                         of each stage) and writes gx_out(gx, g_h). The walks
//                         take kExtraIn == kExtraOut, 0 or 1.
//
// Every sum is over fp32 terms in a fixed order (group_sum, colsum): bitwise
// deterministic. A policy's formulas are the one place its math lives; the
// CPU path (eval_cpu.cpp) and reference.cpp write the same formulas.
#pragma once

#include "common.cuh"

namespace rmsnorm {

// RMSNorm: r = rsqrt(mean(x^2) + eps), y = x r w;
// gx = r (g w) - x (mean(g w x) r^3), gw = sum_rows g x r.
struct RmsRow {
  static constexpr int kExtraIn = 0, kExtraOut = 0;
  using Sums = float2;
  static constexpr bool kShift = false, kWShared = false, kWReload = false;

  // Forward: one pass, sum x^2 (the float2's second half rides along unused:
  // the block reduction is shared with the backward's two sums).
  static constexpr int kFwdPasses = 1;
  static constexpr bool kBias = false;
  struct FwdStats {
    float rstd;
  };
  template <int P>
  __device__ __forceinline__ static void fwd_add(float2& s, float x, const FwdStats&) {
    s.x += x * x;
  }
  template <int P>
  __device__ __forceinline__ static void fwd_finish(float2 s, int n, float eps,
                                                    FwdStats& st) {
    st.rstd = rsqrtf(s.x / n + eps);
  }
  __device__ __forceinline__ static float y(float x, float w, float, const FwdStats& st) {
    return x * st.rstd * w;
  }

  // Backward: one pass, (sum x^2, sum g w x).
  static constexpr int kPasses = 1;
  static constexpr int kPartials = 1;  // gw
  struct Stats {
    float rstd, c;  // c = mean(g w x) r^3
  };
  template <int P>
  __device__ __forceinline__ static void add(float2& s, float x, float g, float w,
                                             const Stats&) {
    s.x += x * x;
    s.y += g * w * x;
  }
  template <int P>
  __device__ __forceinline__ static void finish(float2 s, int n, float eps, Stats& st) {
    st.rstd = rsqrtf(s.x / n + eps);
    st.c = s.y / n * st.rstd * st.rstd * st.rstd;
  }
  __device__ __forceinline__ static float gx(float x, float g, float w, const Stats& st) {
    return st.rstd * w * g - x * st.c;
  }
  __device__ __forceinline__ static float partial(int, float x, float g, const Stats& st) {
    return g * x * st.rstd;
  }
  __device__ __forceinline__ static bool wants(const BwdArgs& a, int) {
    return a.gw != nullptr;
  }
};

// LayerNorm: mu = mean(x), r = rsqrt(mean((x - mu)^2) + eps),
// xh = (x - mu) r, y = xh w + b;
// gx = r (g w - mean(g w) - xh mean(g w xh)), gw = sum_rows g xh,
// gb = sum_rows g.
// LayerRow: one block reduction a row (one pass in each direction). The sums
// are taken about a shift K, the mean of the row's first 16-byte vector (the
// walk sets st.shift): with d = x - K,
//   mean = K + mean(d),  var = mean(d^2) - mean(d)^2,
//   mean(g w xh) = r (mean(g w d) - mean(d) mean(g w)).
// Without the shift (K = 0) the variance would lose its digits as
// sum x^2 - n mu^2 does for rows whose mean is large against their spread;
// with K taken from the row, mean(d)^2 is of the order of the variance for
// any row whose first elements are typical (rows of mean 1000 and spread 1:
// K is within a few spreads of the mean). Its worst case is bounded: the
// mean of VEC elements lies within sqrt(n / VEC) standard deviations of the
// row's mean, so mean(d)^2 <= (n / VEC) var and the cancellation costs at
// most log2(n / VEC) bits of fp32's 24 (11 at N = 16384 bf16, for a row
// whose first vector holds all of its spread). The backward's fp32 weight
// stays in shared memory (kWShared): its register array would be a third
// per-column array beside the gw and gb partials.
struct LayerRow {
  static constexpr int kExtraIn = 0, kExtraOut = 0;
  static constexpr bool kShift = true, kWShared = true, kWReload = false;

  static constexpr int kFwdPasses = 1;
  static constexpr bool kBias = true;
  struct FwdStats {
    float shift, mean, rstd;
  };
  template <int P>
  __device__ __forceinline__ static void fwd_add(float2& s, float x, const FwdStats& st) {
    const float d = x - st.shift;
    s.x += d;
    s.y += d * d;
  }
  template <int P>
  __device__ __forceinline__ static void fwd_finish(float2 s, int n, float eps,
                                                    FwdStats& st) {
    const float m1 = s.x / n;
    st.mean = st.shift + m1;
    st.rstd = rsqrtf(fmaxf(s.y / n - m1 * m1, 0.f) + eps);
  }
  __device__ __forceinline__ static float y(float x, float w, float b, const FwdStats& st) {
    return (x - st.mean) * st.rstd * w + b;
  }

  static constexpr int kPasses = 1;
  static constexpr int kPartials = 2;  // gw, gb
  using Sums = float4;                 // sum d, sum d^2, sum g w, sum g w d
  struct Stats {
    float shift, mean, mgw, rstd, c;  // c = mean(g w xh)
  };
  template <int P>
  __device__ __forceinline__ static void add(float4& s, float x, float g, float w,
                                             const Stats& st) {
    const float d = x - st.shift;
    const float gw = g * w;
    s.x += d;
    s.y += d * d;
    s.z += gw;
    s.w += gw * d;
  }
  template <int P>
  __device__ __forceinline__ static void finish(float4 s, int n, float eps, Stats& st) {
    const float m1 = s.x / n;
    st.mean = st.shift + m1;
    st.rstd = rsqrtf(fmaxf(s.y / n - m1 * m1, 0.f) + eps);
    st.mgw = s.z / n;
    st.c = (s.w / n - m1 * st.mgw) * st.rstd;
  }
  __device__ __forceinline__ static float gx(float x, float g, float w, const Stats& st) {
    const float xh = (x - st.mean) * st.rstd;
    return st.rstd * (g * w - st.mgw - xh * st.c);
  }
  __device__ __forceinline__ static float partial(int p, float x, float g, const Stats& st) {
    return p == 0 ? g * ((x - st.mean) * st.rstd) : g;
  }
  __device__ __forceinline__ static bool wants(const BwdArgs& a, int p) {
    return p == 0 ? a.gw != nullptr : a.gb != nullptr;
  }
};

// A norm of a fused residual add (add_rms_norm, add_layer_norm): Row's math
// on the row h = x + residual, with one extra stream each way.
//   Forward: reads the residual beside x; the row value is h, rounded to x's
//   dtype exactly as an unfused add stores it (row_in), and h is written
//   beside y (the walk writes the row value itself). A shift (LayerRow's) is
//   h's: the walks take it from the row value.
//   Backward: x is the forward's h; reads g_h (the cotangent of h, x's dtype)
//   beside x and g and adds it to the norm's gradient before the one rounding
//   (gx_out): gx = g_h + d(norm)/dh, the gradient of x and residual alike.
// The sums, partials and the scale offset + w are Row's.
template <typename Row>
struct WithResidualAdd : Row {
  static constexpr int kExtraIn = 1, kExtraOut = 1;

  template <typename V>
  __device__ __forceinline__ static V row_in(const V& x, const V& residual) {
    return add_round(x, residual);
  }
  __device__ __forceinline__ static float gx_out(float gx, float g_h) { return gx + g_h; }
};
using AddRmsRow = WithResidualAdd<RmsRow>;
using AddLayerRow = WithResidualAdd<LayerRow>;

// A LayerNorm policy with the weight in registers, as the RMSNorm walk keeps
// it: for rows whose stages leave no room for it in shared memory (plans.h).
template <typename Row>
struct WeightInRegisters : Row {
  static constexpr bool kWShared = false;
  static constexpr bool kWReload = arch::kWeightReload;
};
using LayerRowWRegs = WeightInRegisters<LayerRow>;

// A norm's forward without its bias (LayerNorm's bias=None): y adds 0 as
// Row's does for an absent b, but no b is read and no register holds one
// (fwd_rows_body), so the read of w as x needs no branch for b.
template <typename Row>
struct WithoutBias : Row {
  static constexpr bool kBias = false;
};

}  // namespace rmsnorm
