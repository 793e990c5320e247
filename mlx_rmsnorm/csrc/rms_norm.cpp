#include "rms_norm.h"

#include <numeric>

#include "mlx/fast.h"
#include "mlx/ops.h"
#include "op_util.h"
#include "reference.h"
#include "rms_norm_vjp.h"

namespace mlx_rmsnorm {

mx::array builtin_rms_norm(const mx::array& x, const std::optional<mx::array>& w,
                           float eps, float offset, mx::StreamOrDevice s) {
  if (offset == 0.f || !w) return mx::fast::rms_norm(x, w, eps, s);
  // offset + w in fp32, then y cast back to result_type(x, w).
  auto out_type = reference::result_type(x, w);
  auto scale = mx::add(mx::astype(*w, mx::float32, s), mx::array(offset, mx::float32), s);
  return mx::astype(mx::fast::rms_norm(x, scale, eps, s), out_type, s);
}

// Inputs go to the primitive as they are: no Contiguous node (eval_cpu and
// eval_gpu read strided inputs, or copy them, themselves) and a cast only
// where a dtype is one the kernels do not read.
mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& weight,
                   float eps, mx::StreamOrDevice s, float offset) {
  auto out_type = check_inputs("rms_norm", x, weight);
  check_offset("rms_norm", weight, offset);
  if (export_tracing()) return builtin_rms_norm(x, weight, eps, offset, s);
  auto stream = mx::to_stream(s);
  auto xk = kernel_input(x, out_type, stream);
  auto w = kernel_input(weight, out_type, stream);
  // No elements: zeros, no kernel launch and no reduction (op_util.h).
  // float64: MLX ops in float64 (reference.h); the kernels read 16/32-bit
  // floats.
  if (x.size() == 0) return no_elements({reference::forward(xk, w, eps, stream, offset)}, stream)[0];
  if (out_type == mx::float64) return reference::forward(xk, w, eps, stream, offset);
  std::vector<mx::array> inputs = {xk};
  if (w) inputs.push_back(*w);
  NormParams p{.eps = eps, .offset = offset, .has_weight = w.has_value()};
  return NormPrimitive::make(std::make_shared<RMSNorm>(stream, p), std::move(inputs),
                             {out_type})[0];
}

std::vector<mx::array> RMSNorm::reference(const std::vector<mx::array>& in) {
  return {reference::forward(in[0], weight(in), eps(), stream(), offset())};
}

std::vector<mx::array> RMSNorm::vjp(const std::vector<mx::array>& primals,
                                    const std::vector<mx::array>& cotangents,
                                    const std::vector<int>& argnums,
                                    const std::vector<mx::array>&) {
  // The primals passed the op's checks already: build the backward node
  // directly, with gw only when the weight's gradient is asked for (frozen
  // norms, LoRA).
  auto w = weight(primals);
  auto g = cast(cotangents[0], reference::result_type(primals[0], w), stream());
  auto grads = detail::make_vjp(primals[0], w, g, eps(), Algorithm::Auto,
                                wanted(argnums, has_weight() ? 1 : -1), stream(), offset());
  std::vector<mx::array> out;
  out.reserve(argnums.size());
  for (int i : argnums) out.push_back(grads[i]);
  return out;
}

// The weight carries the batch (x too, or not): batch axes in front, the
// weight broadcast over x's rows as (B, 1, ..., 1, N), and the op-level
// formula on the broadcast arrays. Not mx::vmap of that formula: a graph
// vmapped that way failed mx.compile(..., shapeless=True) on a new row
// count ("[broadcast_shapes] Shapes (3,7,1) and (1,4,1)"), while these
// ops (expand_dims, no reshape to fixed sizes) infer every shape.
std::pair<std::vector<mx::array>, std::vector<int>> RMSNorm::vmap_reference(
    const std::vector<mx::array>& inputs, const std::vector<int>& axes) {
  auto s = stream();
  auto x = axes[0] >= 0 ? mx::moveaxis(inputs[0], axes[0], 0, s)
                        : mx::expand_dims(inputs[0], 0, s);
  auto wb = mx::moveaxis(inputs[1], axes[1], 0, s);
  std::vector<int> row_axes(x.ndim() - 2);
  std::iota(row_axes.begin(), row_axes.end(), 1);
  if (!row_axes.empty()) wb = mx::expand_dims(wb, row_axes, s);
  return {{reference::forward(x, wb, eps(), s, offset())}, {0}};
}

}  // namespace mlx_rmsnorm
