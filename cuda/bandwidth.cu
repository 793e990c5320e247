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
    p.calls.push_back(detail::stream_call(reinterpret_cast<const void*>(&copy_ceiling<T>),
                                          a.count, sizeof(T), "copy_ceiling"));
  });
  return p;
}

}  // namespace rmsnorm
