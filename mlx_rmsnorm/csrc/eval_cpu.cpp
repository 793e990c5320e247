// CPU evaluation of both primitives: fp32 accumulation, rows processed one at
// a time on MLX's CPU stream (the work is queued, not run inline).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_util.h"
#include "mlx/backend/cpu/encoder.h"
#include "rms_norm.h"
#include "rms_norm_vjp.h"

namespace mlx_rmsnorm {

using namespace cpu;

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
  const float eps = eps_;
  Rows xr = Rows::of(x);
  Rows wr = Rows::of(has_w ? inputs[1] : x);
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
  for (auto& o : outputs) allocate(o);
  auto& enc = mx::cpu::get_command_encoder(stream());
  for (auto& a : inputs) enc.set_input_array(a);
  for (auto& o : outputs) enc.set_output_array(o);

  const int n = x.shape(-1);
  const int64_t rows = n == 0 ? 0 : x.size() / n;
  const bool has_w = has_weight_;
  const bool with_gw = has_gw();
  const float eps = eps_;
  Rows xr = Rows::of(x), gr = Rows::of(g);
  Rows wr = Rows::of(has_w ? inputs[1] : x);
  auto gx = mx::array::unsafe_weak_copy(outputs[0]);
  auto gw = with_gw ? mx::array::unsafe_weak_copy(outputs[1]) : gx;
  enc.dispatch([=]() mutable {
    std::vector<float> xv(n), gv(n), w(n, 1.f), out(n);
    std::vector<float> gw_total(with_gw ? n : 0, 0.f), gw_part(with_gw ? n : 0, 0.f);
    if (has_w) wr.load(0, n, w.data());
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

}  // namespace mlx_rmsnorm
