// CPU evaluation of the LayerNorm family (LayerNorm, LayerNormVJP; the fused
// residual add is their `add`): fp32 accumulation, rows one at a time on
// MLX's CPU stream, the formulas of row_math.cuh's LayerRow (the mean first,
// then the centred sums). One row code for both, so that add_layer_norm's y
// is layer_norm's of the same h bit for bit.
#include <cmath>
#include <vector>

#include "cpu_util.h"
#include "primitives.h"

namespace mlx_rmsnorm {

using namespace cpu;

// y = (x - mean) * rstd * w + b; with add, of h = x + residual as stored.
void LayerNorm::eval_cpu(const std::vector<mx::array>& inputs,
                         std::vector<mx::array>& outputs) {
  auto& enc = begin(stream(), inputs, outputs);
  enc.dispatch([io = ForwardRows(*this, inputs, outputs)]() mutable {
    const int n = io.n;
    std::vector<float> xv(n), rv(io.add ? n : 0), w(n, 1.f), b(n, 0.f);
    if (io.has_w) io.w.load(0, n, w.data());
    if (io.has_b) io.b.load(0, n, b.data());
    for (int64_t r = 0; r < io.rows; ++r) {
      io.load(r, xv.data(), rv.data());
      const float mean = blocked_sum(n, [&](int i) { return xv[i]; }) / n;
      const float var = blocked_sum(n, [&](int i) {
                          const float d = xv[i] - mean;
                          return d * d;
                        }) / n;
      const float rstd = 1.f / std::sqrt(var + io.eps);
      for (int i = 0; i < n; ++i) xv[i] = (xv[i] - mean) * rstd * w[i] + b[i];
      store(io.y, r * n, xv.data(), n);
    }
  });
}

// gx = rstd * (g w - mean(g w) - xh mean(g w xh)); with add, x is the
// forward's h and g_h is added (one rounding, as the kernels' gx_out).
// gw = sum over rows of g xh, gb = sum over rows of g.
void LayerNormVJP::eval_cpu(const std::vector<mx::array>& inputs,
                            std::vector<mx::array>& outputs) {
  auto& enc = begin(stream(), inputs, outputs);
  enc.dispatch([io = BackwardRows(*this, inputs, outputs)]() mutable {
    const int n = io.n;
    std::vector<float> xv(n), gv(n), ghv(io.add ? n : 0), w(n, 1.f), out(n);
    // Column sums in blocks of rows, as the GPU's per-unit partials are.
    ColumnSum gw_sum(io.with_gw ? n : 0), gb_sum(io.with_gb ? n : 0);
    if (io.has_w) io.w.load(0, n, w.data());
    for (int64_t r = 0; r < io.rows; ++r) {
      io.x.load(r, n, xv.data());
      io.g.load(r, n, gv.data());
      if (io.add) io.gh.load(r, n, ghv.data());
      const float mean = blocked_sum(n, [&](int i) { return xv[i]; }) / n;
      const float mgw = blocked_sum(n, [&](int i) { return gv[i] * w[i]; }) / n;
      const float var = blocked_sum(n, [&](int i) {
                          const float d = xv[i] - mean;
                          return d * d;
                        }) / n;
      const float rstd = 1.f / std::sqrt(var + io.eps);
      const float c =
          blocked_sum(n, [&](int i) { return gv[i] * w[i] * (xv[i] - mean); }) / n * rstd;
      for (int i = 0; i < n; ++i) {
        const float xh = (xv[i] - mean) * rstd;
        out[i] = rstd * (gv[i] * w[i] - mgw - xh * c);
        if (io.add) out[i] += ghv[i];
        if (io.with_gw) gw_sum.add(i, gv[i] * xh);
        if (io.with_gb) gb_sum.add(i, gv[i]);
      }
      store(io.gx, r * n, out.data(), n);
      gw_sum.end_row(r, io.rows);
      gb_sum.end_row(r, io.rows);
    }
    if (io.with_gw) store(io.gw, 0, gw_sum.total.data(), n);
    if (io.with_gb) store(io.gb, 0, gb_sum.total.data(), n);
  });
}

}  // namespace mlx_rmsnorm
