#include "rms_norm.h"

#include <sstream>
#include <stdexcept>

#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "reference.h"
#include "rms_norm_vjp.h"

namespace mlx_rmsnorm {

namespace {

bool is_supported(mx::Dtype t) {
  return t == mx::float32 || t == mx::float16 || t == mx::bfloat16;
}

std::string dtype_str(mx::Dtype t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

}  // namespace

mx::Dtype check_inputs(const char* op, const mx::array& x,
                       const std::optional<mx::array>& weight) {
  auto fail = [op](const std::string& msg) {
    throw std::invalid_argument(std::string("[") + op + "] " + msg);
  };
  if (x.ndim() == 0) {
    fail("Input must have at least 1 dimension but got input with 0 "
         "dimensions.");
  }
  if (!is_supported(x.dtype())) {
    fail("Received unsupported type " + dtype_str(x.dtype()) +
         " for x; expected float32, float16 or bfloat16.");
  }
  if (!weight) return x.dtype();
  if (weight->ndim() != 1) {
    fail("weight must have 1 dimension but has " +
         std::to_string(weight->ndim()) + " dimensions.");
  }
  if (weight->size() != static_cast<size_t>(x.shape(-1))) {
    fail("weight must have the same size as the last dimension of x, but x "
         "has " + std::to_string(x.shape(-1)) + " and weight has " +
         std::to_string(weight->size()) + " elements.");
  }
  if (!is_supported(weight->dtype())) {
    fail("Received unsupported type " + dtype_str(weight->dtype()) +
         " for weight; expected float32, float16 or bfloat16.");
  }
  return mx::promote_types(x.dtype(), weight->dtype());
}

mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& weight,
                   float eps, mx::StreamOrDevice s) {
  auto out_type = check_inputs("rms_norm", x, weight);
  auto stream = mx::to_stream(s);
  // The kernels walk rows of contiguous memory; contiguous() is free when
  // the input already is (it shares the buffer).
  std::vector<mx::array> inputs = {mx::contiguous(x, false, stream)};
  if (weight) inputs.push_back(mx::contiguous(*weight, false, stream));
  return mx::array(x.shape(), out_type,
                   std::make_shared<RMSNorm>(stream, eps, weight.has_value()),
                   std::move(inputs));
}

std::vector<mx::array> RMSNorm::vjp(const std::vector<mx::array>& primals,
                                    const std::vector<mx::array>& cotangents,
                                    const std::vector<int>& argnums,
                                    const std::vector<mx::array>&) {
  auto w = reference::weight_of(primals, has_weight_);
  auto grads = rms_norm_vjp(primals[0], w, cotangents[0], eps_,
                            Algorithm::Auto, stream());
  std::vector<mx::array> out;
  for (int i : argnums) out.push_back(grads[i]);
  return out;
}

std::vector<mx::array> RMSNorm::jvp(const std::vector<mx::array>& primals,
                                    const std::vector<mx::array>& tangents,
                                    const std::vector<int>& argnums) {
  // Forward-mode through the op-level formula; tangents of inputs that were
  // not asked for are zero.
  auto all_tangents = reference::full_tangents(primals, tangents, argnums, stream());
  float eps = eps_;
  bool has_w = has_weight_;
  auto s = stream();
  auto f = [eps, has_w, s](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{
        reference::forward(in[0], reference::weight_of(in, has_w), eps, s)};
  };
  return mx::jvp(f, primals, all_tangents).second;
}

std::pair<std::vector<mx::array>, std::vector<int>> RMSNorm::vmap(
    const std::vector<mx::array>& inputs, const std::vector<int>& axes) {
  bool w_mapped = has_weight_ && axes[1] >= 0;
  auto w = reference::weight_of(inputs, has_weight_);
  if (!w_mapped) {
    // Only x carries the batch: put it in front and normalize as usual.
    auto x = mx::moveaxis(inputs[0], axes[0], 0, stream());
    return {{rms_norm(x, w, eps_, stream())}, {0}};
  }
  float eps = eps_;
  auto s = stream();
  auto f = [eps, s](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{reference::forward(in[0], in[1], eps, s)};
  };
  return {mx::vmap(f, axes, {0})(inputs), {0}};
}

bool RMSNorm::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const RMSNorm&>(other);
  return eps_ == o.eps_ && has_weight_ == o.has_weight_;
}

}  // namespace mlx_rmsnorm
