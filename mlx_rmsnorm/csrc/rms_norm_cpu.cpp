// CPU evaluation of the RMSNorm family (RMSNorm, RMSNormVJP; the fused
// residual add is their `add`): fp32 accumulation, rows one at a time on
// MLX's CPU stream (the work is queued, not run inline). The formulas of
// reference.h's RMSNorm, which the GPU kernels share.
#include <cmath>
#include <vector>

#include "cpu_util.h"
#include "primitives.h"

namespace mlx_rmsnorm {

using namespace cpu;

// y = x * rstd * (offset + w); with add, of h = x + residual as stored.
void RMSNorm::eval_cpu(const std::vector<mx::array>& inputs,
                       std::vector<mx::array>& outputs) {
  auto& enc = begin(stream(), inputs, outputs);
  enc.dispatch([io = ForwardRows(*this, inputs, outputs)]() mutable {
    const int n = io.n;
    std::vector<float> xv(n), rv(io.add ? n : 0), w(n, 1.f);
    if (io.has_w) load_scale(io.w, n, io.offset, w.data());
    for (int64_t r = 0; r < io.rows; ++r) {
      io.load(r, xv.data(), rv.data());
      float ss = blocked_sum(n, [&](int i) { return xv[i] * xv[i]; });
      float rstd = 1.f / std::sqrt(ss / n + io.eps);
      for (int i = 0; i < n; ++i) xv[i] = xv[i] * rstd * w[i];
      store(io.y, r * n, xv.data(), n);
    }
  });
}

// gx = r * v - x * c with v = g * (offset + w), c = mean(v * x) * r^3; with
// add, x is the forward's h and gx = g_h + that, one gradient for x and
// residual. gw = sum over rows of g * x * r.
void RMSNormVJP::eval_cpu(const std::vector<mx::array>& inputs,
                          std::vector<mx::array>& outputs) {
  auto& enc = begin(stream(), inputs, outputs);
  enc.dispatch([io = BackwardRows(*this, inputs, outputs)]() mutable {
    const int n = io.n;
    std::vector<float> xv(n), gv(n), ghv(io.add ? n : 0), w(n, 1.f), out(n);
    ColumnSum gw_sum(io.with_gw ? n : 0);
    if (io.has_w) load_scale(io.w, n, io.offset, w.data());
    for (int64_t r = 0; r < io.rows; ++r) {
      io.x.load(r, n, xv.data());
      io.g.load(r, n, gv.data());
      float ss = blocked_sum(n, [&](int i) { return xv[i] * xv[i]; });
      float dot = blocked_sum(n, [&](int i) { return gv[i] * w[i] * xv[i]; });
      float rstd = 1.f / std::sqrt(ss / n + io.eps);
      float c = dot / n * rstd * rstd * rstd;
      if (io.add) {
        io.gh.load(r, n, ghv.data());
        for (int i = 0; i < n; ++i) out[i] = ghv[i] + (rstd * w[i] * gv[i] - xv[i] * c);
      } else {
        for (int i = 0; i < n; ++i) out[i] = rstd * w[i] * gv[i] - xv[i] * c;
      }
      store(io.gx, r * n, out.data(), n);
      if (!io.with_gw) continue;
      for (int i = 0; i < n; ++i) gw_sum.add(i, gv[i] * xv[i] * rstd);
      gw_sum.end_row(r, io.rows);
    }
    // gw: summed over all rows in fp32, cast once.
    if (io.with_gw) store(io.gw, 0, gw_sum.total.data(), n);
  });
}

}  // namespace mlx_rmsnorm
