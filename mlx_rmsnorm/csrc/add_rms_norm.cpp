#include "add_rms_norm.h"

#include <algorithm>
#include <stdexcept>

#include "add_rms_norm_vjp.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "reference.h"
#include "rms_norm.h"

namespace mlx_rmsnorm {

namespace {

std::string shape_str(const mx::Shape& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

// {y, h} from MLX ops: what jvp and vmap differentiate, and the float64 path.
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
  auto fail = [](const std::string& msg) {
    throw std::invalid_argument("[add_rms_norm] " + msg);
  };
  // h = x + residual takes what MLX's add broadcasts; the checks of rms_norm
  // then apply to h, the array that is normalized.
  mx::Shape shape;
  try {
    shape = mx::broadcast_shapes(x.shape(), residual.shape());
  } catch (const std::invalid_argument&) {
    fail("x of shape " + shape_str(x.shape()) + " and residual of shape " +
         shape_str(residual.shape()) + " do not broadcast to one shape.");
  }
  if (shape.empty()) {
    fail("x + residual must have at least 1 dimension but x and residual are scalars.");
  }
  if (weight && (weight->ndim() != 1 || weight->shape(0) != shape.back())) {
    fail("weight must be 1-D of the size of the last dimension of x + residual (" +
         std::to_string(shape.back()) + ") but has shape " + shape_str(weight->shape()) + ".");
  }
  check_offset("add_rms_norm", weight, offset);
  auto h_type = mx::promote_types(x.dtype(), residual.dtype());
  auto out_type = weight ? mx::promote_types(h_type, weight->dtype()) : h_type;
  if (!mx::issubdtype(out_type, mx::floating)) {
    fail("Received unsupported type " + dtype_str(out_type) + " (the result type of x " +
         dtype_str(x.dtype()) + " + residual " + dtype_str(residual.dtype()) +
         (weight ? " and weight " + dtype_str(weight->dtype()) : "") +
         "); expected a floating type.");
  }
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
  // x and residual are read in h's dtype (a mixed pair is cast first) and
  // h's shape: one that broadcasts is expanded first, a view that the CPU
  // path reads in place and the GPU path copies into a row-contiguous
  // temporary (one more write and read of h's size: the fused op then moves
  // about what the unfused add + rms_norm moves). The gradient of the
  // expanded input is summed back by broadcast_to's own vjp.
  auto expand = [&](const mx::array& a) {
    auto c = a.dtype() == h_type ? a : mx::astype(a, h_type, stream);
    return c.shape() == shape ? c : mx::broadcast_to(c, shape, stream);
  };
  auto xh = expand(x);
  auto rh = expand(residual);
  std::optional<mx::array> w;
  if (weight) w = kernel_input(*weight, out_type, stream);
  // float64 weight: MLX ops in float64 (reference.h); the kernels read
  // 16/32-bit floats.
  // (and no elements: no kernel launch, as in rms_norm)
  check_not_empty_on_gpu("add_rms_norm", xh, stream);
  if (out_type == mx::float64 || xh.size() == 0) return reference_forward(xh, rh, w, eps, offset, stream);
  std::vector<mx::array> inputs = {xh, rh};
  if (w) inputs.push_back(*w);
  return mx::array::make_arrays(
      {shape, shape}, {out_type, h_type},
      std::make_shared<AddRMSNorm>(stream, eps, weight.has_value(), offset),
      std::move(inputs));
}

std::vector<mx::array> AddRMSNorm::vjp(const std::vector<mx::array>& primals,
                                       const std::vector<mx::array>& cotangents,
                                       const std::vector<int>& argnums,
                                       const std::vector<mx::array>& outputs) {
  // The backward reads the forward's h (outputs[1]) rather than x and
  // residual; both inputs get the same gradient.
  const auto& h = outputs[1];
  auto w = has_weight_ ? std::optional<mx::array>(primals[2]) : std::nullopt;
  bool need_gw = has_weight_ &&
                 std::find(argnums.begin(), argnums.end(), 2) != argnums.end();
  auto g_y = cotangents[0];
  if (g_y.dtype() != outputs[0].dtype()) g_y = mx::astype(g_y, outputs[0].dtype(), stream());
  auto g_h = cotangents[1];
  if (g_h.dtype() != h.dtype()) g_h = mx::astype(g_h, h.dtype(), stream());
  auto grads = detail::make_add_vjp(h, w, g_y, g_h, eps_, offset_, need_gw, stream());
  std::vector<mx::array> out;
  out.reserve(argnums.size());
  for (int i : argnums) out.push_back(i == 2 ? grads[1] : grads[0]);
  return out;
}

std::vector<mx::array> AddRMSNorm::jvp(const std::vector<mx::array>& primals,
                                       const std::vector<mx::array>& tangents,
                                       const std::vector<int>& argnums) {
  auto all_tangents = reference::full_tangents(primals, tangents, argnums, stream());
  float eps = eps_, offset = offset_;
  bool has_w = has_weight_;
  auto s = stream();
  auto f = [eps, offset, has_w, s](const std::vector<mx::array>& in) {
    return reference_forward(in[0], in[1], has_w ? std::optional(in[2]) : std::nullopt,
                             eps, offset, s);
  };
  return mx::jvp(f, primals, all_tangents).second;
}

std::pair<std::vector<mx::array>, std::vector<int>> AddRMSNorm::vmap(
    const std::vector<mx::array>& inputs, const std::vector<int>& axes) {
  auto s = stream();
  bool w_mapped = has_weight_ && axes[2] >= 0;
  if (!w_mapped) {
    // Only x and/or residual carry the batch: put it in front of both (an
    // unmapped one is broadcast) and run the fused op on the batch.
    int size = axes[0] >= 0 ? inputs[0].shape(axes[0]) : inputs[1].shape(axes[1]);
    auto front = [&](const mx::array& a, int axis) {
      if (axis >= 0) return mx::moveaxis(a, axis, 0, s);
      auto shape = a.shape();
      shape.insert(shape.begin(), size);
      return mx::broadcast_to(mx::expand_dims(a, 0, s), shape, s);
    };
    auto w = has_weight_ ? std::optional(inputs[2]) : std::nullopt;
    return {add_rms_norm(front(inputs[0], axes[0]), front(inputs[1], axes[1]), w,
                         eps_, offset_, s),
            {0, 0}};
  }
  float eps = eps_, offset = offset_;
  auto f = [eps, offset, s](const std::vector<mx::array>& in) {
    return reference_forward(in[0], in[1], in[2], eps, offset, s);
  };
  return {mx::vmap(f, axes, {0, 0})(inputs), {0, 0}};
}

bool AddRMSNorm::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const AddRMSNorm&>(other);
  return eps_ == o.eps_ && has_weight_ == o.has_weight_ && offset_ == o.offset_;
}

}  // namespace mlx_rmsnorm
