// Our norm primitives, declared in one place as MLX declares its fast
// primitives: two families, RMSNorm and LayerNorm, each a forward and a
// backward class. The fused residual add (h = x + residual, y = norm(h)) and
// the offset of the scale (Gemma's 1 + w) are switches of a primitive's
// params, not classes of their own: they change which arrays a call reads
// and writes, not how a row is walked. What every primitive shares (the
// params, where its arrays stand, jvp, vmap, shapes, equivalence) lives in
// NormPrimitive; a family's files hold only what is its own (its op and
// reference, rms_norm.cpp / layer_norm.cpp; its evaluation on each backend,
// <family>_cpu.cpp / <family>_gpu.cpp).
#pragma once

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "mlx/primitives.h"
#include "mlx/utils.h"
#include "ops.h"

namespace mlx_rmsnorm {

namespace mx = mlx::core;

// What a primitive is besides its inputs (is_equivalent compares these).
struct NormParams {
  float eps = 0.f;
  float offset = 0.f;       // RMSNorm family: the scale is offset + w (Gemma: 1)
  bool add = false;         // the fused residual add (see NormLayout)
  bool has_weight = false;  // w is an input
  bool has_bias = false;    // b is an input (LayerNorm; its VJP when gb is wanted)
  bool need_gw = false;     // a VJP: gw is an output (with a weight)
  bool need_gb = false;     // LayerNormVJP: gb is an output
  Algorithm algorithm = Algorithm::Auto;  // RMSNormVJP: which GPU backward
  bool operator==(const NormParams&) const = default;
};

// Where a primitive's arrays stand, from its direction and `add`. Inputs:
// `lead_rows` arrays of the rows' shape (x; with add x and residual, or for
// a backward h), the columns (w, then b, 1-D of the rows' length), then
// `tail_rows` arrays of the rows' shape (g; with add g_y and g_h). Outputs:
// `row_outputs` of the rows' shape (y; with add y and h; a backward's gx),
// then the column sums the params ask for (gw, then gb).
struct NormLayout {
  int lead_rows = 1;
  int tail_rows = 0;
  int row_outputs = 1;
  static NormLayout of(bool backward, bool add) {
    return backward ? NormLayout{1, 1 + add, 1} : NormLayout{1 + add, 0, 1 + add};
  }
};

class NormPrimitive : public mx::Primitive {
 public:
  NormPrimitive(mx::Stream stream, const char* name, const NormParams& params, bool backward)
      : mx::Primitive(stream),
        name_(name),
        p_(params),
        layout_(NormLayout::of(backward, params.add)) {}

  // The outputs of `prim` on `inputs`, of the given dtypes (kept: vmap makes
  // the same outputs for a batch).
  static std::vector<mx::array> make(std::shared_ptr<NormPrimitive> prim,
                                     std::vector<mx::array> inputs,
                                     std::vector<mx::Dtype> dtypes);

  // The primitive written with MLX ops (reference.h), as a function of its
  // inputs: what jvp differentiates, what vmap maps where a batch reaches a
  // column, and what a VJP's own vjp (second order) differentiates.
  virtual std::vector<mx::array> reference(const std::vector<mx::array>& inputs) = 0;

  std::vector<mx::array> jvp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& tangents,
                             const std::vector<int>& argnums) override;
  // The reference's vjp (the VJPs' second order); forward primitives build
  // their family's backward node instead.
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
  // No GPU kernels in this build: the ops never build a primitive on a GPU
  // stream here (routing.h), so reaching this is a bug; a clear error.
  void eval_gpu(const std::vector<mx::array>& inputs,
                std::vector<mx::array>& outputs) override;
#endif

  float eps() const { return p_.eps; }
  float offset() const { return p_.offset; }
  bool add() const { return p_.add; }
  bool has_weight() const { return p_.has_weight; }
  bool has_bias() const { return p_.has_bias; }
  bool has_gw() const { return p_.has_weight && p_.need_gw; }
  bool need_gb() const { return p_.need_gb; }
  Algorithm algorithm() const { return p_.algorithm; }
  const NormParams& params() const { return p_; }

