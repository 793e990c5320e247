// CPU evaluation of RMSNorm and RMSNormVJP: fp32 accumulation, rows one at a
// time on MLX's CPU stream (the work is queued, not run inline).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_util.h"
#include "rms_norm.h"
#include "rms_norm_vjp.h"

namespace mlx_rmsnorm {

using namespace cpu;

void RMSNorm::eval_cpu(const std::vector<mx::array>& inputs,
                       std::vector<mx::array>& outputs) {
  const mx::array& x = inputs[0];
  mx::array& y = outputs[0];
  auto& enc = begin(stream(), inputs, outputs);

  const int n = x.shape(-1);
  const int64_t rows = row_count(x);
  const bool has_w = has_weight();
  const float eps = this->eps(), offset = this->offset();
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
  auto& enc = begin(stream(), inputs, outputs);

  const int n = x.shape(-1);
  const int64_t rows = row_count(x);
  const bool has_w = has_weight();
  const bool with_gw = has_gw();
  const float eps = this->eps(), offset = this->offset();
  Rows xr = Rows::of(x), gr = Rows::of(g);
  Rows wr = Rows::of(has_w ? inputs[1] : x);
  auto gx = mx::array::unsafe_weak_copy(outputs[0]);
  auto gw = with_gw ? mx::array::unsafe_weak_copy(outputs[1]) : gx;
  enc.dispatch([=]() mutable {
    std::vector<float> xv(n), gv(n), w(n, 1.f), out(n);
    ColumnSum gw_sum(with_gw ? n : 0);
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
      for (int i = 0; i < n; ++i) gw_sum.add(i, gv[i] * xv[i] * rstd);
      gw_sum.end_row(r, rows);
    }
    // gw: summed over all rows in fp32, cast once.
    if (with_gw) store(gw, 0, gw_sum.total.data(), n);
  });
}

}  // namespace mlx_rmsnorm
