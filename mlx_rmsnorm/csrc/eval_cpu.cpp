// CPU evaluation of both primitives: fp32 accumulation, rows processed one at
// a time on MLX's CPU stream (the work is queued, not run inline).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "rms_norm.h"
#include "rms_norm_vjp.h"

namespace mlx_rmsnorm {

namespace {

// Converts between an array's storage and fp32 rows.
struct Row {
  mx::Dtype dtype;
  const char* base;

  static Row of(const mx::array& a) {
    return {a.dtype(), static_cast<const char*>(a.data<void>())};
  }

  void load(int64_t row, int n, float* dst) const {
    int64_t start = row * n;
    for (int i = 0; i < n; ++i) dst[i] = at(start + i);
  }

  float at(int64_t i) const {
    switch (dtype) {
      case mx::float32:
        return reinterpret_cast<const float*>(base)[i];
      case mx::float16:
        return static_cast<float>(reinterpret_cast<const mx::float16_t*>(base)[i]);
      case mx::bfloat16:
        return static_cast<float>(reinterpret_cast<const mx::bfloat16_t*>(base)[i]);
      default:
        throw std::runtime_error("[mlx_rmsnorm] unsupported dtype");
    }
  }
};

void store(mx::array& out, int64_t start, const float* src, int n) {
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

// fp32 sums in blocks: each block of kBlock terms is added up on its own and
// the block sums then, so rounding grows with kBlock + n / kBlock rather than
// with n (rows of 10^5 elements, gw over 10^5 rows), as the GPU's per-thread
// partials and tree reductions do.
constexpr int kBlock = 256;

template <typename Term>
float blocked_sum(int n, Term term) {
  float total = 0.f;
  for (int start = 0; start < n; start += kBlock) {
    float part = 0.f;
    for (int i = start, end = std::min(n, start + kBlock); i < end; ++i)
      part += term(i);
    total += part;
  }
  return total;
}

void require_row_contiguous(const mx::array& a) {
  if (!a.flags().row_contiguous) {
    throw std::runtime_error("[mlx_rmsnorm] internal: input is not row-contiguous");
  }
}

void allocate(mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
}

}  // namespace

void RMSNorm::eval_cpu(const std::vector<mx::array>& inputs,
                       std::vector<mx::array>& outputs) {
  const mx::array& x = inputs[0];
  mx::array& y = outputs[0];
  for (auto& a : inputs) require_row_contiguous(a);
  allocate(y);
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(y);

  const int n = x.shape(-1);
  const int64_t rows = n == 0 ? 0 : x.size() / n;
  const bool has_w = has_weight_;
  const float eps = eps_;
  Row xr = Row::of(x);
  Row wr = Row::of(has_w ? inputs[1] : x);
  enc.dispatch([=, y = mx::array::unsafe_weak_copy(y)]() mutable {
    std::vector<float> xv(n), w(n, 1.f);
    if (has_w) wr.load(0, n, w.data());
    for (int64_t r = 0; r < rows; ++r) {
      xr.load(r, n, xv.data());
      float ss = blocked_sum(n, [&](int i) { return xv[i] * xv[i]; });
      float rstd = 1.f / std::sqrt(ss / n + eps);
      for (int i = 0; i < n; ++i) xv[i] = xv[i] * rstd * w[i];
      store(y, r * n, xv.data(), n);
    }
  });
}

void RMSNormVJP::eval_cpu(const std::vector<mx::array>& inputs,
                          std::vector<mx::array>& outputs) {
  const mx::array& x = inputs[0];
  const mx::array& g = inputs.back();
  for (auto& a : inputs) require_row_contiguous(a);
  for (auto& o : outputs) allocate(o);
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  for (auto& o : outputs) enc.set_output_array(o);

  const int n = x.shape(-1);
  const int64_t rows = n == 0 ? 0 : x.size() / n;
  const bool has_w = has_weight_;
  const float eps = eps_;
  Row xr = Row::of(x), gr = Row::of(g);
  Row wr = Row::of(has_w ? inputs[1] : x);
  auto gx = mx::array::unsafe_weak_copy(outputs[0]);
  auto gw = has_w ? mx::array::unsafe_weak_copy(outputs[1]) : gx;
  enc.dispatch([=]() mutable {
    std::vector<float> xv(n), gv(n), w(n, 1.f), out(n);
    std::vector<float> gw_total(n, 0.f), gw_part(n, 0.f);
    if (has_w) wr.load(0, n, w.data());
    for (int64_t r = 0; r < rows; ++r) {
      xr.load(r, n, xv.data());
      gr.load(r, n, gv.data());
      float ss = blocked_sum(n, [&](int i) { return xv[i] * xv[i]; });
      float dot = blocked_sum(n, [&](int i) { return gv[i] * w[i] * xv[i]; });
      float rstd = 1.f / std::sqrt(ss / n + eps);
      float c = dot / n * rstd * rstd * rstd;
      for (int i = 0; i < n; ++i) {
        out[i] = rstd * w[i] * gv[i] - xv[i] * c;
        gw_part[i] += gv[i] * xv[i] * rstd;
      }
      store(gx, r * n, out.data(), n);
      if ((r + 1) % kBlock == 0 || r + 1 == rows) {  // blocks of rows, as above
        for (int i = 0; i < n; ++i) gw_total[i] += gw_part[i];
        std::fill(gw_part.begin(), gw_part.end(), 0.f);
      }
    }
    // gw: summed over all rows in fp32, cast once.
    if (has_w) store(gw, 0, gw_total.data(), n);
  });
}

}  // namespace mlx_rmsnorm
