// CPU evaluation of both primitives: fp32 accumulation, rows processed one at
// a time on MLX's CPU stream (the work is queued, not run inline).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_util.h"
#include "mlx/backend/cpu/encoder.h"
#include "add_rms_norm.h"
#include "add_rms_norm_vjp.h"
#include "rms_norm.h"
#include "rms_norm_vjp.h"

namespace mlx_rmsnorm {

using namespace cpu;

namespace {

// The scale offset + w in fp32 (Gemma's 1 + w, not rounded to w's dtype).
void load_scale(const Rows& wr, int n, float offset, float* dst) {
  wr.load(0, n, dst);
  if (offset != 0.f)
    for (int i = 0; i < n; ++i) dst[i] += offset;
}

// One value rounded to a dtype and back: what storing h and reading it again
// gives, so the norm sees h exactly as the unfused composition stores it.
float round_to(mx::Dtype t, float v) {
  switch (t) {
    case mx::float16:
      return static_cast<float>(mx::float16_t(v));
    case mx::bfloat16:
      return static_cast<float>(mx::bfloat16_t(v));
    default:
      return v;
  }
}

}  // namespace

void RMSNorm::eval_cpu(const std::vector<mx::array>& inputs,
                       std::vector<mx::array>& outputs) {
  const mx::array& x = inputs[0];
  mx::array& y = outputs[0];
  allocate(y);
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(y);

  const int n = x.shape(-1);
  const int64_t rows = n == 0 ? 0 : x.size() / n;
  const bool has_w = has_weight_;
  const float eps = eps_, offset = offset_;
  Rows xr = Rows::of(x);
  Rows wr = Rows::of(has_w ? inputs[1] : x);
  enc.dispatch([=, y = mx::array::unsafe_weak_copy(y)]() mutable {
    std::vector<float> xv(n), w(n, 1.f);
    if (has_w) load_scale(wr, n, offset, w.data());
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
  for (auto& o : outputs) allocate(o);
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  for (auto& o : outputs) enc.set_output_array(o);

  const int n = x.shape(-1);
  const int64_t rows = n == 0 ? 0 : x.size() / n;
  const bool has_w = has_weight_;
  const bool with_gw = has_gw();
  const float eps = eps_, offset = offset_;
  Rows xr = Rows::of(x), gr = Rows::of(g);
  Rows wr = Rows::of(has_w ? inputs[1] : x);
  auto gx = mx::array::unsafe_weak_copy(outputs[0]);
  auto gw = with_gw ? mx::array::unsafe_weak_copy(outputs[1]) : gx;
  enc.dispatch([=]() mutable {
    std::vector<float> xv(n), gv(n), w(n, 1.f), out(n);
    std::vector<float> gw_total(with_gw ? n : 0, 0.f), gw_part(with_gw ? n : 0, 0.f);
    if (has_w) load_scale(wr, n, offset, w.data());
    for (int64_t r = 0; r < rows; ++r) {
      xr.load(r, n, xv.data());
      gr.load(r, n, gv.data());
      float ss = blocked_sum(n, [&](int i) { return xv[i] * xv[i]; });
      float dot = blocked_sum(n, [&](int i) { return gv[i] * w[i] * xv[i]; });
      float rstd = 1.f / std::sqrt(ss / n + eps);
      float c = dot / n * rstd * rstd * rstd;
      for (int i = 0; i < n; ++i) out[i] = rstd * w[i] * gv[i] - xv[i] * c;
      store(gx, r * n, out.data(), n);
      if (!with_gw) continue;
      for (int i = 0; i < n; ++i) gw_part[i] += gv[i] * xv[i] * rstd;
      if ((r + 1) % kBlock == 0 || r + 1 == rows) {  // blocks of rows, as above
        for (int i = 0; i < n; ++i) gw_total[i] += gw_part[i];
        std::fill(gw_part.begin(), gw_part.end(), 0.f);
      }
    }
    // gw: summed over all rows in fp32, cast once.
    if (with_gw) store(gw, 0, gw_total.data(), n);
  });
}

// Fused residual add: h = x + residual rounded to h's dtype, y the norm of
// that rounded h. One pass over each row.
void AddRMSNorm::eval_cpu(const std::vector<mx::array>& inputs,
                          std::vector<mx::array>& outputs) {
  mx::array& y = outputs[0];
  mx::array& h = outputs[1];
  allocate(y);
  allocate(h);
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  enc.set_output_array(y);
  enc.set_output_array(h);

  const int n = inputs[0].shape(-1);
  const int64_t rows = n == 0 ? 0 : inputs[0].size() / n;
  const bool has_w = has_weight_;
  const float eps = eps_, offset = offset_;
  const mx::Dtype h_type = h.dtype();
  Rows xr = Rows::of(inputs[0]), rr = Rows::of(inputs[1]);
  Rows wr = Rows::of(has_w ? inputs[2] : inputs[0]);
  enc.dispatch([=, y = mx::array::unsafe_weak_copy(y),
                h = mx::array::unsafe_weak_copy(h)]() mutable {
    std::vector<float> hv(n), rv(n), w(n, 1.f);
    if (has_w) load_scale(wr, n, offset, w.data());
    for (int64_t r = 0; r < rows; ++r) {
      xr.load(r, n, hv.data());
      rr.load(r, n, rv.data());
      for (int i = 0; i < n; ++i) hv[i] = round_to(h_type, hv[i] + rv[i]);
      store(h, r * n, hv.data(), n);
      float ss = blocked_sum(n, [&](int i) { return hv[i] * hv[i]; });
      float rstd = 1.f / std::sqrt(ss / n + eps);
      for (int i = 0; i < n; ++i) hv[i] = hv[i] * rstd * w[i];
      store(y, r * n, hv.data(), n);
    }
  });
}

// gx = g_h + (r * v - h * c) with v = g_y * (offset + w): the norm's
// backward of h plus h's own cotangent, one gradient for x and residual.
void AddRMSNormVJP::eval_cpu(const std::vector<mx::array>& inputs,
                             std::vector<mx::array>& outputs) {
  const mx::array& h = inputs[0];
  const mx::array& gy = inputs[inputs.size() - 2];
  const mx::array& gh = inputs.back();
  for (auto& o : outputs) allocate(o);
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  for (auto& o : outputs) enc.set_output_array(o);

  const int n = h.shape(-1);
  const int64_t rows = n == 0 ? 0 : h.size() / n;
  const bool has_w = has_weight_;
  const bool with_gw = has_gw();
  const float eps = eps_, offset = offset_;
  Rows hr = Rows::of(h), gr = Rows::of(gy), ghr = Rows::of(gh);
  Rows wr = Rows::of(has_w ? inputs[1] : h);
  auto gx = mx::array::unsafe_weak_copy(outputs[0]);
  auto gw = with_gw ? mx::array::unsafe_weak_copy(outputs[1]) : gx;
  enc.dispatch([=]() mutable {
    std::vector<float> hv(n), gv(n), ghv(n), w(n, 1.f), out(n);
    std::vector<float> gw_total(with_gw ? n : 0, 0.f), gw_part(with_gw ? n : 0, 0.f);
    if (has_w) load_scale(wr, n, offset, w.data());
    for (int64_t r = 0; r < rows; ++r) {
      hr.load(r, n, hv.data());
      gr.load(r, n, gv.data());
      ghr.load(r, n, ghv.data());
      float ss = blocked_sum(n, [&](int i) { return hv[i] * hv[i]; });
      float dot = blocked_sum(n, [&](int i) { return gv[i] * w[i] * hv[i]; });
      float rstd = 1.f / std::sqrt(ss / n + eps);
      float c = dot / n * rstd * rstd * rstd;
      for (int i = 0; i < n; ++i) out[i] = ghv[i] + (rstd * w[i] * gv[i] - hv[i] * c);
      store(gx, r * n, out.data(), n);
      if (!with_gw) continue;
      for (int i = 0; i < n; ++i) gw_part[i] += gv[i] * hv[i] * rstd;
      if ((r + 1) % kBlock == 0 || r + 1 == rows) {
        for (int i = 0; i < n; ++i) gw_total[i] += gw_part[i];
        std::fill(gw_part.begin(), gw_part.end(), 0.f);
      }
    }
    if (with_gw) store(gw, 0, gw_total.data(), n);
  });
}

}  // namespace mlx_rmsnorm
