// Helpers of the primitives' CPU evaluation (<family>_cpu.cpp): rows of any
// layout read into fp32, stores in the output's dtype, the blocked fp32
// sums, and a call's arrays by role (ForwardRows, BackwardRows), so that a
// family's file holds only its row math.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "primitives.h"

namespace mlx_rmsnorm::cpu {

namespace mx = mlx::core;

// Reads rows of an array into fp32, whatever its layout: row-contiguous
// arrays (the common case) row by row from one offset; transposed, sliced or
// broadcast ones (the op passes inputs as they come, with no Contiguous node)
// through their strides.
struct Rows {
  mx::Dtype dtype;
  const char* base;
  bool contiguous;
  int64_t inner;                 // stride of the last axis, in elements
  std::vector<int> lead_shape;   // the axes before the last
  std::vector<int64_t> lead_strides;

  static Rows of(const mx::array& a) {
    Rows r{a.dtype(), static_cast<const char*>(a.data<void>()),
           a.flags().row_contiguous, 1, {}, {}};
    if (!r.contiguous && a.ndim() > 0) {
      r.inner = a.strides().back();
      r.lead_shape.assign(a.shape().begin(), a.shape().end() - 1);
      r.lead_strides.assign(a.strides().begin(), a.strides().end() - 1);
    }
    return r;
  }

  int64_t row_offset(int64_t row, int n) const {
    if (contiguous) return row * n;
    int64_t off = 0;
    for (int k = static_cast<int>(lead_shape.size()) - 1; k >= 0; --k) {
      off += (row % lead_shape[k]) * lead_strides[k];
      row /= lead_shape[k];
    }
    return off;
  }

  void load(int64_t row, int n, float* dst) const {
    int64_t start = row_offset(row, n);
    int64_t step = contiguous ? 1 : inner;
    switch (dtype) {
      case mx::float32:
        copy(reinterpret_cast<const float*>(base), start, step, n, dst);
        break;
      case mx::float16:
        copy(reinterpret_cast<const mx::float16_t*>(base), start, step, n, dst);
        break;
      case mx::bfloat16:
        copy(reinterpret_cast<const mx::bfloat16_t*>(base), start, step, n, dst);
        break;
      default:
        throw std::runtime_error("[mlx_rmsnorm] unsupported dtype");
    }
  }

  template <typename T>
  static void copy(const T* p, int64_t start, int64_t step, int n, float* dst) {
    for (int i = 0; i < n; ++i) dst[i] = static_cast<float>(p[start + i * step]);
  }
};

inline void store(mx::array& out, int64_t start, const float* src, int n) {
  char* base = static_cast<char*>(out.data<void>());
  for (int i = 0; i < n; ++i) {
    switch (out.dtype()) {
      case mx::float32:
        reinterpret_cast<float*>(base)[start + i] = src[i];
        break;
      case mx::float16:
        reinterpret_cast<mx::float16_t*>(base)[start + i] = mx::float16_t(src[i]);
        break;
      case mx::bfloat16:
        reinterpret_cast<mx::bfloat16_t*>(base)[start + i] = mx::bfloat16_t(src[i]);
        break;
      default:
        throw std::runtime_error("[mlx_rmsnorm] unsupported dtype");
    }
  }
}

// One value rounded to a dtype and back: what storing h = x + residual and
// reading it again gives, so that a fused add's norm sees h exactly as the
// unfused composition stores it.
inline float round_to(mx::Dtype t, float v) {
  switch (t) {
    case mx::float16:
      return static_cast<float>(mx::float16_t(v));
    case mx::bfloat16:
      return static_cast<float>(mx::bfloat16_t(v));
    default:
      return v;
  }
}

// fp32 sums in blocks: each block of kBlock terms is added up on its own and
// the block sums then, so rounding grows with kBlock + n / kBlock rather than
// with n (rows of 10^5 elements, gw over 10^5 rows), as the GPU's per-thread
// partials and tree reductions do.
constexpr int kBlock = 256;

template <typename Term>
inline float blocked_sum(int n, Term term) {
  float total = 0.f;
  for (int start = 0; start < n; start += kBlock) {
    float part = 0.f;
    for (int i = start, end = std::min(n, start + kBlock); i < end; ++i)
      part += term(i);
    total += part;
  }
  return total;
}

// The scale offset + w in fp32 (Gemma's 1 + w, not rounded to w's dtype).
inline void load_scale(const Rows& wr, int n, float offset, float* dst) {
  wr.load(0, n, dst);
  if (offset != 0.f)
    for (int i = 0; i < n; ++i) dst[i] += offset;
}

// A column sum (gw, gb) over rows in fp32, in blocks of kBlock rows: each
// block summed on its own, then added to the total, as the GPU's per-unit
// partials are. Of n columns, or none (a sum that is not wanted).
struct ColumnSum {
  std::vector<float> total, part;
  explicit ColumnSum(int n) : total(n, 0.f), part(n, 0.f) {}
  void add(int i, float v) { part[i] += v; }
  // After row r of `rows`: a finished block goes into the total.
  void end_row(int64_t r, int64_t rows) {
    if ((r + 1) % kBlock != 0 && r + 1 != rows) return;
    for (size_t i = 0; i < part.size(); ++i) total[i] += part[i], part[i] = 0.f;
  }
};

inline void allocate(mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
}

// The start of every eval_cpu: the outputs allocated and every array
// declared to the stream's encoder (which keeps them alive until the queued
// work has run). Returns the encoder.
inline mx::cpu::CommandEncoder& begin(const mx::Stream& s, const std::vector<mx::array>& inputs,
                                      std::vector<mx::array>& outputs) {
  for (auto& o : outputs) allocate(o);
  auto& enc = mx::cpu::get_command_encoder(s);
  for (auto& a : inputs) enc.set_input_array(a);
  for (auto& o : outputs) enc.set_output_array(o);
  return enc;
}

// How many rows of a's last dimension a holds (none when that is 0).
inline int64_t row_count(const mx::array& a) {
  const int n = a.shape(-1);
  return n == 0 ? 0 : static_cast<int64_t>(a.size() / n);
}

// A forward call's arrays, declared to the encoder (begin): inputs (x,
// [residual], [w], [b]) as Rows (an absent one reads x, and is not read),
// outputs y and, with add, h (else h is y, and is not written). Captured by
// value into the queued work.
struct ForwardRows {
  bool add, has_w, has_b;
  int n;
  int64_t rows;
  Rows x, residual, w, b;
  mx::array y, h;
  float eps, offset;

