// LayerNorm beside RMSNorm, without MLX: checks and times our LayerNorm
// forward and backward next to our RMSNorm forward and backward and the copy
// ceilings, on the same bytes.
//
//   layer_norm_bench [--graphs G] [--shape MxN] [--only WORD] [--no-check]
//                    [--no-time] [--ncu]
//
// Check (first): the planned LayerNorm chains (plan_layer_forward /
// plan_layer_backward, row_math.cuh LayerRow) against a float64 host
// reference on small shapes (bf16, random and with an outlying first vector,
// the shift's worst kind of row), an fp32 row of mean 1000 and spread 1,
// add_layer_norm, and bitwise determinism.
//
// Time: at each shape (bf16, the LayerNorm table's shapes and four past one
// SM, where a row spans a thread-block cluster), a CUDA graph of
// kCalls back-to-back calls, median us per call over G replays (as MLX runs
// many calls in one eval), the inputs rotating over enough buffer sets that
// a graph's bytes are several times the L2. Rows: the ceilings (x + g: two
// reads and a write, the backward's bytes; a device copy of x: the forward's),
// our RMSNorm chains as planned, LayerNorm as planned, and candidates (new:
// LayerRow, regs: LayerRow with the weight in registers) at several grid caps
// (s>=k: each unit walks at least k steps). Each LayerNorm result is checked against the first one
// timed at the shape. --ncu launches each selected row three times, no graph
// (for `ncu -k regex:... --launch-skip 1 --launch-count 1`).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backward.cuh"
#include "colsum.cuh"
#include "common.h"
#include "dispatch.cuh"
#include "forward.cuh"
#include "plans.h"

