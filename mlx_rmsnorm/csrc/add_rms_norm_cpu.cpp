// CPU evaluation of AddRMSNorm and AddRMSNormVJP: RMSNorm's rows
// (rms_norm_cpu.cpp) with the residual add in front and h's cotangent added
// into gx.
#include <algorithm>
#include <cmath>
#include <vector>

#include "add_rms_norm.h"
#include "add_rms_norm_vjp.h"
#include "cpu_util.h"

namespace mlx_rmsnorm {

using namespace cpu;

// Fused residual add: h = x + residual rounded to h's dtype, y the norm of
// that rounded h. One pass over each row.
void AddRMSNorm::eval_cpu(const std::vector<mx::array>& inputs,
                          std::vector<mx::array>& outputs) {
  mx::array& y = outputs[0];
  mx::array& h = outputs[1];
  auto& enc = begin(stream(), inputs, outputs);

  const int n = inputs[0].shape(-1);
  const int64_t rows = row_count(inputs[0]);
  const bool has_w = has_weight();
  const float eps = this->eps(), offset = this->offset();
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
  auto& enc = begin(stream(), inputs, outputs);

  const int n = h.shape(-1);
  const int64_t rows = row_count(h);
  const bool has_w = has_weight();
  const bool with_gw = has_gw();
  const float eps = this->eps(), offset = this->offset();
  Rows hr = Rows::of(h), gr = Rows::of(gy), ghr = Rows::of(gh);
  Rows wr = Rows::of(has_w ? inputs[1] : h);
  auto gx = mx::array::unsafe_weak_copy(outputs[0]);
  auto gw = with_gw ? mx::array::unsafe_weak_copy(outputs[1]) : gx;
  enc.dispatch([=]() mutable {
    std::vector<float> hv(n), gv(n), ghv(n), w(n, 1.f), out(n);
    ColumnSum gw_sum(with_gw ? n : 0);
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
      for (int i = 0; i < n; ++i) gw_sum.add(i, gv[i] * hv[i] * rstd);
      gw_sum.end_row(r, rows);
    }
    if (with_gw) store(gw, 0, gw_sum.total.data(), n);
  });
}

}  // namespace mlx_rmsnorm
