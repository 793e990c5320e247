// The family of our norm primitives (RMSNorm, AddRMSNorm, LayerNorm and
// their VJPs): what all six share lives in NormPrimitive, so that a
// primitive's own files hold only what is its own (its evaluation on each
// backend, its reference in MLX ops, a forward op's backward node).
#pragma once

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "mlx/primitives.h"
#include "mlx/utils.h"

namespace mlx_rmsnorm {

namespace mx = mlx::core;

// What a primitive is besides its inputs (is_equivalent compares these).
struct NormParams {
  float eps = 0.f;
  float offset = 0.f;       // RMSNorm family: the scale is offset + w (Gemma: 1)
  bool has_weight = false;  // w is an input
  bool has_bias = false;    // b is an input (LayerNorm; its VJP when gb is wanted)
  bool need_gw = false;     // a VJP: gw is an output (with a weight)
  bool need_gb = false;     // LayerNormVJP: gb is an output
  int algorithm = 0;        // RMSNormVJP: which GPU backward (rms_norm_vjp.h)
  bool operator==(const NormParams&) const = default;
};

// Where a primitive's arrays stand. Inputs: `lead_rows` arrays of the rows'
// shape (x; x and residual; h), the columns (w, then b, 1-D of the rows'
// length), then `tail_rows` arrays of the rows' shape (g; g_y and g_h).
// Outputs: `row_outputs` of the rows' shape (y; y and h; gx), then the
// column sums the params ask for (gw, then gb).
struct NormLayout {
  int lead_rows = 1;
  int tail_rows = 0;
  int row_outputs = 1;
};

class NormPrimitive : public mx::Primitive {
 public:
  NormPrimitive(mx::Stream stream, const char* name, const NormParams& params,
                NormLayout layout)
      : mx::Primitive(stream), name_(name), p_(params), layout_(layout) {}

  // The outputs of `prim` on `inputs`, of the given dtypes (kept: vmap makes
  // the same outputs for a batch).
  static std::vector<mx::array> make(std::shared_ptr<NormPrimitive> prim,
                                     std::vector<mx::array> inputs,
                                     std::vector<mx::Dtype> dtypes);

  // The primitive written with MLX ops, as a function of its inputs:
  // what jvp differentiates, what vmap maps where a batch reaches a column,
  // and what a VJP's own vjp (second order) differentiates.
  virtual std::vector<mx::array> reference(const std::vector<mx::array>& inputs) = 0;

  std::vector<mx::array> jvp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& tangents,
                             const std::vector<int>& argnums) override;
  // The reference's vjp (the VJPs' second order); forward ops build their
  // own backward node instead (MLX_RMSNORM_NORM_VJP).
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>& outputs) override;
  // A batch that reaches only the rows: this primitive on the batch (it
  // normalizes rows of any leading shape). Otherwise vmap_reference.
  std::pair<std::vector<mx::array>, std::vector<int>> vmap(
      const std::vector<mx::array>& inputs, const std::vector<int>& axes) override;
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;
  const char* name() const override { return name_; }
  bool is_equivalent(const mx::Primitive& other) const override;
#ifndef MLX_RMSNORM_CUDA
  // The CPU flavor of MLX: a clear error.
  void eval_gpu(const std::vector<mx::array>& inputs,
                std::vector<mx::array>& outputs) override;
#endif

  float eps() const { return p_.eps; }
  float offset() const { return p_.offset; }
  bool has_weight() const { return p_.has_weight; }
  bool has_bias() const { return p_.has_bias; }
  bool has_gw() const { return p_.has_weight && p_.need_gw; }
  bool need_gb() const { return p_.need_gb; }
  int algorithm() const { return p_.algorithm; }
  const NormParams& params() const { return p_; }

  // The inputs by role: w, b, and the k-th of the trailing row inputs.
  std::optional<mx::array> weight(const std::vector<mx::array>& in) const;
  std::optional<mx::array> bias(const std::vector<mx::array>& in) const;
  const mx::array& tail(const std::vector<mx::array>& in, int k) const;

 protected:
  // vmap where the batch reaches a column (w or b mapped) or a column sum
  // (gw, gb: summed over every row, the batch's too): mx::vmap of reference.
  virtual std::pair<std::vector<mx::array>, std::vector<int>> vmap_reference(
      const std::vector<mx::array>& inputs, const std::vector<int>& axes);

 private:
  // A new primitive of this class and params (Primitive is not copyable).
  virtual std::shared_ptr<NormPrimitive> clone() = 0;
  int columns() const { return p_.has_weight + p_.has_bias; }
  int column_outputs() const { return has_gw() + p_.need_gb; }

  const char* name_;
  NormParams p_;
  NormLayout layout_;
  std::vector<mx::Dtype> dtypes_;
};

#ifdef MLX_RMSNORM_CUDA
#define MLX_RMSNORM_DECLARE_EVAL_GPU                  \
  void eval_gpu(const std::vector<mx::array>& inputs, \
                std::vector<mx::array>& outputs) override;
#else
#define MLX_RMSNORM_DECLARE_EVAL_GPU
#endif

// Declares a primitive of the family: its constructor (the name MLX shows,
// the layout as NormLayout's fields: `.lead_rows = 2, .row_outputs = 2`),
// and what it defines for itself: its CPU evaluation (<op>_cpu.cpp), its GPU
// evaluation (<op>_gpu.cpp, CUDA flavor only) and its reference (<op>.cpp
// or <op>_vjp.cpp).
#define MLX_RMSNORM_NORM_PRIMITIVE(Class, name, ...)                                \
 public:                                                                            \
  Class(mx::Stream s, const NormParams& p)                                          \
      : NormPrimitive(s, name, p, NormLayout{__VA_ARGS__}) {}                       \
  void eval_cpu(const std::vector<mx::array>& inputs,                               \
                std::vector<mx::array>& outputs) override;                          \
  MLX_RMSNORM_DECLARE_EVAL_GPU                                                      \
  std::vector<mx::array> reference(const std::vector<mx::array>& inputs) override; \
                                                                                    \
 private:                                                                           \
  std::shared_ptr<NormPrimitive> clone() override {                                 \
    return std::make_shared<Class>(stream(), params());                             \
  }                                                                                 \
                                                                                    \
 public:

// A forward op's vjp: its backward node (<op>.cpp).
#define MLX_RMSNORM_NORM_VJP                                          \
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,    \
                             const std::vector<mx::array>& cotangents, \
                             const std::vector<int>& argnums,          \
                             const std::vector<mx::array>& outputs) override;

}  // namespace mlx_rmsnorm
