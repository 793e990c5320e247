// LayerNorm planners: fwd_rows and the persistent walk with LayerRow
// (row_math.cuh), rows from plans.h's kLayer* tables, then the column sums of
// the gw and gb partials. No fallback kernels of our own: rows no table
// covers go to mx.fast.layer_norm, decided by the op before the graph is
// built (layer_norm_planned).
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>

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

template <typename X, typename O, std::size_t... I>
const void* forward_kernel(int row, std::index_sequence<I...>) {
  static const void* const kernels[] = {reinterpret_cast<const void*>(
      &fwd_rows<X, O, kLayerForward[I].block, kLayerForward[I].group,
                kLayerForward[I].chunks, kLayerForward[I].stages,
                kLayerForward[I].persistent, LayerRow>)...};
  return kernels[row];
}

template <typename X, typename G, const auto& Table, std::size_t... I>
const void* backward_kernel(int row, std::index_sequence<I...>) {
  static_assert(((Table[I].cluster == 1) && ...), "no cluster rows through MLX");
  static const void* const kernels[] = {
      persistent_kernel_for<X, G, Table[I].block, Table[I].group, Table[I].chunks,
                            Table[I].stages, Table[I].bulk, 1, LayerRow>()...};
  return kernels[row];
}

// The backward's table row for rows of nvec vectors on `family`, and its
// kernel; nulls past the table.
template <typename X, typename G>
std::pair<const plans::RowPlan*, const void*> backward_row(int family, int nvec) {
  auto of = [&](const auto& table, auto kernel_of) {
    const int row = detail::table_row(table, nvec);
    return row < 0 ? std::pair<const plans::RowPlan*, const void*>{nullptr, nullptr}
                   : std::pair<const plans::RowPlan*, const void*>{&table[row],
                                                                   kernel_of(row)};
  };
  if (family >= 90) {
    return of(plans::kLayerBackwardSm90, [](int row) {
      return backward_kernel<X, G, plans::kLayerBackwardSm90>(
          row, std::make_index_sequence<std::size(plans::kLayerBackwardSm90)>{});
    });
  }
  return of(plans::kLayerBackwardSm80, [](int row) {
    return backward_kernel<X, G, plans::kLayerBackwardSm80>(
        row, std::make_index_sequence<std::size(plans::kLayerBackwardSm80)>{});
  });
}

// Final column sum of partial PART (0 gw, 1 gb), blocks as in backward.cu.
template <int PART>
KernelCall column_sum(int n, const char* name) {
  auto call = [&](auto cols) {
    constexpr int kCols = decltype(cols)::value;
    return make_call(reinterpret_cast<const void*>(&colsum<float, true, kCols, PART>),
                     dim3(ceil_div(n, kCols), 1), dim3(kCols, 1024 / kCols), 0, name);
  };
  return n < plans::kColsumNarrowBelow ? call(std::integral_constant<int, 8>{})
                                       : call(std::integral_constant<int, 32>{});
}

// The persistent kernel, its dynamic shared memory and resident blocks a SM
// for rows of n; occupancy 0 when there is none.
struct BackwardChoice {
  const plans::RowPlan* cfg = nullptr;
  const void* fn = nullptr;
  std::size_t smem = 0;
  int occupancy = 0;
};

template <typename X, typename G>
BackwardChoice choose_backward(int n) {
  constexpr int full = 16 / sizeof(X);
  BackwardChoice c;
  if (n % full != 0) return c;
  const int nvec = n / full;
  std::tie(c.cfg, c.fn) = backward_row<X, G>(detail::target().family, nvec);
  if (c.cfg == nullptr) return c;
  c.smem = plans::persistent_smem(*c.cfg, nvec, static_cast<int>(sizeof(G) / sizeof(X)));
  c.occupancy = detail::blocks_per_sm(c.fn, c.cfg->block, c.smem);
  return c;
}

[[noreturn]] void no_plan(const char* what, int n) {
  throw std::invalid_argument(std::string("[mlx_rmsnorm] no LayerNorm ") + what +
                              " plan for rows of " + std::to_string(n) +
                              " (layer_norm_planned says which have one)");
}

}  // namespace

bool layer_norm_planned(DType x_dtype, DType g_dtype, int n) {
  if (n <= 0) return false;
  bool ok = false;
  detail::with_types(x_dtype, g_dtype, [&](auto tx, auto tg) {
    using X = typename decltype(tx)::type;
    using G = typename decltype(tg)::type;
    constexpr int full = 16 / sizeof(X);
    ok = n % full == 0 && detail::table_row(kLayerForward, n / full) >= 0 &&
         choose_backward<X, G>(n).occupancy > 0;
  });
  return ok;
}

Plan plan_layer_forward(const FwdArgs& a) {
  Plan p;
  if (a.n == 0 || a.rows == 0) return p;
  const int vec = vector_width(a.x_dtype, a.n, {a.x, a.y});
  detail::with_types(a.x_dtype, a.y_dtype, [&](auto tx, auto to) {
    using X = typename decltype(tx)::type;
    using O = typename decltype(to)::type;
    constexpr int full = 16 / sizeof(X);
    const int row = detail::table_row(kLayerForward, a.n / full);
    if (vec != full || row < 0) no_plan("forward", a.n);
    const auto& cfg = kLayerForward[row];
    const void* fn =
        forward_kernel<X, O>(row, std::make_index_sequence<std::size(kLayerForward)>{});
    int64_t grid = std::min<int64_t>(ceil_div(a.rows, cfg.block / cfg.group),
                                     std::numeric_limits<int32_t>::max());
    if (cfg.persistent) {
      const int occ = detail::blocks_per_sm(fn, cfg.block, 0);
      grid = std::min<int64_t>(grid, int64_t(detail::sm_count()) * std::max(occ, 1));
    }
    p.calls.push_back(make_call(fn, dim3(grid), dim3(cfg.block), 0, "layer_fwd_rows"));
  });
  return p;
}

Plan plan_layer_backward(const BwdArgs& a) {
  Plan p;
  if (a.n == 0) return p;
  const int vec = vector_width(a.x_dtype, a.n, {a.x, a.g, a.gx});
  detail::with_types(a.x_dtype, a.g_dtype, [&](auto tx, auto tg) {
    using X = typename decltype(tx)::type;
    using G = typename decltype(tg)::type;
    const BackwardChoice c = choose_backward<X, G>(a.n);
    if (vec != 16 / static_cast<int>(sizeof(X)) || c.occupancy == 0)
      no_plan("backward", a.n);
    const int rows_per_step = c.cfg->block / c.cfg->group;
    const int64_t grid = std::min<int64_t>(int64_t(detail::sm_count()) * c.occupancy,
                                           ceil_div(a.rows, rows_per_step));
    p.algorithm = Algorithm::Persistent;
    if (grid > 0)
      p.calls.push_back(make_call(c.fn, dim3(grid), dim3(c.cfg->block), c.smem,
                                  "layer_bwd_persistent"));
    // Partials of gw, then of gb, units x n each; only for what is wanted.
    if (a.gw != nullptr || a.gb != nullptr) {
      p.partial_rows = static_cast<int>(grid);
      p.partials_offset = 0;
      p.scratch_bytes = detail::align_up(sizeof(float) * 2 * grid * a.n);
    }
    if (a.gw != nullptr) p.calls.push_back(column_sum<0>(a.n, "colsum_gw"));
    if (a.gb != nullptr) p.calls.push_back(column_sum<1>(a.n, "colsum_gb"));
  });
  return p;
}

}  // namespace rmsnorm
