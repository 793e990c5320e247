// Planner of the copy-bandwidth ceiling kernel (bandwidth.cuh).
#include <stdexcept>

#include "bandwidth.cuh"
#include "dispatch.cuh"

namespace rmsnorm {

Plan plan_copy(const CopyArgs& a) {
  Plan p;
  if (a.count == 0) return p;
  if (vector_width(a.dtype, 16, {a.x, a.g, a.out}) == 1)
    throw std::invalid_argument("rmsnorm: the copy ceiling needs 16-byte aligned buffers");
  detail::with_types(a.dtype, a.dtype, [&](auto tx, auto) {
    using T = typename decltype(tx)::type;
    const void* fn = reinterpret_cast<const void*>(&copy_ceiling<T>);
    constexpr int block = 256;
    const int occ = detail::blocks_per_sm(fn, block, 0);
    const int64_t vectors = detail::ceil_div(a.count, 16 / sizeof(T));
    const int64_t grid = std::max<int64_t>(
        1, std::min<int64_t>(detail::ceil_div(vectors, block),
                             int64_t(detail::sm_count()) * std::max(occ, 1)));
    p.calls.push_back(detail::make_call(fn, dim3(grid), dim3(block), 0, "copy_ceiling"));
  });
  return p;
}

}  // namespace rmsnorm
