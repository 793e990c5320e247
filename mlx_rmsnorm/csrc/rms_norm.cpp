#include "rms_norm.h"

#include <algorithm>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "mlx/fast.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "reference.h"
#include "rms_norm_vjp.h"

namespace mlx_rmsnorm {

namespace {

thread_local bool export_tracing_ = false;

}  // namespace

std::string dtype_str(mx::Dtype t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

bool export_tracing() { return export_tracing_; }

bool set_export_tracing(bool on) {
  bool was = export_tracing_;
  export_tracing_ = on;
  return was;
}

mx::Dtype check_inputs(const char* op, const mx::array& x,
                       const std::optional<mx::array>& weight, const char* x_name) {
  auto fail = [op](const std::string& msg) {
    throw std::invalid_argument(std::string("[") + op + "] " + msg);
  };
  const std::string xn = x_name;
  if (x.ndim() == 0) {
    fail(xn + " must have at least 1 dimension but got an array with 0 dimensions.");
  }
  if (weight) {
    if (weight->ndim() != 1) {
      fail("weight must have 1 dimension but has " +
           std::to_string(weight->ndim()) + " dimensions.");
    }
    if (weight->size() != static_cast<size_t>(x.shape(-1))) {
      fail("weight must have the same size as the last dimension of " + xn + ", but " +
           xn + " has " + std::to_string(x.shape(-1)) + " and weight has " +
           std::to_string(weight->size()) + " elements.");
    }
  }
  // The built-in's rule: any inputs whose result type is floating.
  auto out_type = reference::result_type(x, weight);
  if (!mx::issubdtype(out_type, mx::floating)) {
    fail("Received unsupported type " + dtype_str(out_type) + " (the result type of " + xn +
         " " + dtype_str(x.dtype()) +
         (weight ? " and weight " + dtype_str(weight->dtype()) : "") +
         "); expected a floating type.");
  }
  return out_type;
}

void check_offset(const char* op, const std::optional<mx::array>& weight,
                  float offset) {
  if (offset != 0.f && !weight) {
    throw std::invalid_argument(std::string("[") + op +
                                "] offset scales by offset + weight and needs a weight.");
  }
}

void check_not_empty_on_gpu(const char* op, const mx::array& x, const mx::Stream& s) {
  if (x.size() == 0 && s.device.type == mx::Device::DeviceType::gpu) {
    throw std::invalid_argument(
        std::string("[") + op + "] arrays of no elements are not supported on the GPU (MLX's " +
        "GPU reductions, mx.fast's norms included, stop the process on them); compute " +
        "them on the CPU stream (stream=mx.cpu).");
  }
}

mx::array builtin_rms_norm(const mx::array& x, const std::optional<mx::array>& w,
                           float eps, float offset, mx::StreamOrDevice s) {
  if (offset == 0.f || !w) return mx::fast::rms_norm(x, w, eps, s);
  // offset + w in fp32, then y cast back to result_type(x, w).
  auto out_type = reference::result_type(x, w);
  auto scale = mx::add(mx::astype(*w, mx::float32, s), mx::array(offset, mx::float32), s);
  return mx::astype(mx::fast::rms_norm(x, scale, eps, s), out_type, s);
}

mx::array kernel_input(const mx::array& a, mx::Dtype out_type, mx::Stream s) {
  return is_kernel_dtype(a.dtype()) ? a : mx::astype(a, out_type, s);
}

// Inputs go to the primitive as they are: no Contiguous node (eval_cpu and
// eval_gpu read strided inputs, or copy them, themselves) and a cast only
// where a dtype is one the kernels do not read.
mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& weight,
                   float eps, mx::StreamOrDevice s, float offset) {
  auto out_type = check_inputs("rms_norm", x, weight);
  check_offset("rms_norm", weight, offset);
  if (export_tracing_) return builtin_rms_norm(x, weight, eps, offset, s);
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs = {kernel_input(x, out_type, stream)};
  if (weight) inputs.push_back(kernel_input(*weight, out_type, stream));
  // float64: MLX ops in float64 (reference.h); the kernels read 16/32-bit floats.
  // No elements: MLX ops too, no kernel launch (MLX 0.32.4's own GPU norm
  // kernels stop the process with SIGFPE on such arrays).
  check_not_empty_on_gpu("rms_norm", x, stream);
  if (out_type == mx::float64 || x.size() == 0) {
    return reference::forward(inputs[0], reference::weight_of(inputs, weight.has_value()),
                              eps, stream, offset);
  }
  return mx::array(x.shape(), out_type,
                   std::make_shared<RMSNorm>(stream, eps, weight.has_value(), offset),
                   std::move(inputs));
}

std::vector<mx::array> RMSNorm::vjp(const std::vector<mx::array>& primals,
                                    const std::vector<mx::array>& cotangents,
                                    const std::vector<int>& argnums,
                                    const std::vector<mx::array>&) {
  // The primals passed the op's checks already: build the backward node
  // directly, with gw only when the weight's gradient is asked for (frozen
  // norms, LoRA).
  auto w = reference::weight_of(primals, has_weight_);
  bool need_gw = has_weight_ &&
                 std::find(argnums.begin(), argnums.end(), 1) != argnums.end();
  auto out_type = reference::result_type(primals[0], w);
  auto g = cotangents[0];
  if (g.dtype() != out_type) g = mx::astype(g, out_type, stream());
  auto grads = detail::make_vjp(primals[0], w, g, eps_, Algorithm::Auto,
                                need_gw, stream(), offset_);
  std::vector<mx::array> out;
  out.reserve(argnums.size());
  for (int i : argnums) out.push_back(grads[i]);
  return out;
}

std::vector<mx::array> RMSNorm::jvp(const std::vector<mx::array>& primals,
                                    const std::vector<mx::array>& tangents,
                                    const std::vector<int>& argnums) {
  // Forward-mode through the op-level formula; tangents of inputs that were
  // not asked for are zero.
  auto all_tangents = reference::full_tangents(primals, tangents, argnums, stream());
  float eps = eps_, offset = offset_;
  bool has_w = has_weight_;
  auto s = stream();
  auto f = [eps, offset, has_w, s](const std::vector<mx::array>& in) {
    return std::vector<mx::array>{
        reference::forward(in[0], reference::weight_of(in, has_w), eps, s, offset)};
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
    return {{rms_norm(x, w, eps_, stream(), offset_)}, {0}};
  }
  // The weight carries the batch (x too, or not): batch axes in front, the
  // weight broadcast over x's rows as (B, 1, ..., 1, N), and the op-level
  // formula on the broadcast arrays. Not mx::vmap of that formula: a graph
  // vmapped that way failed mx.compile(..., shapeless=True) on a new row
  // count ("[broadcast_shapes] Shapes (3,7,1) and (1,4,1)"), while these
  // ops (expand_dims, no reshape to fixed sizes) infer every shape.
  auto s = stream();
  auto x = axes[0] >= 0 ? mx::moveaxis(inputs[0], axes[0], 0, s)
                        : mx::expand_dims(inputs[0], 0, s);
  auto wb = mx::moveaxis(inputs[1], axes[1], 0, s);
  std::vector<int> row_axes(x.ndim() - 2);
  std::iota(row_axes.begin(), row_axes.end(), 1);
  if (!row_axes.empty()) wb = mx::expand_dims(wb, row_axes, s);
  return {{reference::forward(x, wb, eps_, s, offset_)}, {0}};
}

bool RMSNorm::is_equivalent(const mx::Primitive& other) const {
  auto& o = static_cast<const RMSNorm&>(other);
  return eps_ == o.eps_ && has_weight_ == o.has_weight_ && offset_ == o.offset_;
}

}  // namespace mlx_rmsnorm
