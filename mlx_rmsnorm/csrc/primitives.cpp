// What every norm primitive shares (primitives.h).
#include "primitives.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <typeinfo>

#include "mlx/ops.h"
#include "mlx/transforms.h"

namespace mlx_rmsnorm {

std::vector<mx::array> NormPrimitive::make(std::shared_ptr<NormPrimitive> prim,
                                           std::vector<mx::array> inputs,
                                           std::vector<mx::Dtype> dtypes) {
  auto shapes = prim->output_shapes(inputs);
  if (shapes.size() != dtypes.size())
    throw std::logic_error("[mlx_rmsnorm] a primitive's outputs and dtypes differ in count");
  prim->dtypes_ = dtypes;
  if (shapes.size() == 1)
    return {mx::array(std::move(shapes[0]), dtypes[0], std::move(prim), std::move(inputs))};
  return mx::array::make_arrays(std::move(shapes), dtypes, std::move(prim), std::move(inputs));
}

std::vector<mx::array> NormPrimitive::jvp(const std::vector<mx::array>& primals,
                                          const std::vector<mx::array>& tangents,
                                          const std::vector<int>& argnums) {
  // Every primal gets a tangent: the given ones, zeros where none was asked.
  std::vector<mx::array> all;
  all.reserve(primals.size());
  for (int i = 0; i < static_cast<int>(primals.size()); ++i) {
    auto at = std::find(argnums.begin(), argnums.end(), i);
    all.push_back(at == argnums.end() ? mx::zeros_like(primals[i], stream())
                                      : tangents[at - argnums.begin()]);
  }
  auto f = [this](const std::vector<mx::array>& in) { return reference(in); };
  return mx::jvp(f, primals, all).second;
}

std::vector<mx::array> NormPrimitive::vjp(const std::vector<mx::array>& primals,
                                          const std::vector<mx::array>& cotangents,
                                          const std::vector<int>& argnums,
                                          const std::vector<mx::array>&) {
  auto f = [this](const std::vector<mx::array>& in) { return reference(in); };
  auto grads = mx::vjp(f, primals, cotangents).second;
  std::vector<mx::array> out;
  out.reserve(argnums.size());
  for (int i : argnums) out.push_back(grads[i]);
  return out;
}

std::pair<std::vector<mx::array>, std::vector<int>> NormPrimitive::vmap(
    const std::vector<mx::array>& inputs, const std::vector<int>& axes) {
  const int first_column = layout_.lead_rows, end_column = first_column + columns();
  bool column_mapped = false;
  int size = 0;
  for (int i = 0; i < static_cast<int>(inputs.size()); ++i) {
    if (axes[i] < 0) continue;
    if (i >= first_column && i < end_column) column_mapped = true;
    size = inputs[i].shape(axes[i]);
  }
  if (column_mapped || column_outputs() > 0) return vmap_reference(inputs, axes);
  // The batch in front of every row input (an unmapped one broadcast to it).
  auto s = stream();
  std::vector<mx::array> in;
  in.reserve(inputs.size());
  for (int i = 0; i < static_cast<int>(inputs.size()); ++i) {
    if (i >= first_column && i < end_column) {
      in.push_back(inputs[i]);
    } else if (axes[i] >= 0) {
      in.push_back(mx::moveaxis(inputs[i], axes[i], 0, s));
    } else {
      auto shape = inputs[i].shape();
      shape.insert(shape.begin(), size);
      in.push_back(mx::broadcast_to(mx::expand_dims(inputs[i], 0, s), shape, s));
    }
  }
  auto out = make(clone(), std::move(in), dtypes_);
  return {out, std::vector<int>(out.size(), 0)};
}

std::pair<std::vector<mx::array>, std::vector<int>> NormPrimitive::vmap_reference(
    const std::vector<mx::array>& inputs, const std::vector<int>& axes) {
  std::vector<int> out_axes(layout_.row_outputs + column_outputs(), 0);
  auto f = [this](const std::vector<mx::array>& in) { return reference(in); };
  return {mx::vmap(f, axes, out_axes)(inputs), out_axes};
}

std::vector<mx::Shape> NormPrimitive::output_shapes(const std::vector<mx::array>& inputs) {
  std::vector<mx::Shape> out(layout_.row_outputs, inputs[0].shape());
  for (int k = 0; k < column_outputs(); ++k) out.push_back({inputs[0].shape().back()});
  return out;
}

bool NormPrimitive::is_equivalent(const mx::Primitive& other) const {
  return typeid(*this) == typeid(other) && p_ == static_cast<const NormPrimitive&>(other).p_;
}

std::optional<mx::array> NormPrimitive::weight(const std::vector<mx::array>& in) const {
  if (!p_.has_weight) return std::nullopt;
  return in[layout_.lead_rows];
}

std::optional<mx::array> NormPrimitive::bias(const std::vector<mx::array>& in) const {
  if (!p_.has_bias) return std::nullopt;
  return in[layout_.lead_rows + p_.has_weight];
}

const mx::array& NormPrimitive::tail(const std::vector<mx::array>& in, int k) const {
  return in[layout_.lead_rows + columns() + k];
}

#ifndef MLX_RMSNORM_CUDA
void NormPrimitive::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::logic_error(
      std::string("[mlx_rmsnorm] ") + name_ +
      " reached a GPU stream in a build without GPU kernels (built against MLX "
      "without CUDA); the ops send such streams to MLX's own ops: please report this.");
}
#endif

}  // namespace mlx_rmsnorm
