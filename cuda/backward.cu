// Backward planner: picks the kernels from the family's plans::kBackward* table and sizes grids
// and scratch. Kernel bodies live in backward.cuh and colsum.cuh.
#include <type_traits>

#include "backward.cuh"
#include "colsum.cuh"
#include "dispatch.cuh"
#include "plans.h"

namespace rmsnorm {
namespace {

using detail::ceil_div;
using detail::make_call;

// The family's table (plans.h): families 80 and 75 share one.
template <typename X, typename G>
std::pair<const plans::RowPlan*, const void*> persistent_row(int family, int nvec,
                                                             bool add) {
  // ADD: the fused residual add's backward (BwdArgs::gh set: the AddRmsRow
  // policy of the same walk) on the same rows (plans.h).
  if (add) {
    return family >= 90 ? persistent_row_of<X, G, AddRmsRow, plans::kBackwardSm90>(nvec)
                        : persistent_row_of<X, G, AddRmsRow, plans::kBackwardSm80>(nvec);
  }
  return family >= 90 ? persistent_row_of<X, G, RmsRow, plans::kBackwardSm90>(nvec)
                      : persistent_row_of<X, G, RmsRow, plans::kBackwardSm80>(nvec);
}

KernelCall final_colsum(int n) { return colsum_call<float, true>(n, "colsum_f32"); }

// Persistent plan; false when the row does not fit (then Split is used).
template <typename X, typename G>
bool plan_persistent(const BwdArgs& a, int vec, Plan& p) {
  constexpr int full = 16 / sizeof(X);
  const int nvec = a.n / full;
  if (vec != full) return false;
  const detail::Target& target = detail::target();
  const bool add = a.gh != nullptr;
  const auto [cfg, fn] = persistent_row<X, G>(target.family, nvec, add);
  if (cfg == nullptr) return false;
  const int rows_per_step = cfg->block / cfg->group;
  // The fused add stages gh (x-sized) beside g: one more x-width of operand.
  const std::size_t smem = plans::persistent_smem(
      *cfg, nvec, static_cast<int>(sizeof(G) / sizeof(X)) + (add ? 1 : 0));
  // Units (blocks, or clusters of cfg->cluster blocks) resident on the whole
  // GPU; 0 where the row's stages do not fit this GPU's shared memory: split.
  const int resident = detail::units_resident(fn, cfg->block, smem, cfg->cluster);
  if (resident == 0) return false;

  // A unit's rows depend on the row alone (a cluster's slices on N), never
  // on the grid: a row's gx has the same bits in any batch.
  const int64_t units = std::min<int64_t>(resident, ceil_div(a.rows, rows_per_step));
  p.algorithm = Algorithm::Persistent;
  if (units > 0)
    p.calls.push_back(make_call(fn, dim3(units * cfg->cluster), dim3(cfg->block), smem,
                                cfg->cluster > 1 ? "bwd_persistent_cluster" : "bwd_persistent",
                                cfg->cluster));
  // Without a wanted gw (no weight, or a frozen one) neither partials nor
  // their column sum: one kernel.
  if (a.gw != nullptr) {
    p.partial_rows = static_cast<int>(units);
    p.partials_offset = 0;
    p.scratch_bytes = detail::align_up(sizeof(float) * units * a.n);
    p.calls.push_back(final_colsum(a.n));
  }
  return true;
}

template <typename X, typename G, int VEC>
void plan_split(const BwdArgs& a, Plan& p) {
  const int nvec = a.n / VEC;
  const int sms = detail::sm_count();
  const int64_t tiles = ceil_div(nvec, 32);
  const int64_t splits =
      std::clamp<int64_t>(ceil_div(int64_t(sms) * plans::kSplitBlocksPerSM, tiles), 1,
                          std::max<int64_t>(1, ceil_div(a.rows, 8)));
  p.algorithm = Algorithm::Split;
  p.row_stats_offset = 0;
  p.partials_offset = detail::align_up(sizeof(float) * 2 * a.rows);
  p.partial_rows = a.rows > 0 ? static_cast<int>(splits) : 0;
  p.scratch_bytes =
      p.partials_offset + detail::align_up(sizeof(float) * p.partial_rows * a.n);
  if (a.rows > 0) {
    const void* stats = reinterpret_cast<const void*>(
        &bwd_row_stats<X, G, plans::kSplitStatsBlock, VEC>);
    const int occ = detail::blocks_per_sm(stats, plans::kSplitStatsBlock, 0);
    const int64_t grid = std::min<int64_t>(a.rows, int64_t(sms) * std::max(occ, 1));
    p.calls.push_back(make_call(stats, dim3(grid), dim3(plans::kSplitStatsBlock), 0,
                                "bwd_row_stats"));
    p.calls.push_back(make_call(
        reinterpret_cast<const void*>(&bwd_split_cols<X, G, VEC>),
        dim3(tiles, splits), dim3(32, 8), 0, "bwd_split_cols"));
    p.gx_call = 1;
  }
  if (a.gw != nullptr) p.calls.push_back(final_colsum(a.n));
}

template <typename X, typename G, int VEC>
void plan_naive(const BwdArgs& a, Plan& p) {
  p.algorithm = Algorithm::Naive;
  const int sms = detail::sm_count();
  if (a.rows > 0) {
    const void* rows = reinterpret_cast<const void*>(
        &bwd_naive_rows<X, G, plans::kNaiveBlock, VEC>);
    const int64_t grid = std::min<int64_t>(a.rows, int64_t(sms) * 64);
    p.calls.push_back(make_call(rows, dim3(grid), dim3(plans::kNaiveBlock), 0,
                                "bwd_naive_rows"));
  }
  if (a.gw == nullptr) return;
  const int splits =
      static_cast<int>(std::clamp<int64_t>(a.rows, 1, plans::kNaiveSplits));
  p.naive_offset = 0;
  p.partials_offset = detail::align_up(sizeof(X) * a.rows * a.n);
  p.partial_rows = splits;
  p.scratch_bytes =
      p.partials_offset + detail::align_up(sizeof(float) * splits * a.n);
  p.calls.push_back(colsum_call<X, false>(a.n, "colsum_rows", splits));
  p.calls.push_back(final_colsum(a.n));
}

}  // namespace

Plan plan_backward(const BwdArgs& a, Algorithm algorithm) {
  Plan p;
  if (a.n == 0) return p;  // empty rows: nothing to read or write
  const int vec = vector_width(a.x_dtype, a.n, {a.x, a.g, a.gx, a.gh});
  if (a.gh != nullptr && algorithm == Algorithm::Naive)
    throw std::invalid_argument("rmsnorm: the fused add's backward has no naive plan");
  detail::with_types(a.x_dtype, a.g_dtype, [&](auto tx, auto tg) {
    using X = typename decltype(tx)::type;
    using G = typename decltype(tg)::type;
    constexpr int full = 16 / sizeof(X);
    auto by_width = [&](auto planner_full, auto planner_scalar) {
      if (vec == full)
        planner_full();
      else
        planner_scalar();
    };
    switch (algorithm) {
      case Algorithm::Naive:
        by_width([&] { plan_naive<X, G, full>(a, p); },
                 [&] { plan_naive<X, G, 1>(a, p); });
        break;
      case Algorithm::Split:
        by_width([&] { plan_split<X, G, full>(a, p); },
                 [&] { plan_split<X, G, 1>(a, p); });
        break;
      default:  // Auto and Persistent: persistent wherever the row fits
        if (!plan_persistent<X, G>(a, vec, p))
          by_width([&] { plan_split<X, G, full>(a, p); },
                   [&] { plan_split<X, G, 1>(a, p); });
    }
  });
  return p;
}

}  // namespace rmsnorm