  // The inputs by role: w, b, and the k-th of the trailing row inputs.
  std::optional<mx::array> weight(const std::vector<mx::array>& in) const;
  std::optional<mx::array> bias(const std::vector<mx::array>& in) const;
  const mx::array& tail(const std::vector<mx::array>& in, int k) const;
  // The argument numbers of w and b among a forward's inputs (-1: absent).
  int weight_arg() const { return p_.has_weight ? layout_.lead_rows : -1; }
  int bias_arg() const { return p_.has_bias ? layout_.lead_rows + p_.has_weight : -1; }

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

// Declares a primitive class: its constructor (the name MLX shows, which
// says whether the residual add is fused: the report and the tests count
// primitives by it), and what the class defines for itself: its CPU
// evaluation (<family>_cpu.cpp), its GPU evaluation (<family>_gpu.cpp, CUDA
// flavor only) and its reference (<family>.cpp).
#define MLX_RMSNORM_NORM_PRIMITIVE(Class, name, add_name, backward)                \
 public:                                                                            \
  Class(mx::Stream s, const NormParams& p)                                          \
      : NormPrimitive(s, p.add ? add_name : name, p, backward) {}                   \
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

// A forward primitive's vjp: its family's backward node.
#define MLX_RMSNORM_NORM_VJP                                          \
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,    \
                             const std::vector<mx::array>& cotangents, \
                             const std::vector<int>& argnums,          \
                             const std::vector<mx::array>& outputs) override;

// y = rms_norm(x) * (offset + w). Inputs (x, [w]); output y. With add:
// inputs (x, residual, [w]), outputs (y, h). Params: eps, add, has_weight,
// offset.
class RMSNorm : public NormPrimitive {
  MLX_RMSNORM_NORM_PRIMITIVE(RMSNorm, "RMSNormPlugin", "AddRMSNormPlugin", false)
  MLX_RMSNORM_NORM_VJP

 protected:
  std::pair<std::vector<mx::array>, std::vector<int>> vmap_reference(
      const std::vector<mx::array>& inputs, const std::vector<int>& axes) override;
};

// Its backward. Inputs (x, [w,] g); with add (h, [w,] g_y, g_h): the
// forward's h is read instead of x and residual (one tensor, not two, and
// the very values the norm saw), and gx = g_h + d(norm)/dh is the gradient
// of x and residual alike. Outputs gx, and gw when has_gw(). Params: eps,
// add, has_weight, need_gw, offset, algorithm.
class RMSNormVJP : public NormPrimitive {
  MLX_RMSNORM_NORM_PRIMITIVE(RMSNormVJP, "RMSNormPluginVJP", "AddRMSNormPluginVJP", true)
};

// y = layer_norm(x) * w + b. Inputs (x, [w], [b]); output y. With add:
// inputs (x, residual, [w], [b]), outputs (y, h). Params: eps, add,
// has_weight, has_bias.
class LayerNorm : public NormPrimitive {
  MLX_RMSNORM_NORM_PRIMITIVE(LayerNorm, "LayerNormPlugin", "AddLayerNormPlugin", false)
  MLX_RMSNORM_NORM_VJP
};

// Its backward. Inputs (x, [w], [b], g), with add (h, [w], [b], g_y, g_h)
// as in RMSNormVJP; b only when gb is wanted (its dtype is gb's; the kernels
// do not read it). Outputs gx, then gw if has_gw(), gb if need_gb(). Params:
// eps, add, has_weight, need_gw, has_bias = need_gb.
class LayerNormVJP : public NormPrimitive {
  MLX_RMSNORM_NORM_PRIMITIVE(LayerNormVJP, "LayerNormPluginVJP", "AddLayerNormPluginVJP", true)
};

}  // namespace mlx_rmsnorm
