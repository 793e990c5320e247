// What every op builder (rms_norm, add_rms_norm, layer_norm and their
// vjps) shares: input validation with mx.fast's rules, the casts to the
// dtypes the kernels read, message formatting, and the export-tracing flag.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "mlx/array.h"
#include "mlx/utils.h"

namespace mlx_rmsnorm {

namespace mx = mlx::core;

// "float32", "bfloat16", ... and "(3, 8)", "(8,)" for error messages.
std::string dtype_str(mx::Dtype t);
std::string shape_str(const mx::Shape& shape);

// Validates x, weight and bias as mx.fast.rms_norm / mx.fast.layer_norm do
// (ValueError on the Python side) and returns the output dtype: x's without
// a weight, else the promotion of x's, weight's and bias's (a bias alone
// does not promote: the built-in's rule), which must be floating. `op`
// prefixes the messages, which call x `x_name` (the op's own name for it).
mx::Dtype check_inputs(const char* op, const mx::array& x,
                       const std::optional<mx::array>& weight,
                       const std::optional<mx::array>& bias = std::nullopt,
                       const char* x_name = "x");

// The inputs of a fused residual add (add_rms_norm, add_layer_norm): h =
// x + residual takes whatever MLX's add broadcasts, and the norm's checks
// then apply to h, the array that is normalized (weight and bias 1-D of h's
// last dimension). Returns h's shape, h's dtype (result_type(x, residual))
// and y's: h's without a weight, else its promotion with the weight's and the
// bias's (a bias alone does not promote, as in check_inputs), which must be
// floating. ValueError messages prefixed with `op`.
struct AddTypes {
  mx::Shape shape;
  mx::Dtype h_type;
  mx::Dtype out_type;
};
AddTypes check_add_inputs(const char* op, const mx::array& x, const mx::array& residual,
                          const std::optional<mx::array>& weight,
                          const std::optional<mx::array>& bias = std::nullopt);

// x or residual as a fused add reads it: in h's dtype (a mixed pair is cast
// first) and h's shape (one that broadcasts is expanded: a view, which the
// CPU path reads in place and the GPU path copies into a row-contiguous
// temporary). The gradient of an expanded input is summed back by
// broadcast_to's own vjp.
mx::array expand_to(const mx::array& a, const mx::Shape& shape, mx::Dtype t, mx::Stream s);

// A backward op's checks (rms_norm_vjp, add_rms_norm_vjp, layer_norm_vjp,
// add_layer_norm_vjp): x (with g_h: the forward's h, as the messages call
// it), weight and bias as check_inputs takes them, the offset's weight
// (check_offset), and g (g_y with g_h) and g_h of x's shape. Returns y's
// dtype.
mx::Dtype check_vjp_inputs(const char* op, const mx::array& x,
                           const std::optional<mx::array>& weight,
                           const std::optional<mx::array>& bias, float offset,
                           const mx::array& g, const mx::array* g_h);

// A cotangent `g` of x's shape, floating (ValueError otherwise).
void check_cotangent(const char* op, const mx::array& g, const char* g_name,
                     const mx::array& x, const char* x_name = "x");

// Throws (ValueError) when an offset is given without a weight.
void check_offset(const char* op, const std::optional<mx::array>& weight, float offset);

// An op on arrays of no elements: each of its outputs is either empty or a
// column sum over no rows, so zeros of the shape and dtype of `outputs` (the
// reference's outputs, built but never run), with no reduction and no
// dependence on the inputs (MLX's transforms then give zero derivatives,
// which they are), on every stream. MLX 0.32.4's reductions fail on such
// arrays: on the CPU some never return (`mx.sum(mx.zeros((8, 0)).T, axis=0)`),
// on the GPU they, mx.fast's norms included, stop the process with SIGFPE
// (both seen); the reference's derivatives are full of them.
std::vector<mx::array> no_elements(const std::vector<mx::array>& outputs, mx::Stream s);

// The dtypes our primitives (and so the kernels) take.
inline bool is_kernel_dtype(mx::Dtype t) {
  return t == mx::float32 || t == mx::float16 || t == mx::bfloat16;
}

// `a` itself when its dtype is one the kernels read, else `a` cast to
// `out_type` (what the built-in does to every input). With a float64
// `out_type` (the reference path) integer and bool inputs become float64 and
// float64 ones stay as they are.
mx::array kernel_input(const mx::array& a, mx::Dtype out_type, mx::Stream s);
std::optional<mx::array> kernel_input(const std::optional<mx::array>& a, mx::Dtype out_type,
                                      mx::Stream s);

// `a` in dtype `t` (itself when it has it).
mx::array cast(const mx::array& a, mx::Dtype t, mx::Stream s);

// Whether argument `i` is among `argnums` (i < 0: an absent argument).
bool wanted(const std::vector<int>& argnums, int i);

// Whether this thread is tracing a function for mx.export_function /
// mx.exporter (set by the Python hooks in mlx_rmsnorm/_patching.py: MLX keeps
// its own flag private); the ops then write MLX's own ops, so that the
// exported file holds what mx.fast writes. set_export_tracing returns the
// previous value.
bool export_tracing();
bool set_export_tracing(bool on);

}  // namespace mlx_rmsnorm
