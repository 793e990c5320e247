// CPU evaluation of the LayerNorm primitives: fp32 accumulation, rows one at
// a time on MLX's CPU stream, the formulas of row_math.cuh's LayerRow (the
// mean first, then the centred sums). The row code serves the fused residual
// add too (layer_norm_cpu.h).
#include "layer_norm_cpu.h"

#include <cmath>
#include <vector>

#include "cpu_util.h"
#include "layer_norm.h"
#include "layer_norm_vjp.h"

namespace mlx_rmsnorm {

namespace cpu {

void layer_forward(NormPrimitive& prim, const std::vector<mx::array>& inputs,
                   std::vector<mx::array>& outputs, bool add) {
  const mx::array& x = inputs[0];
  auto& enc = begin(prim.stream(), inputs, outputs);

  const int n = x.shape(-1);
  const int64_t rows = row_count(x);
  const auto w_in = prim.weight(inputs), b_in = prim.bias(inputs);
  const bool has_w = w_in.has_value(), has_b = b_in.has_value();
  const float eps = prim.eps();
  Rows xr = Rows::of(x);
  Rows rr = Rows::of(add ? inputs[1] : x);
  Rows wr = Rows::of(has_w ? *w_in : x);
  Rows br = Rows::of(has_b ? *b_in : x);
  auto y = mx::array::unsafe_weak_copy(outputs[0]);
  auto h = mx::array::unsafe_weak_copy(outputs.back());
  const mx::Dtype h_type = h.dtype();
  enc.dispatch([=]() mutable {
    std::vector<float> xv(n), rv(add ? n : 0), w(n, 1.f), b(n, 0.f);
    if (has_w) wr.load(0, n, w.data());
    if (has_b) br.load(0, n, b.data());
    for (int64_t r = 0; r < rows; ++r) {
      xr.load(r, n, xv.data());
      if (add) {
        rr.load(r, n, rv.data());
        for (int i = 0; i < n; ++i) xv[i] = round_to(h_type, xv[i] + rv[i]);
        store(h, r * n, xv.data(), n);
      }
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

void layer_backward(NormPrimitive& prim, const std::vector<mx::array>& inputs,
                    std::vector<mx::array>& outputs, bool add) {
  const mx::array& x = inputs[0];
  const mx::array& g = prim.tail(inputs, 0);
  const mx::array& gh = add ? prim.tail(inputs, 1) : g;
  auto& enc = begin(prim.stream(), inputs, outputs);

  const int n = x.shape(-1);
  const int64_t rows = row_count(x);
  const auto w_in = prim.weight(inputs);
  const bool has_w = w_in.has_value(), with_gw = prim.has_gw(), with_gb = prim.need_gb();
  const float eps = prim.eps();
  Rows xr = Rows::of(x), gr = Rows::of(g), ghr = Rows::of(gh);
  Rows wr = Rows::of(has_w ? *w_in : x);
  auto gx = mx::array::unsafe_weak_copy(outputs[0]);
  auto gw = with_gw ? mx::array::unsafe_weak_copy(outputs[1]) : gx;
  auto gb = with_gb ? mx::array::unsafe_weak_copy(outputs.back()) : gx;
  enc.dispatch([=]() mutable {
    std::vector<float> xv(n), gv(n), ghv(add ? n : 0), w(n, 1.f), out(n);
    // Column sums in blocks of rows, as the GPU's per-unit partials are.
    ColumnSum gw_sum(with_gw ? n : 0), gb_sum(with_gb ? n : 0);
    if (has_w) wr.load(0, n, w.data());
    for (int64_t r = 0; r < rows; ++r) {
      xr.load(r, n, xv.data());
      gr.load(r, n, gv.data());
      if (add) ghr.load(r, n, ghv.data());
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
        if (add) out[i] += ghv[i];  // one rounding of g_h + d(norm)/dh, as gx_out
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

}  // namespace cpu

void LayerNorm::eval_cpu(const std::vector<mx::array>& inputs,
                         std::vector<mx::array>& outputs) {
  cpu::layer_forward(*this, inputs, outputs, /*add=*/false);
}

void LayerNormVJP::eval_cpu(const std::vector<mx::array>& inputs,
                            std::vector<mx::array>& outputs) {
  cpu::layer_backward(*this, inputs, outputs, /*add=*/false);
}

}  // namespace mlx_rmsnorm