  ForwardRows(NormPrimitive& prim, const std::vector<mx::array>& inputs,
              std::vector<mx::array>& outputs)
      : add(prim.add()),
        has_w(prim.has_weight()),
        has_b(prim.has_bias()),
        n(inputs[0].shape(-1)),
        rows(row_count(inputs[0])),
        x(Rows::of(inputs[0])),
        residual(Rows::of(add ? inputs[1] : inputs[0])),
        w(Rows::of(has_w ? *prim.weight(inputs) : inputs[0])),
        b(Rows::of(has_b ? *prim.bias(inputs) : inputs[0])),
        y(mx::array::unsafe_weak_copy(outputs[0])),
        h(mx::array::unsafe_weak_copy(outputs.back())),
        eps(prim.eps()),
        offset(prim.offset()) {}

  // Row r of x into xv; with add, h = x + residual rounded to h's dtype
  // (stored as the unfused add stores it) instead, rv a row of scratch.
  void load(int64_t r, float* xv, float* rv) {
    x.load(r, n, xv);
    if (!add) return;
    residual.load(r, n, rv);
    const mx::Dtype h_type = h.dtype();
    for (int i = 0; i < n; ++i) xv[i] = round_to(h_type, xv[i] + rv[i]);
    store(h, r * n, xv, n);
  }
};

// A backward call's arrays: inputs (x, [w], [b], g, [g_h]) as Rows (b only
// gives gb its dtype and is not read; an absent one reads x), outputs gx and
// the column sums wanted (an absent one is gx, and is not written).
struct BackwardRows {
  bool add, has_w, with_gw, with_gb;
  int n;
  int64_t rows;
  Rows x, w, g, gh;
  mx::array gx, gw, gb;
  float eps, offset;

  BackwardRows(NormPrimitive& prim, const std::vector<mx::array>& inputs,
               std::vector<mx::array>& outputs)
      : add(prim.add()),
        has_w(prim.has_weight()),
        with_gw(prim.has_gw()),
        with_gb(prim.need_gb()),
        n(inputs[0].shape(-1)),
        rows(row_count(inputs[0])),
        x(Rows::of(inputs[0])),
        w(Rows::of(has_w ? *prim.weight(inputs) : inputs[0])),
        g(Rows::of(prim.tail(inputs, 0))),
        gh(Rows::of(add ? prim.tail(inputs, 1) : inputs[0])),
        gx(mx::array::unsafe_weak_copy(outputs[0])),
        gw(with_gw ? mx::array::unsafe_weak_copy(outputs[1]) : gx),
        gb(with_gb ? mx::array::unsafe_weak_copy(outputs.back()) : gx),
        eps(prim.eps()),
        offset(prim.offset()) {}
};

}  // namespace mlx_rmsnorm::cpu
