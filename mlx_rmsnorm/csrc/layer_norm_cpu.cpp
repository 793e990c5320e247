// CPU evaluation of the LayerNorm primitives: fp32 accumulation, rows one at
// a time on MLX's CPU stream, the formulas of row_math.cuh's LayerRow (the
// mean first, then the centred sums).
#include <cmath>
#include <vector>

#include "cpu_util.h"
#include "layer_norm.h"
#include "layer_norm_vjp.h"

namespace mlx_rmsnorm {

using namespace cpu;

void LayerNorm::eval_cpu(const std::vector<mx::array>& inputs,
                         std::vector<mx::array>& outputs) {
  const mx::array& x = inputs[0];
  mx::array& y = outputs[0];
  auto& enc = begin(stream(), inputs, outputs);

  const int n = x.shape(-1);
  const int64_t rows = row_count(x);
  const bool has_w = has_weight(), has_b = has_bias();
  const float eps = this->eps();
  Rows xr = Rows::of(x);
  Rows wr = Rows::of(has_w ? inputs[1] : x);
  Rows br = Rows::of(has_b ? inputs[has_w ? 2 : 1] : x);
  enc.dispatch([=, y = mx::array::unsafe_weak_copy(y)]() mutable {
    std::vector<float> xv(n), w(n, 1.f), b(n, 0.f);
    if (has_w) wr.load(0, n, w.data());
    if (has_b) br.load(0, n, b.data());
    for (int64_t r = 0; r < rows; ++r) {
      xr.load(r, n, xv.data());
      const float mean = blocked_sum(n, [&](int i) { return xv[i]; }) / n;
      const float var = blocked_sum(n, [&](int i) {
                          const float d = xv[i] - mean;
                          return d * d;
                        }) / n;
      const float rstd = 1.f / std::sqrt(var + eps);
      for (int i = 0; i < n; ++i) xv[i] = (xv[i] - mean) * rstd * w[i] + b[i];
      store(y, r * n, xv.data(), n);
    }
  });
}

void LayerNormVJP::eval_cpu(const std::vector<mx::array>& inputs,
                            std::vector<mx::array>& outputs) {
  const mx::array& x = inputs[0];
  const mx::array& g = inputs.back();
  auto& enc = begin(stream(), inputs, outputs);

  const int n = x.shape(-1);
  const int64_t rows = row_count(x);
  const bool has_w = has_weight(), with_gw = has_gw(), with_gb = need_gb();
  const float eps = this->eps();
  Rows xr = Rows::of(x), gr = Rows::of(g);
  Rows wr = Rows::of(has_w ? inputs[1] : x);
  auto gx = mx::array::unsafe_weak_copy(outputs[0]);
  auto gw = with_gw ? mx::array::unsafe_weak_copy(outputs[1]) : gx;
  auto gb = with_gb ? mx::array::unsafe_weak_copy(outputs.back()) : gx;
  enc.dispatch([=]() mutable {
    std::vector<float> xv(n), gv(n), w(n, 1.f), out(n);
    // Column sums in blocks of rows, as the GPU's per-unit partials are.
    ColumnSum gw_sum(with_gw ? n : 0), gb_sum(with_gb ? n : 0);
    if (has_w) wr.load(0, n, w.data());
    for (int64_t r = 0; r < rows; ++r) {
      xr.load(r, n, xv.data());
      gr.load(r, n, gv.data());
      const float mean = blocked_sum(n, [&](int i) { return xv[i]; }) / n;
      const float mgw = blocked_sum(n, [&](int i) { return gv[i] * w[i]; }) / n;
      const float var = blocked_sum(n, [&](int i) {
                          const float d = xv[i] - mean;
                          return d * d;
                        }) / n;
      const float rstd = 1.f / std::sqrt(var + eps);
      const float c =
          blocked_sum(n, [&](int i) { return gv[i] * w[i] * (xv[i] - mean); }) / n * rstd;
      for (int i = 0; i < n; ++i) {
        const float xh = (xv[i] - mean) * rstd;
        out[i] = rstd * (gv[i] * w[i] - mgw - xh * c);
        if (with_gw) gw_sum.add(i, gv[i] * xh);
        if (with_gb) gb_sum.add(i, gv[i]);
      }
      store(gx, r * n, out.data(), n);
      gw_sum.end_row(r, rows);
      gb_sum.end_row(r, rows);
    }
    if (with_gw) store(gw, 0, gw_sum.total.data(), n);
    if (with_gb) store(gb, 0, gb_sum.total.data(), n);
  });
}

}  // namespace mlx_rmsnorm
