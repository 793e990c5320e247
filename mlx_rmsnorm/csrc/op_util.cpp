#include "op_util.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "mlx/ops.h"

namespace mlx_rmsnorm {

namespace {

thread_local bool export_tracing_ = false;

[[noreturn]] void fail(const char* op, const std::string& msg) {
  throw std::invalid_argument(std::string("[") + op + "] " + msg);
}

}  // namespace

std::string dtype_str(mx::Dtype t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

std::string shape_str(const mx::Shape& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

mx::Dtype check_inputs(const char* op, const mx::array& x,
                       const std::optional<mx::array>& weight,
                       const std::optional<mx::array>& bias, const char* x_name) {
  const std::string xn = x_name;
  if (x.ndim() == 0) {
    fail(op, xn + " must have at least 1 dimension but got an array with 0 dimensions.");
  }
  auto check_vector = [&](const std::optional<mx::array>& v, const std::string& name) {
    if (!v) return;
    if (v->ndim() != 1) {
      fail(op, name + " must have 1 dimension but has " + std::to_string(v->ndim()) +
                   " dimensions.");
    }
    if (v->size() != static_cast<size_t>(x.shape(-1))) {
      fail(op, name + " must have the same size as the last dimension of " + xn + ", but " +
                   xn + " has " + std::to_string(x.shape(-1)) + " and " + name + " has " +
                   std::to_string(v->size()) + " elements.");
    }
  };
  check_vector(weight, "weight");
  check_vector(bias, "bias");
  mx::Dtype out_type = x.dtype();
  if (weight) {
    out_type = mx::promote_types(out_type, weight->dtype());
    if (bias) out_type = mx::promote_types(out_type, bias->dtype());
  }
  if (!mx::issubdtype(out_type, mx::floating)) {
    fail(op, "Received unsupported type " + dtype_str(out_type) + " (the result type of " +
                 xn + " " + dtype_str(x.dtype()) +
                 (weight ? " and weight " + dtype_str(weight->dtype()) : "") +
                 (weight && bias ? " and bias " + dtype_str(bias->dtype()) : "") +
                 "); expected a floating type.");
  }
  return out_type;
}

AddTypes check_add_inputs(const char* op, const mx::array& x, const mx::array& residual,
                          const std::optional<mx::array>& weight,
                          const std::optional<mx::array>& bias) {
  AddTypes t{{}, mx::promote_types(x.dtype(), residual.dtype()), mx::float32};
  try {
    t.shape = mx::broadcast_shapes(x.shape(), residual.shape());
  } catch (const std::invalid_argument&) {
    fail(op, "x of shape " + shape_str(x.shape()) + " and residual of shape " +
                 shape_str(residual.shape()) + " do not broadcast to one shape.");
  }
  if (t.shape.empty()) {
    fail(op, "x + residual must have at least 1 dimension but x and residual are scalars.");
  }
  auto check_vector = [&](const std::optional<mx::array>& v, const std::string& name) {
    if (v && (v->ndim() != 1 || v->shape(0) != t.shape.back())) {
      fail(op, name + " must be 1-D of the size of the last dimension of x + residual (" +
                   std::to_string(t.shape.back()) + ") but has shape " + shape_str(v->shape()) +
                   ".");
    }
  };
  check_vector(weight, "weight");
  check_vector(bias, "bias");
  t.out_type = t.h_type;
  if (weight) {
    t.out_type = mx::promote_types(t.out_type, weight->dtype());
    if (bias) t.out_type = mx::promote_types(t.out_type, bias->dtype());
  }
  if (!mx::issubdtype(t.out_type, mx::floating)) {
    fail(op, "Received unsupported type " + dtype_str(t.out_type) + " (the result type of x " +
                 dtype_str(x.dtype()) + " + residual " + dtype_str(residual.dtype()) +
                 (weight ? " and weight " + dtype_str(weight->dtype()) : "") +
                 (weight && bias ? " and bias " + dtype_str(bias->dtype()) : "") +
                 "); expected a floating type.");
  }
  return t;
}

mx::array expand_to(const mx::array& a, const mx::Shape& shape, mx::Dtype t, mx::Stream s) {
  auto c = cast(a, t, s);
  return c.shape() == shape ? c : mx::broadcast_to(c, shape, s);
}

void check_cotangent(const char* op, const mx::array& g, const char* g_name,
                     const mx::array& x, const char* x_name) {
  const std::string gn = g_name;
  if (g.shape() != x.shape()) {
    fail(op, gn + " must have the shape of " + x_name + " " + shape_str(x.shape()) +
                 " but has shape " + shape_str(g.shape()) + ".");
  }
  if (!mx::issubdtype(g.dtype(), mx::floating)) {
    fail(op, gn + " must be a floating array but has dtype " + dtype_str(g.dtype()) + ".");
  }
}

void check_offset(const char* op, const std::optional<mx::array>& weight, float offset) {
  if (offset != 0.f && !weight) fail(op, "offset scales by offset + weight and needs a weight.");
}

mx::Dtype check_vjp_inputs(const char* op, const mx::array& x,
                           const std::optional<mx::array>& weight,
                           const std::optional<mx::array>& bias, float offset,
                           const mx::array& g, const mx::array* g_h) {
  const char* x_name = g_h ? "h" : "x";
  auto out_type = check_inputs(op, x, weight, bias, x_name);
  check_offset(op, weight, offset);
  check_cotangent(op, g, g_h ? "g_y" : "g", x, x_name);
  if (g_h) check_cotangent(op, *g_h, "g_h", x, x_name);
  return out_type;
}

std::vector<mx::array> no_elements(const std::vector<mx::array>& outputs, mx::Stream s) {
  std::vector<mx::array> zeros;
  zeros.reserve(outputs.size());
  for (const auto& o : outputs) zeros.push_back(mx::zeros(o.shape(), o.dtype(), s));
  return zeros;
}

mx::array kernel_input(const mx::array& a, mx::Dtype out_type, mx::Stream s) {
  return is_kernel_dtype(a.dtype()) ? a : mx::astype(a, out_type, s);
}

std::optional<mx::array> kernel_input(const std::optional<mx::array>& a, mx::Dtype out_type,
                                      mx::Stream s) {
  if (!a) return std::nullopt;
  return kernel_input(*a, out_type, s);
}

mx::array cast(const mx::array& a, mx::Dtype t, mx::Stream s) {
  return a.dtype() == t ? a : mx::astype(a, t, s);
}

bool wanted(const std::vector<int>& argnums, int i) {
  return i >= 0 && std::find(argnums.begin(), argnums.end(), i) != argnums.end();
}

bool export_tracing() { return export_tracing_; }

bool set_export_tracing(bool on) {
  bool was = export_tracing_;
  export_tracing_ = on;
  return was;
}

}  // namespace mlx_rmsnorm
