#include "add_rms_norm.h"

#include "add_rms_norm_vjp.h"
#include "mlx/ops.h"
#include "op_util.h"
#include "reference.h"
#include "rms_norm.h"

namespace mlx_rmsnorm {

namespace {

// {y, h} from MLX ops: the reference, and the float64 path.
std::vector<mx::array> reference_forward(const mx::array& x, const mx::array& r,
                                         const std::optional<mx::array>& w,
                                         float eps, float offset, mx::Stream s) {
  auto h = mx::add(x, r, s);
  return {reference::forward(h, w, eps, s, offset), h};
}

}  // namespace

std::vector<mx::array> add_rms_norm(const mx::array& x, const mx::array& residual,
                                    const std::optional<mx::array>& weight,
                                    float eps, float offset, mx::StreamOrDevice s) {
  auto [shape, h_type, out_type] = check_add_inputs("add_rms_norm", x, residual, weight);
  check_offset("add_rms_norm", weight, offset);
  if (export_tracing()) {
    auto h = mx::add(x, residual, s);
    return {builtin_rms_norm(h, weight, eps, offset, s), h};
  }
  auto stream = mx::to_stream(s);
  // An h the kernels do not store (integer or bool inputs, as rms_norm
  // accepts them, and float64): the composition itself, MLX's add and our
  // rms_norm (which casts h, or runs float64 in float64).
  if (!is_kernel_dtype(h_type)) {
    auto h = mx::add(x, residual, stream);
    return {rms_norm(h, weight, eps, stream, offset), h};
  }
  // x and residual in h's dtype and shape (expand_to): on the GPU an
  // expanded one is copied into a row-contiguous temporary, one more write
  // and read of h's size, so the fused op then moves about what the unfused
  // add + rms_norm moves.
  auto xh = expand_to(x, shape, h_type, stream), rh = expand_to(residual, shape, h_type, stream);
  auto w = kernel_input(weight, out_type, stream);
  // No elements: zeros, as in rms_norm. float64 weight: MLX ops in float64
  // (reference.h); the kernels read 16/32-bit floats.
  if (xh.size() == 0) return no_elements(reference_forward(xh, rh, w, eps, offset, stream), stream);
  if (out_type == mx::float64) return reference_forward(xh, rh, w, eps, offset, stream);
  std::vector<mx::array> inputs = {xh, rh};
  if (w) inputs.push_back(*w);
  NormParams p{.eps = eps, .offset = offset, .has_weight = w.has_value()};
  return NormPrimitive::make(std::make_shared<AddRMSNorm>(stream, p), std::move(inputs),
                             {out_type, h_type});
}

std::vector<mx::array> AddRMSNorm::reference(const std::vector<mx::array>& in) {
  return reference_forward(in[0], in[1], weight(in), eps(), offset(), stream());
}

std::vector<mx::array> AddRMSNorm::vjp(const std::vector<mx::array>& primals,
                                       const std::vector<mx::array>& cotangents,
                                       const std::vector<int>& argnums,
                                       const std::vector<mx::array>& outputs) {
  // The backward reads the forward's h (outputs[1]) rather than x and
  // residual; both inputs get the same gradient.
  const auto& h = outputs[1];
  auto g_y = cast(cotangents[0], outputs[0].dtype(), stream());
  auto g_h = cast(cotangents[1], h.dtype(), stream());
  auto grads = detail::make_add_vjp(h, weight(primals), g_y, g_h, eps(), offset(),
                                    wanted(argnums, has_weight() ? 2 : -1), stream());
  std::vector<mx::array> out;
  out.reserve(argnums.size());
  for (int i : argnums) out.push_back(i == 2 ? grads[1] : grads[0]);
  return out;
}

}  // namespace mlx_rmsnorm
