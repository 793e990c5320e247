// RMSNorm forward: the op and its primitive.
#pragma once

#include <optional>
#include <string>

#include "mlx/primitives.h"
#include "mlx/utils.h"

namespace mlx_rmsnorm {

namespace mx = mlx::core;

// y = x * rsqrt(mean(x^2, axis=-1) + eps) * weight, with the contract of
// mx.fast.rms_norm: x has at least one dimension, weight is 1-D of size
// x.shape[-1] or absent, y has dtype result_type(x, weight), which must be
// floating. Integer and bool inputs are cast to that type first (as the
// built-in does); float64 runs reference.h in float64 (our kernels read
// 16/32-bit floats only; on a GPU stream MLX refuses float64, as it does for
// the built-in); while an export is being traced (export_tracing()) the op
// is the built-in's, so the exported file holds what mx.fast.rms_norm writes.
// `offset` (Gemma: 1) scales by offset + weight, formed in fp32 by the
// kernels instead of rounded to the weight's dtype; it needs a weight.
mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& weight,
                   float eps, mx::StreamOrDevice s = {}, float offset = 0.f);

// Throws (ValueError in Python) when an offset is given without a weight.
void check_offset(const char* op, const std::optional<mx::array>& weight,
                  float offset);

// Throws (ValueError in Python) for an array of no elements on a GPU stream:
// there MLX 0.32.4's reductions, its own norms' included, stop the process
// with SIGFPE (seen on the H200), so neither our kernels nor MLX ops can
// compute it. On the CPU such arrays take the MLX-ops path.
void check_not_empty_on_gpu(const char* op, const mx::array& x, const mx::Stream& s);

// What mx.fast.rms_norm computes for our y = rms_norm(x) * (offset + w):
// the exported form (MLX ops only) of a norm with an offset. With offset 0
// it is the built-in's own call.
mx::array builtin_rms_norm(const mx::array& x, const std::optional<mx::array>& w,
                           float eps, float offset, mx::StreamOrDevice s);

// Validates x and weight as mx.fast.rms_norm does (ValueError on the Python
// side) and returns the output dtype. `op` prefixes the messages, which call
// x `x_name` (the op's own name for its argument).
mx::Dtype check_inputs(const char* op, const mx::array& x,
                       const std::optional<mx::array>& weight, const char* x_name = "x");

// The dtypes our primitives (and so the kernels) take.
inline bool is_kernel_dtype(mx::Dtype t) {
  return t == mx::float32 || t == mx::float16 || t == mx::bfloat16;
}

// `a` itself when its dtype is one the kernels read, else `a` cast to
// `out_type` (what the built-in does to every input). With a float64
// `out_type` (the reference path) integer and bool inputs become float64 and
// float64 ones stay as they are.
mx::array kernel_input(const mx::array& a, mx::Dtype out_type, mx::Stream s);

// "float32", "bfloat16", ... for error messages.
std::string dtype_str(mx::Dtype t);

// Whether this thread is tracing a function for mx.export_function /
// mx.exporter (set by the Python hooks in mlx_rmsnorm/_patching.py: MLX keeps
// its own flag private). set_export_tracing returns the previous value.
bool export_tracing();
bool set_export_tracing(bool on);

class RMSNorm : public mx::Primitive {
 public:
  RMSNorm(mx::Stream stream, float eps, bool has_weight, float offset = 0.f)
      : mx::Primitive(stream), eps_(eps), has_weight_(has_weight), offset_(offset) {}

  void eval_cpu(const std::vector<mx::array>& inputs,
                std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs,
                std::vector<mx::array>& outputs) override;

  std::vector<mx::array> jvp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& tangents,
                             const std::vector<int>& argnums) override;
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>& outputs) override;
  std::pair<std::vector<mx::array>, std::vector<int>> vmap(
      const std::vector<mx::array>& inputs,
      const std::vector<int>& axes) override;
  std::vector<mx::Shape> output_shapes(
      const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

  const char* name() const override { return "RMSNormPlugin"; }
  bool is_equivalent(const mx::Primitive& other) const override;

  float eps() const { return eps_; }
  bool has_weight() const { return has_weight_; }
  float offset() const { return offset_; }

 private:
  float eps_;
  bool has_weight_;
  float offset_;
};

}  // namespace mlx_rmsnorm
