// LayerNorm planners: fwd_rows and the persistent walk with LayerRow
// (row_math.cuh), rows from plans.h's kLayer* tables (past one SM, a row a
// thread-block cluster on sm_90), then one column sum of the gw and gb
// partials. No fallback kernels of our own: rows no table covers go to
// mx.fast.layer_norm, decided by the op before the graph is built
// (layer_norm_planned).
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>

#include "backward.cuh"
#include "colsum.cuh"
#include "dispatch.cuh"
#include "forward.cuh"
#include "plans.h"

namespace rmsnorm {
namespace {

using detail::ceil_div;
using detail::make_call;
using plans::kLayerForward;

// Row: LayerRow, or AddLayerRow for the fused residual add (FwdArgs::residual
// set), on the same table rows up to N = 16384 and past them, on sm_90,
// plans::kForwardAddLong (as RMSNorm's; planned_fwd_kernel, forward.cuh).
// W_AS_X: w and b read in x's dtype (fwd_rows_body).
template <typename X, typename O, typename Row, bool W_AS_X>
const void* forward_kernel(int row) {
  return planned_fwd_kernel<X, O, Row, kLayerForward, false, W_AS_X>(row);
}

// How the forward reads w and b (fwd_rows_body's W_AS_X): widened to fp32 as
// they arrive (general: any dtypes, either absent), or read as x-typed
// vectors: both (w and b in x's dtype), or w alone for a LayerNorm without
// bias (WithoutBias: no branch for b, whose registers such rows lost).
enum class WeightRead { kGeneral, kAsX, kAsXNoBias };

// The forward's plan row and kernel for rows of n, or nulls where LayerNorm
// has none: past the table, and cluster rows where the GPU has no clusters or
// none fits.
template <typename X, typename O>
std::pair<const plans::RowPlan*, const void*> forward_row(int n, bool add, WeightRead read) {
  constexpr int full = 16 / sizeof(X);
  const int row = n % full == 0 ? plans::row_for(kLayerForward, n / full) : -1;
  if (row < 0) return {nullptr, nullptr};
  const bool clusters = detail::target().family >= 90;
  const int add_long = add && clusters ? plans::add_long_row(n / full) : -1;
  const plans::RowPlan& cfg =
      add_long >= 0 ? plans::kForwardAddLong[add_long] : kLayerForward[row];
  auto kernel = [&](auto as_x, auto layer_row) {
    constexpr bool W_AS_X = decltype(as_x)::value;
    using Row = decltype(layer_row);
    using AddRow = WithResidualAdd<Row>;
    return add_long >= 0 ? add_long_kernel<X, O, AddRow, W_AS_X>(add_long)
           : add         ? forward_kernel<X, O, AddRow, W_AS_X>(row)
                         : forward_kernel<X, O, Row, W_AS_X>(row);
  };
  const void* fn = read == WeightRead::kAsXNoBias
                       ? kernel(std::true_type{}, WithoutBias<LayerRow>{})
                   : read == WeightRead::kAsX ? kernel(std::true_type{}, LayerRow{})
                                              : kernel(std::false_type{}, LayerRow{});
  if (fn == nullptr ||
      (cfg.cluster > 1 && (!clusters || detail::clusters_resident(fn, cfg.block, 0) == 0)))
    return {nullptr, nullptr};
  return {&cfg, fn};
}

// The read of w and b that the forward's arguments allow: as x where w (and
// b, when given) is in x's dtype at a 16-byte aligned base (vector_width's
// check, for rows of whole vectors).
WeightRead weight_read(const FwdArgs& a) {
  if (a.w == nullptr || a.w_dtype != a.x_dtype) return WeightRead::kGeneral;
  if (a.b == nullptr)
    return vector_width(a.x_dtype, a.n, {a.w}) != 1 ? WeightRead::kAsXNoBias
                                                     : WeightRead::kGeneral;
  return a.b_dtype == a.x_dtype && vector_width(a.x_dtype, a.n, {a.w, a.b}) != 1
             ? WeightRead::kAsX
             : WeightRead::kGeneral;
}

// The persistent kernel, its dynamic shared memory and the units (blocks,
// or clusters of cfg->cluster blocks) the whole GPU holds; none when 0.
struct BackwardChoice {
  const plans::RowPlan* cfg = nullptr;
  const void* fn = nullptr;
  std::size_t smem = 0;
  int units = 0;
};

// ADD: the fused residual add's backward (AddLayerRow: g_h staged beside x
// and g, one more x-width of operand a stage), on the same rows up to one
// SM's row and on rows of its own past it (sm_90).
template <typename X, typename G, bool ADD>
BackwardChoice choose_backward(int n) {
  using Row = std::conditional_t<ADD, AddLayerRow, LayerRow>;
  using RowWRegs = WeightInRegisters<Row>;
  constexpr int full = 16 / sizeof(X);
  BackwardChoice c;
  if (n % full != 0) return c;
  const int nvec = n / full;
  const bool sm90 = detail::target().family >= 90;
  const int g_per_x = static_cast<int>(sizeof(G) / sizeof(X)) + (ADD ? 1 : 0);
  auto fit = [&](auto row, bool w_shared) {
    std::tie(c.cfg, c.fn) = row;
    if (c.cfg == nullptr) return false;
    const int slice = static_cast<int>(detail::ceil_div(nvec, c.cfg->cluster));
    c.smem = plans::persistent_smem(*c.cfg, nvec, g_per_x) +
             (w_shared ? sizeof(float) * full * slice : 0);  // the slice's fp32 weight
    c.units = detail::units_resident(c.fn, c.cfg->block, c.smem, c.cfg->cluster);
    return c.units > 0;
  };
  static_assert(Row::kWShared && !RowWRegs::kWShared);
  // The fused add has sm_90 rows of its own past one SM (plans.h).
  auto sm90_row = [&] {
    if constexpr (ADD)
      return persistent_row_of<X, G, Row, plans::kAddLayerBackwardSm90>(nvec);
    else
      return persistent_row_of<X, G, Row, plans::kLayerBackwardSm90>(nvec);
  };
  if (fit(sm90 ? sm90_row() : persistent_row_of<X, G, Row, plans::kLayerBackwardSm80>(nvec),
          true))
    return c;
  fit(sm90 ? persistent_row_of<X, G, RowWRegs, plans::kLayerBackwardWRegsSm90>(nvec)
           : persistent_row_of<X, G, RowWRegs, plans::kLayerBackwardWRegsSm80>(nvec),
      false);
  return c;
}

[[noreturn]] void no_plan(const char* what, int n) {
  throw std::invalid_argument(std::string("[mlx_rmsnorm] no LayerNorm ") + what +
                              " plan for rows of " + std::to_string(n) +
                              " (layer_norm_planned says which have one)");
}

}  // namespace

bool layer_norm_planned(DType x_dtype, DType g_dtype, int n, bool add) {
  if (n <= 0) return false;
  bool ok = false;
  detail::with_types(x_dtype, g_dtype, [&](auto tx, auto tg) {
    using X = typename decltype(tx)::type;
    using G = typename decltype(tg)::type;
    ok = forward_row<X, G>(n, add, WeightRead::kGeneral).first != nullptr &&
         (add ? choose_backward<X, G, true>(n) : choose_backward<X, G, false>(n)).units > 0;
  });
  return ok;
}

Plan plan_layer_forward(const FwdArgs& a) {
  Plan p;
  if (a.n == 0 || a.rows == 0) return p;
  const bool add = a.residual != nullptr;
  if (add && a.h == nullptr)
    throw std::invalid_argument("[mlx_rmsnorm] add_layer_norm's forward needs FwdArgs::h");
  const int vec = vector_width(a.x_dtype, a.n, {a.x, a.y, a.residual, a.h});
  detail::with_types(a.x_dtype, a.y_dtype, [&](auto tx, auto to) {
    using X = typename decltype(tx)::type;
    using O = typename decltype(to)::type;
    const auto [cfg, fn] = forward_row<X, O>(a.n, add, weight_read(a));
    if (vec != 16 / static_cast<int>(sizeof(X)) || cfg == nullptr) no_plan("forward", a.n);
    if (cfg->cluster > 1) {
      // A row a cluster: a block per slice, a cluster per row.
      const int64_t grid =
          std::min<int64_t>(a.rows, std::numeric_limits<int32_t>::max() / cfg->cluster);
      p.calls.push_back(make_call(fn, dim3(grid * cfg->cluster), dim3(cfg->block), 0,
                                  "layer_fwd_rows_cluster", cfg->cluster));
      return;
    }
    int64_t grid = std::min<int64_t>(ceil_div(a.rows, cfg->block / cfg->group),
                                     std::numeric_limits<int32_t>::max());
    if (cfg->persistent) {
      const int occ = detail::blocks_per_sm(fn, cfg->block, 0);
      grid = std::min<int64_t>(grid, int64_t(detail::sm_count()) * std::max(occ, 1));
    }
    p.calls.push_back(make_call(fn, dim3(grid), dim3(cfg->block), 0, "layer_fwd_rows"));
  });
  return p;
}

Plan plan_layer_backward(const BwdArgs& a) {
  Plan p;
  if (a.n == 0) return p;
  const bool add = a.gh != nullptr;
  const int vec = vector_width(a.x_dtype, a.n, {a.x, a.g, a.gx, a.gh});
  detail::with_types(a.x_dtype, a.g_dtype, [&](auto tx, auto tg) {
    using X = typename decltype(tx)::type;
    using G = typename decltype(tg)::type;
    const BackwardChoice c =
        add ? choose_backward<X, G, true>(a.n) : choose_backward<X, G, false>(a.n);
    if (vec != 16 / static_cast<int>(sizeof(X)) || c.units == 0) no_plan("backward", a.n);
    const int rows_per_step = c.cfg->block / c.cfg->group;
    // Every unit leaves a partial row of gw and one of gb (2 n fp32, written
    // and read back): min_steps keeps each unit's walk at least that long.
    // (A unit's rows depend on the row alone, never on the grid: a row's gx
    // has the same bits in any batch.)
    const int64_t grid = std::min<int64_t>(
        c.units, std::max<int64_t>(std::min<int64_t>(a.rows, 1),
                                   ceil_div(a.rows, rows_per_step) / c.cfg->min_steps));
    p.algorithm = Algorithm::Persistent;
    if (grid > 0)
      p.calls.push_back(make_call(c.fn, dim3(grid * c.cfg->cluster), dim3(c.cfg->block), c.smem,
                                  c.cfg->cluster > 1 ? "layer_bwd_persistent_cluster"
                                                     : "layer_bwd_persistent",
                                  c.cfg->cluster));
    // Partials of gw, then of gb, units x n each; only for what is wanted.
    if (a.gw != nullptr || a.gb != nullptr) {
      p.partial_rows = static_cast<int>(grid);
      p.partials_offset = 0;
      p.scratch_bytes = detail::align_up(sizeof(float) * 2 * grid * a.n);
    }
    if (a.gw != nullptr && a.gb != nullptr) {
      p.calls.push_back(colsum_call<float, true, kBothParts>(a.n, "colsum_gw_gb"));
    } else if (a.gw != nullptr) {
      p.calls.push_back(colsum_call<float, true, 0>(a.n, "colsum_gw"));
    } else if (a.gb != nullptr) {
      p.calls.push_back(colsum_call<float, true, 1>(a.n, "colsum_gb"));
    }
    // A cluster row whose persistent grid holds two blocks a SM or more (the
    // 256-thread slices) takes every SM's room. A column sum left to run
    // beside the next call's walk, which reads only gx, holds room that some
    // of the walk's clusters then wait for, a second wave (H100, chained,
    // 4096x32768: such walks took 456-503 us, the others 288-290). So what
    // reads gx waits for the column sums too, their few us in series
    // (docs/NOTES.md). A grid of one block a SM (the 512 x 4 slices; RMSNorm's
    // walks the same) leaves the column sum its SMs and lost only that wait.
    if (c.cfg->cluster > 1 && int64_t(c.units) * c.cfg->cluster > detail::sm_count())
      p.gx_call = static_cast<int>(p.calls.size()) - 1;
  });
  return p;
}

}  // namespace rmsnorm