namespace {

using rmsnorm::BwdArgs;
using rmsnorm::DType;
using rmsnorm::FwdArgs;
using rmsnorm::KernelCall;
using rmsnorm::Plan;
using rmsnorm::plans::RowPlan;
using rmsnorm::plans::upto;
using X = __nv_bfloat16;
constexpr int kCalls = 20;
constexpr float kEps = 1e-5f;

// New: LayerRow candidates (a row is tried where max_nvec covers the row
// without doubling it). block / group > 1: several rows a step, whose gw and
// gb partials the block adds before storing one row of each.
constexpr RowPlan kNew[] = {
    // N <= 768: 3 chunks of a warp
    upto(96).block(96).group(32).chunks(3).stages(2).bulk(),
    // N <= 1024
    upto(128).block(128).group(32).chunks(4).stages(2).bulk(),
    upto(128).block(128).group(32).chunks(4).stages(2),
    upto(128).block(256).group(64).chunks(2).stages(2).bulk(),
    upto(128).block(128).group(64).chunks(2).stages(2).bulk(),
    upto(128).block(256).group(32).chunks(4).stages(2).bulk(),
    // N <= 1280: 160 vectors (a block of 5 warps a row, or 3 rows of 2 warps x 3 chunks)
    upto(160).block(160).group(160).chunks(1).stages(2).bulk(),
    upto(160).block(320).group(160).chunks(1).stages(2).bulk(),
    upto(192).block(192).group(64).chunks(3).stages(2).bulk(),
    // N <= 2048
    upto(256).block(128).group(128).chunks(2).stages(2).bulk(),
    upto(256).block(256).group(128).chunks(2).stages(2).bulk(),
    upto(256).block(256).group(128).chunks(2).stages(2),
    upto(256).block(512).group(128).chunks(2).stages(2).bulk().min_blocks(2),
    upto(256).block(256).group(64).chunks(4).stages(2).bulk(),
    upto(256).block(256).group(128).chunks(2).stages(3).bulk(),
    // N <= 2560 / 3072
    upto(320).block(160).group(160).chunks(2).stages(2).bulk(),
    upto(320).block(320).group(160).chunks(2).stages(2).bulk(),
    upto(384).block(192).group(192).chunks(2).stages(2),
    upto(384).block(192).group(192).chunks(2).stages(2).bulk(),
    upto(384).block(384).group(192).chunks(2).stages(2),
    upto(384).block(384).group(192).chunks(2).stages(2).bulk(),
    upto(384).block(128).group(128).chunks(3).stages(2).bulk(),
    upto(384).block(192).group(192).chunks(2).stages(3).bulk(),
    // N <= 4096
    upto(512).block(256).group(256).chunks(2).stages(2).bulk(),
    upto(512).block(256).group(256).chunks(2).stages(3).bulk(),
    upto(512).block(512).group(256).chunks(2).stages(2).bulk(),
    // N <= 5120 (640 vectors)
    upto(640).block(320).group(320).chunks(2).stages(2),
    upto(640).block(320).group(320).chunks(2).stages(2).bulk(),
    upto(640).block(320).group(320).chunks(2).stages(3).bulk(),
    upto(640).block(160).group(160).chunks(4).stages(2).bulk(),
    upto(640).block(640).group(320).chunks(2).stages(2).bulk(),
    // N <= 8192
    upto(1024).block(256).group(256).chunks(4).stages(2).bulk(),
    upto(1024).block(512).group(256).chunks(4).stages(2).bulk(),
    upto(1024).block(512).group(512).chunks(2).stages(2).bulk().min_blocks(2),
    upto(1024).block(512).group(512).chunks(2).stages(3).bulk(),
    // N <= 16384
    upto(2048).block(512).group(512).chunks(4).stages(2).bulk(),
    upto(2048).block(1024).group(1024).chunks(2).stages(2).bulk(),
    // N <= 32768 .. 262144: a row a cluster (sm_90), per-thread copies. The
    // table's 512 x 4 slices of 2, 4 and 8 blocks (one block a SM: 192 KiB of
    // stages and weight) against smaller slices, two or more blocks a SM.
    upto(4096).block(512).group(512).chunks(4).stages(2).cluster(2),
    upto(4096).block(512).group(512).chunks(2).stages(2).cluster(4),
    upto(4096).block(256).group(256).chunks(4).stages(2).cluster(4),
    upto(4096).block(512).group(512).chunks(2).stages(3).cluster(4),
    upto(4096).block(512).group(512).chunks(1).stages(2).cluster(8),
    upto(4096).block(256).group(256).chunks(2).stages(2).cluster(8),
    upto(8192).block(512).group(512).chunks(4).stages(2).cluster(4),
    upto(8192).block(512).group(512).chunks(2).stages(2).cluster(8),
    upto(8192).block(256).group(256).chunks(4).stages(2).cluster(8),
    upto(8192).block(512).group(512).chunks(2).stages(3).cluster(8),
    upto(8192).block(256).group(256).chunks(2).stages(2).cluster(16),
    upto(16384).block(512).group(512).chunks(4).stages(2).cluster(8),
    upto(16384).block(1024).group(1024).chunks(2).stages(2).cluster(8),
    upto(16384).block(512).group(512).chunks(2).stages(2).cluster(16),
    upto(16384).block(256).group(256).chunks(4).stages(2).cluster(16),
    // N <= 262144: the table's 512 x 4 slices of 16 blocks against 1024 x 2
    upto(32768).block(512).group(512).chunks(4).stages(2).cluster(16),
    upto(32768).block(1024).group(1024).chunks(2).stages(2).cluster(16),
};
// The weight in registers (LayerRowWRegs): the fallback row of plans.h.
constexpr RowPlan kRegs[] = {
    upto(2048).block(1024).group(1024).chunks(2).stages(2).bulk(),
    // 512 x 4: 128 registers a thread where 1024 x 2 has 64 (and spills)
    upto(2048).block(512).group(512).chunks(4).stages(2).bulk(),
};
// add_layer_norm's backward past one SM (AddLayerRow: g_h staged beside x and
// g), the fp32 weight in shared memory: slices small enough that the stages
// and the weight leave room for two blocks a SM, against the planned rows
// (512 x 4 slices where they fit, else 512 x 2 or 512 x 4 with the weight in
// registers).
constexpr RowPlan kAddNew[] = {
    upto(4096).block(256).group(256).chunks(4).stages(2).cluster(4),
    upto(4096).block(256).group(256).chunks(4).stages(2).cluster(8),
    upto(4096).block(256).group(256).chunks(2).stages(2).cluster(8),
    upto(8192).block(256).group(256).chunks(4).stages(2).cluster(8),
    upto(8192).block(256).group(256).chunks(4).stages(2).cluster(16),
    upto(8192).block(256).group(256).chunks(2).stages(2).cluster(16),
    upto(16384).block(256).group(256).chunks(4).stages(2).cluster(16),
    upto(16384).block(512).group(512).chunks(2).stages(2).cluster(16),
};

// Forward rows: LayerRow candidates, w and b read as x (W_AS_X, as the
// planner does where both are in x's dtype, as here), on other shapes of row
// and with register caps (min_blocks). At N = 1280-2560 the planned 128 x 2 row takes 47 registers
// against RMSNorm's 40 (62.5% against 75% occupancy): a chunk a thread, a
// cap of 12 blocks a SM (<= 40 registers) and a row sized to 2560 are tried.
constexpr bool B = false;  // a block per step
// (Caps of 10-24 blocks a SM on the small rows spilled and lost on the H200
// before W_AS_X, docs/h200/2026-12-01-20c7c90/run2-bench.log.)
constexpr RowPlan kFwdNew[] = {
    upto(128).block(64).group(64).chunks(2).persistent(B),
    upto(128).block(128).group(32).chunks(4).persistent(B),
    upto(128).block(128).group(128).chunks(1).persistent(B),
    upto(160).block(160).group(160).chunks(1).persistent(B),
    upto(160).block(128).group(128).chunks(2).persistent(B).min_blocks(12),
    upto(256).block(128).group(128).chunks(2).persistent(B),
    upto(256).block(128).group(128).chunks(2).persistent(B).min_blocks(12),
    upto(256).block(256).group(256).chunks(1).persistent(B),
    upto(320).block(160).group(160).chunks(2).persistent(B).min_blocks(12),
    upto(320).block(320).group(320).chunks(1).persistent(B),
    upto(512).block(128).group(128).chunks(4).persistent(B),
    upto(512).block(256).group(256).chunks(2).persistent(B),
    upto(1024).block(256).group(256).chunks(4).persistent(B),
    upto(2048).block(512).group(512).chunks(4).persistent(B).min_blocks(2),
};

// Row i of T with w and b read as x where W_AS_X.
template <typename Row, const auto& T, bool W_AS_X>
const void* fwd_kernel(int i) {
  return rmsnorm::kernel_by_row<std::size(T)>(i, [](auto r) {
    constexpr std::size_t I = decltype(r)::value;
    return rmsnorm::fwd_kernel_for<X, X, Row, T, I, T[I].persistent, T[I].min_blocks, W_AS_X>();
  });
}

const char* row_name(const RowPlan& p, bool fwd) {
  static char buf[64];
  if (fwd && p.min_blocks > 0)
    std::snprintf(buf, sizeof buf, "{%d,%d,%d,>=%d/SM}", p.block, p.group, p.chunks,
                  p.min_blocks);
  else if (fwd)
    std::snprintf(buf, sizeof buf, "{%d,%d,%d}", p.block, p.group, p.chunks);
  else if (p.min_blocks > 0)
    std::snprintf(buf, sizeof buf, "{%d,%d,%d,%d,%s,>=%d/SM}", p.block, p.group, p.chunks,
                  p.stages, p.bulk ? "bulk" : "async", p.min_blocks);
  else if (p.cluster > 1)
    std::snprintf(buf, sizeof buf, "{%d,%d,%d,%d,%s,c%d}", p.block, p.group, p.chunks,
                  p.stages, p.bulk ? "bulk" : "async", p.cluster);
  else
    std::snprintf(buf, sizeof buf, "{%d,%d,%d,%d,%s}", p.block, p.group, p.chunks, p.stages,
                  p.bulk ? "bulk" : "async");
  return buf;
}

int sm_count() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  return sms;
}

