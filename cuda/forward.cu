// Forward planner: a row-in-registers kernel from plans::kForward (past one
// block's registers, a row a thread-block cluster on sm_90), or the looped
// kernel for rows past the table, not 16-byte friendly, or longer than one
// block where the GPU has no clusters.
#include <limits>
#include <type_traits>

#include "dispatch.cuh"
#include "forward.cuh"
#include "plans.h"

namespace rmsnorm {
namespace {

using plans::kForward;
using plans::kForwardOneWave;

// The fused add (FwdArgs::residual set: AddRmsRow, the same kernel's policy)
// runs the same table rows up to N = 16384: its row lives in registers
// exactly as x does (h replaces x after the add), and the extra read and
// write only scale the traffic that the rows were sized for. Not separately
// tuned: docs/fused-add.md has its measurements on these rows. Past them
// sm_90 runs plans::kForwardAddLong (planned_fwd_kernel, forward.cuh).
// W_FIRST: w loaded beside x even where the table reads it after the
// reduction (one wave of rows, below).
template <typename X, typename O, bool ADD, bool W_FIRST = false>
const void* row_kernel(int row) {
  return planned_fwd_kernel<X, O, std::conditional_t<ADD, AddRmsRow, RmsRow>, kForward,
                            W_FIRST>(row);
}

template <typename X, typename O, int VEC, bool ADD>
void plan_looped(const FwdArgs& a, Plan& p) {
  const void* fn =
      reinterpret_cast<const void*>(&fwd_looped<X, O, plans::kLoopedBlock, VEC, ADD>);
  const int occ = detail::blocks_per_sm(fn, plans::kLoopedBlock, 0);
  const int64_t grid =
      std::min<int64_t>(a.rows, int64_t(detail::sm_count()) * std::max(occ, 1));
  p.calls.push_back(detail::make_call(fn, dim3(grid), dim3(plans::kLoopedBlock),
                                      0, "fwd_looped"));
}

}  // namespace

Plan plan_forward(const FwdArgs& a) {
  Plan p;
  if (a.n == 0 || a.rows == 0) return p;
  const int vec = vector_width(a.x_dtype, a.n, {a.x, a.y, a.residual, a.h});
  detail::with_types(a.x_dtype, a.y_dtype, [&](auto tx, auto to) {
    using X = typename decltype(tx)::type;
    using O = typename decltype(to)::type;
    constexpr int full = 16 / sizeof(X);
    const bool add = a.residual != nullptr;
    const int row = plans::row_for(kForward, a.n / full);
    auto looped = [&](auto v) {
      constexpr int kVec = decltype(v)::value;
      return add ? plan_looped<X, O, kVec, true>(a, p) : plan_looped<X, O, kVec, false>(a, p);
    };
    if (vec != full) return looped(std::integral_constant<int, 1>{});
    // A call of at most one wave of steps (decode: 1-64 rows) is one row's
    // latency long: the one-wave table's rows (plans.h), each a block no
    // more than one vector deep. The fused add takes them too (a decode
    // step's add + norm after attention): its residual is one more load
    // beside x, in flight at the same time.
    const int wave_row = plans::row_for(kForwardOneWave, a.n / full);
    if (wave_row >= 0) {
      const auto& cfg = kForwardOneWave[wave_row];
      const int64_t steps = detail::ceil_div(a.rows, cfg.block / cfg.group);
      if (steps <= detail::sm_count()) {
        const void* fn = add ? fwd_kernel_for<X, O, AddRmsRow, kForwardOneWave>(wave_row)
                             : fwd_kernel_for<X, O, RmsRow, kForwardOneWave>(wave_row);
        p.calls.push_back(detail::make_call(fn, dim3(steps), dim3(cfg.block), 0,
                                            "fwd_rows_one_wave"));
        return;
      }
    }
    if (row < 0) return looped(std::integral_constant<int, full>{});
    // The fused add's own rows where its x and residual outgrow kForward's
    // rows' registers (plans::kForwardAddLong), on GPUs with clusters.
    const bool clusters = detail::target().family >= 90;
    const int add_long = add && clusters ? plans::add_long_row(a.n / full) : -1;
    const auto& cfg = add_long >= 0 ? plans::kForwardAddLong[add_long] : kForward[row];
    if (cfg.cluster > 1) {
      // A row a cluster (sm_90 on): a block per slice, a cluster per row.
      // The fused add has no kernel of kForward's cluster rows: past
      // kForwardAddLong (or without clusters) it takes the looped kernel.
      const void* fn = add_long >= 0 ? add_long_kernel<X, O, AddRmsRow>(add_long)
                       : add         ? nullptr
                                     : row_kernel<X, O, false>(row);
      if (fn == nullptr || !clusters || detail::clusters_resident(fn, cfg.block, 0) == 0)
        return looped(std::integral_constant<int, full>{});
      const int64_t grid =
          std::min<int64_t>(a.rows, std::numeric_limits<int32_t>::max() / cfg.cluster);
      p.calls.push_back(detail::make_call(fn, dim3(grid * cfg.cluster), dim3(cfg.block), 0,
                                          "fwd_rows_cluster", cfg.cluster));
      return;
    }
    const int rows_per_step = cfg.block / cfg.group;
    const int64_t steps = detail::ceil_div(a.rows, rows_per_step);
    // Past the one-wave table, one wave still reads w beside x: reading it
    // after the reduction makes a lone row two DRAM round trips (ncu, H200,
    // 1 x 4096 bf16: 4.5-5.6 us against the built-in's 4.0-4.8). Many rows
    // hide that latency behind other blocks' loads, and there the table's
    // low-register kernel wins.
    const bool one_wave = steps <= detail::sm_count();
    const void* fn = add        ? row_kernel<X, O, true>(row)
                     : one_wave ? row_kernel<X, O, false, true>(row)
                                : row_kernel<X, O, false>(row);
    // (the kernel strides over rows, so any grid covers them all)
    int64_t grid = std::min<int64_t>(steps, std::numeric_limits<int32_t>::max());
    if (cfg.persistent) {
      const int occ = detail::blocks_per_sm(fn, cfg.block, 0);
      grid = std::min<int64_t>(grid, int64_t(detail::sm_count()) * std::max(occ, 1));
    }
    p.calls.push_back(
        detail::make_call(fn, dim3(grid), dim3(cfg.block), 0, "fwd_rows"));
  });
  return p;
}

}  // namespace rmsnorm