// A persistent LayerNorm backward chain for one row plan, sized as
// layer_norm.cu sizes it: the walk, then one column sum of gw and gb.
// g_per_x: staged operands beside x (1: g; 2: g and the fused add's g_h).
Plan bwd_chain(const void* fn, const RowPlan& p, bool w_shared, int64_t m, int n,
               int min_steps, int g_per_x = 1) {
  const int nvec = n / 8;
  const int slice = (nvec + p.cluster - 1) / p.cluster;  // a block's vectors of a row
  const size_t smem = rmsnorm::plans::persistent_smem(p, nvec, g_per_x) +
                      (w_shared ? 4 * 8 * size_t(slice) : 0);
  Plan plan;
  // Units: resident blocks, or clusters of p.cluster blocks (the planner's
  // count, launch.cu), each leaving one partial row of gw and of gb.
  int units = 0;
  if (p.cluster > 1) {
    units = rmsnorm::detail::clusters_resident(fn, p.block, unsigned(smem));
  } else {
    int occ = 0;
    CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, p.block, smem));
    units = sm_count() * occ;
  }
  if (units == 0) return plan;
  const int64_t steps = (m + p.block / p.group - 1) / (p.block / p.group);
  const int64_t grid = std::min<int64_t>(units, std::max<int64_t>(1, steps / min_steps));
  plan.calls.push_back(KernelCall{fn, nullptr, dim3(grid * p.cluster), dim3(p.block),
                                  unsigned(smem), "layer_bwd_persistent", p.cluster});
  plan.partial_rows = int(grid);
  const auto sum = rmsnorm::colsum_launch<float, true, rmsnorm::kBothParts>(n);
  plan.calls.push_back(KernelCall{sum.fn, nullptr, sum.grid, sum.block, 0, "colsum_gw_gb"});
  return plan;
}

// --- float64 reference ---------------------------------------------------------

struct Ref {
  std::vector<double> y, gx, gw, gb;
};

Ref reference(const std::vector<float>& x, const std::vector<float>& w,
              const std::vector<float>& b, const std::vector<float>& g, int64_t m, int n) {
  Ref r{std::vector<double>(x.size()), std::vector<double>(x.size()),
        std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  std::vector<double> xh(n);
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = &x[i * n];
    const float* gr = &g[i * n];
    double mu = 0, var = 0;
    for (int j = 0; j < n; ++j) mu += xr[j];
    mu /= n;
    for (int j = 0; j < n; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    const double rstd = 1.0 / std::sqrt(var / n + kEps);
    double mgw = 0, c = 0;
    for (int j = 0; j < n; ++j) {
      xh[j] = (xr[j] - mu) * rstd;
      mgw += double(gr[j]) * w[j];
      c += double(gr[j]) * w[j] * xh[j];
    }
    mgw /= n;
    c /= n;
    for (int j = 0; j < n; ++j) {
      r.y[i * n + j] = xh[j] * w[j] + b[j];
      r.gx[i * n + j] = rstd * (double(gr[j]) * w[j] - mgw - xh[j] * c);
      r.gw[j] += double(gr[j]) * xh[j];
      r.gb[j] += gr[j];
    }
  }
  return r;
}

// max |a - ref| / max |ref|
double err(const std::vector<float>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(a[i] - ref[i]));
    den = std::max(den, std::fabs(ref[i]));
  }
  return den > 0 ? num / den : num;
}

template <typename T>
void* upload(const std::vector<float>& v) {
  std::vector<T> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = T(v[i]);
  void* d = nullptr;
  CHECK(cudaMalloc(&d, h.size() * sizeof(T)));
  CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <typename T>
std::vector<float> download(const void* d, size_t count) {
  std::vector<T> h(count);
  CHECK(cudaMemcpy(h.data(), d, count * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = float(h[i]);
  return out;
}
// Values as the device stores them (x rounded to T first).
template <typename T>
std::vector<float> rounded(std::vector<float> v) {
  for (auto& e : v) e = float(T(e));
  return v;
}

struct Outputs {
  std::vector<float> y, gx, gw, gb;
};

// Runs the planned forward and backward on host data of storage type T; w,
// b, gw, gb in T too.
template <typename T>
Outputs run_chains(const std::vector<float>& x, const std::vector<float>& w,
                   const std::vector<float>& b, const std::vector<float>& g, int64_t m, int n,
                   DType dt) {
  const size_t count = size_t(m) * n;
  void *dx = upload<T>(x), *dw = upload<T>(w), *db = upload<T>(b), *dg = upload<T>(g);
  void *dy, *dgx, *dgw, *dgb;
  CHECK(cudaMalloc(&dy, count * sizeof(T)));
  CHECK(cudaMalloc(&dgx, count * sizeof(T)));
  CHECK(cudaMalloc(&dgw, n * sizeof(T)));
  CHECK(cudaMalloc(&dgb, n * sizeof(T)));
  CHECK(cudaMemset(dy, 0xff, count * sizeof(T)));  // poison: every element is written
  CHECK(cudaMemset(dgx, 0xff, count * sizeof(T)));
  CHECK(cudaMemset(dgw, 0xff, n * sizeof(T)));
  CHECK(cudaMemset(dgb, 0xff, n * sizeof(T)));

  FwdArgs f{};
  f.x = dx; f.w = dw; f.y = dy; f.rows = m; f.n = n; f.eps = kEps;
  f.x_dtype = f.w_dtype = f.y_dtype = dt;
  f.b = db; f.b_dtype = dt;
  const Plan fp = rmsnorm::plan_layer_forward(f);
  CHECK(rmsnorm::launch(fp, &f, 0));

  BwdArgs a{};
  a.x = dx; a.w = dw; a.g = dg; a.gx = dgx; a.gw = dgw; a.gb = dgb;
  a.rows = m; a.n = n; a.eps = kEps;
  a.x_dtype = a.w_dtype = a.g_dtype = a.b_dtype = dt;
  const Plan bp = rmsnorm::plan_layer_backward(a);
  void* scratch = nullptr;
  CHECK(cudaMalloc(&scratch, std::max<size_t>(bp.scratch_bytes, 16)));
  rmsnorm::bind_scratch(a, bp, scratch);
  CHECK(rmsnorm::launch(bp, &a, 0));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaGetLastError());
  Outputs o{download<T>(dy, count), download<T>(dgx, count), download<T>(dgw, n),
            download<T>(dgb, n)};
  for (void* p : {dx, dw, db, dg, dy, dgx, dgw, dgb, scratch}) CHECK(cudaFree(p));
  return o;
}

// add_layer_norm on the planned chains: h = x + r (rounded to T), y =
// layer_norm(h); backward from h with gh: gx = gh + d(norm)/dh.
struct AddOutputs {
  std::vector<float> h, y, gx, gw, gb;
};
template <typename T>
AddOutputs run_add(const std::vector<float>& x, const std::vector<float>& r,
                   const std::vector<float>& w, const std::vector<float>& b,
                   const std::vector<float>& g, const std::vector<float>& gh, int64_t m, int n,
                   DType dt) {
  const size_t count = size_t(m) * n;
  void *dx = upload<T>(x), *dr = upload<T>(r), *dw = upload<T>(w), *db = upload<T>(b),
       *dg = upload<T>(g), *dgh = upload<T>(gh);
  void *dy, *dh, *dgx, *dgw, *dgb;
  for (void** p : {&dy, &dh, &dgx}) {
    CHECK(cudaMalloc(p, count * sizeof(T)));
    CHECK(cudaMemset(*p, 0xff, count * sizeof(T)));
  }
  for (void** p : {&dgw, &dgb}) {
    CHECK(cudaMalloc(p, n * sizeof(T)));
    CHECK(cudaMemset(*p, 0xff, n * sizeof(T)));
  }
  FwdArgs f{};
  f.x = dx; f.w = dw; f.y = dy; f.rows = m; f.n = n; f.eps = kEps;
  f.x_dtype = f.w_dtype = f.y_dtype = dt;
  f.b = db; f.b_dtype = dt;
  f.residual = dr; f.h = dh;
  CHECK(rmsnorm::launch(rmsnorm::plan_layer_forward(f), &f, 0));
  BwdArgs a{};
  a.x = dh; a.w = dw; a.g = dg; a.gx = dgx; a.gw = dgw; a.gb = dgb; a.gh = dgh;
  a.rows = m; a.n = n; a.eps = kEps;
  a.x_dtype = a.w_dtype = a.g_dtype = a.b_dtype = dt;
  const Plan bp = rmsnorm::plan_layer_backward(a);
  void* scratch = nullptr;
  CHECK(cudaMalloc(&scratch, std::max<size_t>(bp.scratch_bytes, 16)));
  rmsnorm::bind_scratch(a, bp, scratch);
  CHECK(rmsnorm::launch(bp, &a, 0));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaGetLastError());
  AddOutputs o{download<T>(dh, count), download<T>(dy, count), download<T>(dgx, count),
               download<T>(dgw, n), download<T>(dgb, n)};
  for (void* p : {dx, dr, dw, db, dg, dgh, dy, dh, dgx, dgw, dgb, scratch}) CHECK(cudaFree(p));
  return o;
}

int check_section() {
  int status = 0;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  auto randn = [&](size_t k, float mean, float scale) {
    std::vector<float> v(k);
    for (auto& e : v) e = mean + scale * normal(rng);
    return v;
  };
  std::printf("check against float64 (max |err| / max |ref|):\n");
  std::printf("%-26s %-8s %9s %9s %9s %9s  %s\n", "case", "policy", "y", "gx", "gw", "gb",
              "");
  struct Case {
    int64_t m;
    int n;
    int kind;  // 0 random, 1 an outlying first vector (the shift's worst kind)
  };
  const Case cases[] = {{300, 768, 0},  {257, 1024, 0}, {130, 2880, 0},  {200, 4096, 0},
                        {70, 8192, 0},  {40, 16384, 0}, {1000, 64, 0},   {999, 128, 0},
                        {200, 4096, 1}, {40, 16384, 1}};
  for (const Case& c : cases) {
    const size_t count = size_t(c.m) * c.n;
    auto x = rounded<X>(randn(count, 0.5f, 1.f));
    if (c.kind == 1)
      for (int64_t i = 0; i < c.m; ++i)
        for (int k = 0; k < 8; ++k) x[i * c.n + k] = 64.f;  // 8 elements far out
    auto w = rounded<X>(randn(c.n, 1.f, 0.5f));
    auto b = rounded<X>(randn(c.n, 0.f, 0.5f));
    auto g = rounded<X>(randn(count, 0.f, 1.f));
    const Ref ref = reference(x, w, b, g, c.m, c.n);
    char label[48];
    std::snprintf(label, sizeof label, "%lldx%d bf16%s", (long long)c.m, c.n,
                  c.kind ? " outlier" : "");
    {
      Outputs o = run_chains<X>(x, w, b, g, c.m, c.n, DType::BF16);
      const double e[4] = {err(o.y, ref.y), err(o.gx, ref.gx), err(o.gw, ref.gw),
                           err(o.gb, ref.gb)};
      // bf16 outputs: one rounding (2^-8 relative) plus the fp32 sums.
      bool ok = true;
      for (double v : e) ok = ok && std::isfinite(v) && v <= 1e-2;
      if (!ok) status = 1;
      std::printf("%-26s %-8s %9.2e %9.2e %9.2e %9.2e  %s\n", label, "planned", e[0], e[1],
                  e[2], e[3], ok ? "ok" : "FAIL");
    }
  }
  {
    // fp32 rows of mean 1000 and spread 1 (the large-mean test of the ops).
    const int64_t m = 64;
    const int n = 1024;
    auto x = randn(size_t(m) * n, 1000.f, 1.f);
    auto w = randn(n, 1.f, 0.5f), b = randn(n, 0.f, 0.5f), g = randn(size_t(m) * n, 0.f, 1.f);
    const Ref ref = reference(x, w, b, g, m, n);
    Outputs o = run_chains<float>(x, w, b, g, m, n, DType::F32);
    const double e[4] = {err(o.y, ref.y), err(o.gx, ref.gx), err(o.gw, ref.gw),
                         err(o.gb, ref.gb)};
    bool ok = true;
    for (double v : e) ok = ok && std::isfinite(v) && v <= 1e-4;
    if (!ok) status = 1;
    std::printf("%-26s %-8s %9.2e %9.2e %9.2e %9.2e  %s\n", "64x1024 fp32 mean 1000",
                "planned", e[0], e[1], e[2], e[3], ok ? "ok" : "FAIL");
  }
  // add_layer_norm against float64 of the norm of the rounded h, gh added.
  for (auto [m, n] : {std::pair<int64_t, int>{300, 768}, {257, 1024}, {130, 2880},
                      {70, 8192}, {999, 128}}) {
    const size_t count = size_t(m) * n;
    auto x = rounded<X>(randn(count, 0.5f, 1.f)), r = rounded<X>(randn(count, 0.f, 1.f));
    auto w = rounded<X>(randn(n, 1.f, 0.5f)), b = rounded<X>(randn(n, 0.f, 0.5f));
    auto g = rounded<X>(randn(count, 0.f, 1.f)), gh = rounded<X>(randn(count, 0.f, 1.f));
    std::vector<float> h(count);
    for (size_t i = 0; i < count; ++i) h[i] = float(X(x[i] + r[i]));
    Ref ref = reference(h, w, b, g, m, n);
    for (size_t i = 0; i < count; ++i) ref.gx[i] += gh[i];
    AddOutputs o = run_add<X>(x, r, w, b, g, gh, m, n, DType::BF16);
    const bool h_same = o.h == h;
    const double e[4] = {err(o.y, ref.y), err(o.gx, ref.gx), err(o.gw, ref.gw),
                         err(o.gb, ref.gb)};
    bool ok = h_same;
    for (double v : e) ok = ok && std::isfinite(v) && v <= 1e-2;
    if (!ok) status = 1;
    char label[48];
    std::snprintf(label, sizeof label, "%lldx%d bf16 add", (long long)m, n);
    std::printf("%-26s %-8s %9.2e %9.2e %9.2e %9.2e  h %s %s\n", label, "planned", e[0], e[1],
                e[2], e[3], h_same ? "exact" : "WRONG", ok ? "ok" : "FAIL");
  }
  {
    // Bitwise determinism of the planned chains.
    const int64_t m = 4096;
    const int n = 2048;
    auto x = randn(size_t(m) * n, 0.f, 1.f), g = randn(size_t(m) * n, 0.f, 1.f);
    auto w = randn(n, 1.f, 0.5f), b = randn(n, 0.f, 0.5f);
    Outputs o1 = run_chains<X>(x, w, b, g, m, n, DType::BF16);
    Outputs o2 = run_chains<X>(x, w, b, g, m, n, DType::BF16);
    const bool same = o1.y == o2.y && o1.gx == o2.gx && o1.gw == o2.gw && o1.gb == o2.gb;
    if (!same) status = 1;
    std::printf("%-26s %-8s %s\n", "4096x2048 twice", "planned",
                same ? "bitwise identical" : "DIFFER");
  }
  return status;
}

// --- timing ---------------------------------------------------------------------

struct Options {
  int graphs = 15;
  int64_t only_m = 0;
  int only_n = 0;
  std::string only;
  bool check = true, time = true, ncu = false;
};

struct Result {
  std::string label;
  double us;
};

int time_shape(const Options& opt, int64_t m, int n, std::vector<Result>& summary) {
  int status = 0;
  const size_t count = size_t(m) * n;
  const size_t set_bytes = 3 * count * 2;
  // Enough sets that one graph's inputs are several times the 60 MB L2.
  const int sets = opt.ncu ? 1 : int(std::min<size_t>(8, std::max<size_t>(1, (240u << 20) / set_bytes)));
  std::vector<X*> xs(sets), gs(sets), outs(sets), hs(sets);
  for (int s = 0; s < sets; ++s) {
    CHECK(cudaMalloc(&xs[s], count * 2));
    CHECK(cudaMalloc(&gs[s], count * 2));
    CHECK(cudaMalloc(&outs[s], count * 2));
    CHECK(cudaMalloc(&hs[s], count * 2));
    cli::fill<<<1024, 256>>>(xs[s], count, 1 + 2 * s);
    cli::fill<<<1024, 256>>>(gs[s], count, 2 + 2 * s);
    cli::fill<<<1024, 256>>>(hs[s], count, 50 + s);
  }
  X *w, *b, *gw, *gb;
  CHECK(cudaMalloc(&w, n * 2));
  CHECK(cudaMalloc(&b, n * 2));
  CHECK(cudaMalloc(&gw, n * 2));
  CHECK(cudaMalloc(&gb, n * 2));
  cli::fill<<<64, 256>>>(w, n, 100);
  cli::fill<<<64, 256>>>(b, n, 101);
  float* scratch;
  const int sms = sm_count();
  CHECK(cudaMalloc(&scratch, size_t(sms) * 32 * 2 * n * 4));
  CHECK(cudaDeviceSynchronize());
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  char shape[32];
  std::snprintf(shape, sizeof shape, "%lldx%d", (long long)m, n);
  const double bwd_bytes = 3.0 * count * 2, fwd_bytes = 2.0 * count * 2;
  double ceil_bwd = 0, ceil_fwd = 0;

  // Times `launch(stream, set)` (a graph of kCalls calls over the sets).
  auto timed = [&](const std::string& label, auto launch) -> double {
    if (!opt.only.empty() && label.find(opt.only) == std::string::npos &&
        label.find("ceil") == std::string::npos)
      return -1;
    if (opt.ncu) {
      for (int k = 0; k < 3; ++k) launch(stream, 0);
      CHECK(cudaStreamSynchronize(stream));
      std::printf("%-12s %-44s launched\n", shape, label.c_str());
      return -1;
    }
    int call = 0;
    const double us = cli::graph_median_us(stream, kCalls, opt.graphs, [&](cudaStream_t st) {
      launch(st, call++ % sets);
    });
    CHECK(cudaGetLastError());
    return us;
  };
  auto print = [&](const std::string& label, double us, double bytes, double ceil,
                   const char* check) {
    if (us < 0) return;
    std::printf("%-12s %-44s %8.1f %6.0f %6.1f%% %s\n", shape, label.c_str(), us,
                bytes / us / 1e3, ceil > 0 ? 100.0 * ceil / us : 0.0, check);
    summary.push_back({std::string(shape) + " " + label, us});
  };

  // Ceilings.
  {
    std::vector<rmsnorm::CopyArgs> c(sets);
    std::vector<Plan> p(sets);
    for (int s = 0; s < sets; ++s) {
      c[s] = rmsnorm::CopyArgs{xs[s], gs[s], outs[s], int64_t(count), DType::BF16};
      p[s] = rmsnorm::plan_copy(c[s]);
    }
    ceil_bwd = timed("ceil x+g", [&](cudaStream_t st, int s) {
      CHECK(rmsnorm::launch(p[s], &c[s], st));
    });
    print("ceil x+g", ceil_bwd, bwd_bytes, ceil_bwd, "");
    ceil_fwd = timed("ceil copy x", [&](cudaStream_t st, int s) {
      CHECK(cudaMemcpyAsync(outs[s], xs[s], count * 2, cudaMemcpyDeviceToDevice, st));
    });
    print("ceil copy x", ceil_fwd, fwd_bytes, ceil_fwd, "");
  }

  auto bwd_args = [&](int s) {
    BwdArgs a{};
    a.x = xs[s]; a.w = w; a.g = gs[s]; a.gx = outs[s]; a.gw = gw; a.gb = gb;
    a.rows = m; a.n = n; a.eps = kEps;
    a.x_dtype = a.w_dtype = a.g_dtype = a.b_dtype = DType::BF16;
    a.partials = scratch;
    return a;
  };
  auto fwd_args = [&](int s) {
    FwdArgs f{};
    f.x = xs[s]; f.w = w; f.y = outs[s]; f.rows = m; f.n = n; f.eps = kEps;
    f.x_dtype = f.w_dtype = f.y_dtype = DType::BF16;
    f.b = b; f.b_dtype = DType::BF16;
    return f;
  };

  // RMSNorm as planned (gw wanted).
  {
    BwdArgs a = bwd_args(0);
    a.gb = nullptr;
    const Plan p = rmsnorm::plan_backward(a, rmsnorm::Algorithm::Auto);
    const double us = timed("rms bwd", [&](cudaStream_t st, int s) {
      BwdArgs as = bwd_args(s);
      as.gb = nullptr;
      as.partial_rows = p.partial_rows;
      CHECK(rmsnorm::launch(p, &as, st));
    });
    print("rms bwd", us, bwd_bytes, ceil_bwd, "");
    FwdArgs f = fwd_args(0);
    f.b = nullptr;
    const Plan fp = rmsnorm::plan_forward(f);
    const double fus = timed("rms fwd", [&](cudaStream_t st, int s) {
      FwdArgs fs = fwd_args(s);
      fs.b = nullptr;
      CHECK(rmsnorm::launch(fp, &fs, st));
    });
    print("rms fwd", fus, fwd_bytes, ceil_fwd, "");
  }

  // LayerNorm backward variants; each checked against the first one run.
  std::vector<float> ref_gx, ref_gw, ref_gb;
  auto bwd_variant = [&](const std::string& label, const Plan& p) {
    const double us = timed(label, [&](cudaStream_t st, int s) {
      BwdArgs as = bwd_args(s);
      as.partial_rows = p.partial_rows;
      CHECK(rmsnorm::launch(p, &as, st));
    });
    if (us < 0 && !opt.ncu) return;
    char check[64] = "";
    if (!opt.ncu) {
      CHECK(cudaMemsetAsync(outs[0], 0xff, count * 2, stream));  // poison
      CHECK(cudaMemsetAsync(gw, 0xff, n * 2, stream));
      CHECK(cudaMemsetAsync(gb, 0xff, n * 2, stream));
      BwdArgs a0 = bwd_args(0);
      a0.partial_rows = p.partial_rows;
      CHECK(rmsnorm::launch(p, &a0, stream));
      CHECK(cudaStreamSynchronize(stream));
      // gx: the first 4M elements (the whole of it costs seconds a row at
      // the large shapes); gw and gb sum every row.
      auto hx = cli::to_host(outs[0], std::min<size_t>(count, 1 << 22)),
           hw = cli::to_host(gw, n), hb = cli::to_host(gb, n);
      if (ref_gx.empty()) {
        ref_gx = hx;
        ref_gw = hw;
        ref_gb = hb;
        std::snprintf(check, sizeof check, "reference");
      } else {
        const double dx = cli::max_rel_diff(hx, ref_gx), dw = cli::max_rel_diff(hw, ref_gw),
                     db = cli::max_rel_diff(hb, ref_gb);
        const bool ok = dx <= 1e-2 && dw <= 1e-2 && db <= 1e-2;
        std::snprintf(check, sizeof check, "gx %.0e gw %.0e gb %.0e %s", dx, dw, db,
                      ok ? "ok" : "DIFFER");
        if (!ok) status = 1;
      }
    }
    print(label + " g" + std::to_string(p.calls.empty() ? 0 : p.calls[0].grid.x), us, bwd_bytes,
          ceil_bwd, check);
  };
  const int nvec = n / 8;
  {
    BwdArgs a = bwd_args(0);
    const Plan p = rmsnorm::plan_layer_backward(a);
    bwd_variant("ln bwd planned", p);
  }
  auto candidates = [&](const auto& table, auto kernel_of, const char* tag, bool w_shared,
                        std::initializer_list<int> min_steps) {
    for (int i = 0; i < int(std::size(table)); ++i) {
      const RowPlan& p = table[i];
      if (p.max_nvec < nvec || p.max_nvec >= 2 * nvec) continue;
      const void* fn = kernel_of(i);
      int last_grid = -1;
      for (int s : min_steps) {
        Plan plan = bwd_chain(fn, p, w_shared, m, n, s);
        if (plan.calls.empty()) {
          std::printf("%-12s ln bwd %s %s does not fit\n", shape, tag, row_name(p, false));
          break;
        }
        if (int(plan.calls[0].grid.x) == last_grid) continue;
        last_grid = plan.calls[0].grid.x;
        bwd_variant(std::string("ln bwd ") + tag + " " + row_name(p, false) + " s>=" +
                        std::to_string(s),
                    plan);
      }
    }
  };
  candidates(
      kNew,
      [](int i) {
        return rmsnorm::persistent_kernel_for<X, X, rmsnorm::LayerRow, kNew>(i);
      },
      "new", true, {1, 2, 4, 8, 16, 32});
  candidates(
      kRegs,
      [](int i) {
        return rmsnorm::persistent_kernel_for<X, X, rmsnorm::LayerRowWRegs, kRegs>(i);
      },
      "regs", false, {1});

  // LayerNorm forward variants.
  std::vector<float> ref_y;
  auto fwd_variant = [&](const std::string& label, const Plan& p) {
    const double us = timed(label, [&](cudaStream_t st, int s) {
      FwdArgs fs = fwd_args(s);
      CHECK(rmsnorm::launch(p, &fs, st));
    });
    if (us < 0 && !opt.ncu) return;
    char check[48] = "";
    if (!opt.ncu) {
      CHECK(cudaMemsetAsync(outs[0], 0xff, count * 2, stream));
      FwdArgs f0 = fwd_args(0);
      CHECK(rmsnorm::launch(p, &f0, stream));
      CHECK(cudaStreamSynchronize(stream));
      auto hy = cli::to_host(outs[0], std::min<size_t>(count, 1 << 22));
      if (ref_y.empty()) {
        ref_y = hy;
        std::snprintf(check, sizeof check, "reference");
      } else {
        const double d = cli::max_rel_diff(hy, ref_y);
        const bool ok = d <= 1e-2;
        std::snprintf(check, sizeof check, "y %.0e %s", d, ok ? "ok" : "DIFFER");
        if (!ok) status = 1;
      }
    }
    print(label, us, fwd_bytes, ceil_fwd, check);
  };
  auto fwd_plan = [&](const void* fn, const RowPlan& p) {
    Plan plan;
    const int rows_per_step = p.block / p.group;
    plan.calls.push_back(KernelCall{fn, nullptr, dim3((m + rows_per_step - 1) / rows_per_step),
                                    dim3(p.block), 0, "layer_fwd_rows"});
    return plan;
  };
  {
    FwdArgs f = fwd_args(0);
    fwd_variant("ln fwd planned", rmsnorm::plan_layer_forward(f));
    for (int k = 0; k < int(std::size(kFwdNew)); ++k) {
      const RowPlan& p = kFwdNew[k];
      if (p.max_nvec < nvec || p.max_nvec >= 2 * nvec) continue;
      fwd_variant(std::string("ln fwd new ") + row_name(p, true),
                  fwd_plan(fwd_kernel<rmsnorm::LayerRow, kFwdNew, true>(k), p));
    }
  }
  // add_layer_norm as planned (residual = g's buffer, g_h = x's: any data):
  // four tensors of traffic each way, against 4/3 of the x + g ceiling.
  {
    const double add_bytes = 4.0 * count * 2, add_ceil = ceil_bwd * 4 / 3;
    FwdArgs f = fwd_args(0);
    f.residual = gs[0];
    f.h = hs[0];
    const Plan fp = rmsnorm::plan_layer_forward(f);
    const double fus = timed("add ln fwd planned", [&](cudaStream_t st, int s) {
      FwdArgs fs = fwd_args(s);
      fs.residual = gs[s];
      fs.h = hs[s];
      CHECK(rmsnorm::launch(fp, &fs, st));
    });
    print("add ln fwd planned", fus, add_bytes, add_ceil, "");
    BwdArgs a = bwd_args(0);
    a.gh = xs[0];
    const Plan bp = rmsnorm::plan_layer_backward(a);
    const double bus = timed("add ln bwd planned", [&](cudaStream_t st, int s) {
      BwdArgs as = bwd_args(s);
      as.x = hs[s];
      as.gh = xs[s];
      as.partial_rows = bp.partial_rows;
      CHECK(rmsnorm::launch(bp, &as, st));
    });
    print("add ln bwd planned", bus, add_bytes, add_ceil, "");
    // Candidates past one SM, checked against the planned chain's gx.
    std::vector<float> ref_add;
    for (int i = 0; i < int(std::size(kAddNew)); ++i) {
      const RowPlan& p = kAddNew[i];
      if (p.max_nvec < nvec || p.max_nvec >= 2 * nvec) continue;
      const Plan cp = bwd_chain(
          rmsnorm::persistent_kernel_for<X, X, rmsnorm::AddLayerRow, kAddNew>(i), p, true, m, n,
          1, 2);
      const std::string label = std::string("add ln bwd new ") + row_name(p, false);
      if (cp.calls.empty()) {
        std::printf("%-12s %s does not fit\n", shape, label.c_str());
        continue;
      }
      auto run = [&](const Plan& plan, cudaStream_t st, int s) {
        BwdArgs as = bwd_args(s);
        as.x = hs[s];
        as.gh = xs[s];
        as.partial_rows = plan.partial_rows;
        CHECK(rmsnorm::launch(plan, &as, st));
      };
      const double us = timed(label, [&](cudaStream_t st, int s) { run(cp, st, s); });
      char check[48] = "";
      if (us >= 0 && !opt.ncu) {
        if (ref_add.empty()) {
          run(bp, stream, 0);
          CHECK(cudaStreamSynchronize(stream));
          ref_add = cli::to_host(outs[0], std::min<size_t>(count, 1 << 22));
        }
        CHECK(cudaMemsetAsync(outs[0], 0xff, count * 2, stream));
        run(cp, stream, 0);
        CHECK(cudaStreamSynchronize(stream));
        const double d =
            cli::max_rel_diff(cli::to_host(outs[0], std::min<size_t>(count, 1 << 22)), ref_add);
        std::snprintf(check, sizeof check, "gx %.0e %s", d, d <= 1e-2 ? "ok" : "DIFFER");
        if (d > 1e-2) status = 1;
      }
      print(label + " g" + std::to_string(cp.calls[0].grid.x), us, add_bytes, add_ceil, check);
    }
  }
  std::fflush(stdout);

  CHECK(cudaStreamDestroy(stream));
  for (int s = 0; s < sets; ++s)
    for (void* p : {(void*)xs[s], (void*)gs[s], (void*)outs[s], (void*)hs[s]}) CHECK(cudaFree(p));
  for (void* p : {(void*)w, (void*)b, (void*)gw, (void*)gb, (void*)scratch}) CHECK(cudaFree(p));
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--graphs" && i + 1 < argc) {
      opt.graphs = std::atoi(argv[++i]);
    } else if (arg == "--shape" && i + 1 < argc) {
      long long m = 0;
      int n = 0;
      if (std::sscanf(argv[++i], "%lldx%d", &m, &n) != 2) {
        std::fprintf(stderr, "--shape wants MxN\n");
        return 2;
      }
      opt.only_m = m;
      opt.only_n = n;
    } else if (arg == "--only" && i + 1 < argc) {
      opt.only = argv[++i];
    } else if (arg == "--no-check") {
      opt.check = false;
    } else if (arg == "--no-time") {
      opt.time = false;
    } else if (arg == "--ncu") {
      opt.ncu = true;
      opt.check = false;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--graphs G] [--shape MxN] [--only WORD] [--no-check] "
                   "[--no-time] [--ncu]\n",
                   argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, L2 %d MB | bf16 | graphs of %d calls, median of %d\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, kCalls, opt.graphs);
  int status = 0;
  if (opt.check) status |= check_section();
  if (!opt.time) return status;
  // The LayerNorm table's shapes (rows x hidden).
  const std::pair<int64_t, int> shapes[] = {
      {8192, 768},  {8192, 1024}, {16384, 1280}, {8192, 2048},  {8192, 2880},
      {8192, 4096}, {16384, 4096}, {4096, 8192}, {16384, 8192}, {8192, 16384},
      {8192, 2560}, {8192, 5120},
      // past one SM: the cluster rows (sm_90)
      {4096, 24576}, {4096, 32768}, {2048, 65536}, {1024, 131072}, {512, 262144}};
  std::printf("\n%-12s %-44s %8s %6s %7s %s\n", "shape", "what", "us", "GB/s", "%ceil",
              "check");
  std::vector<Result> summary;
  for (auto [m, n] : shapes) {
    if (opt.only_n && (m != opt.only_m || n != opt.only_n)) continue;
    status |= time_shape(opt, m, n, summary);
  }
  if (opt.ncu) return status;
  // Summary: per shape, the ceilings, RMSNorm, LayerNorm planned, and the
  // fastest new candidate, with LayerNorm / RMSNorm.
  std::printf("\nsummary (us per call; ratio = LayerNorm / our RMSNorm)\n");
  std::printf("%-12s %8s %8s %8s %6s %8s %6s | %8s %8s %8s %6s\n", "shape", "ceil", "rms bwd",
              "planned", "ratio", "best", "ratio", "ceil", "rms fwd", "planned", "ratio");
  for (auto [m, n] : shapes) {
    if (opt.only_n && (m != opt.only_m || n != opt.only_n)) continue;
    char shape[32];
    std::snprintf(shape, sizeof shape, "%lldx%d ", (long long)m, n);
    auto find = [&](const char* what, bool prefix) {
      double best = -1;
      for (const Result& r : summary) {
        if (r.label.rfind(shape, 0) != 0) continue;
        const std::string rest = r.label.substr(std::strlen(shape));
        const bool hit = prefix ? rest.rfind(what, 0) == 0 : rest == what;
        if (hit && (best < 0 || r.us < best)) best = r.us;
      }
      return best;
    };
    const double cb = find("ceil x+g", false), rb = find("rms bwd", false),
                 pb = find("ln bwd planned", true), nb = find("ln bwd new", true),
                 cf = find("ceil copy x", false), rf = find("rms fwd", false),
                 pf = find("ln fwd planned", false);
    std::printf("%-12s %8.1f %8.1f %8.1f %6.2f %8.1f %6.2f | %8.1f %8.1f %8.1f %6.2f\n", shape,
                cb, rb, pb, pb / rb, nb, nb / rb, cf, rf, pf, pf / rf);
  }
  return status;
}
