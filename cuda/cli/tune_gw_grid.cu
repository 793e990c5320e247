// Tuning bench for the persistent backward's grid at few rows, without MLX:
//
//   tune_gw_grid [graphs]
//
// The planner sizes the persistent grid by the machine (SMs x resident
// blocks), so at 4096-8192 rows a block walks only 3-6 rows, and each block
// leaves a partial row of gw: 1320 partial rows of N fp32 for 4096 x 896,
// 40% of the bytes the backward must move, summed by a latency-bound column
// sum. This times the whole gw chain (persistent kernel + column sum, as the
// planner records it) with the grid capped so that each block walks at least
// R steps of rows, as a CUDA graph of kCalls back-to-back calls (the
// many-calls-per-eval case), and checks gx and gw against the uncapped grid.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backward.cuh"
#include "colsum.cuh"
#include "common.h"
#include "plans.h"

namespace {

using rmsnorm::plans::RowPlan;
using X = __nv_bfloat16;
constexpr int kCalls = 20;

struct Row {
  RowPlan plan;
  const void* fn;
};

// The kBackwardSm90 rows of the shapes below (plans.h), with their kernels.
template <std::size_t I>
Row table_row() {
  return {rmsnorm::plans::kBackwardSm90[I],
          rmsnorm::persistent_kernel_for<X, X, rmsnorm::RmsRow, rmsnorm::plans::kBackwardSm90,
                                         I>()};
}

}  // namespace

int main(int argc, char** argv) {
  const int graphs = argc > 1 ? std::atoi(argv[1]) : 15;
  struct Shape {
    int64_t m;
    int n;
    Row row;
  };
  const Row r1024 = table_row<5>(), r2048 = table_row<6>(), r4096 = table_row<7>();
  const Shape shapes[] = {{4096, 896, r1024},   {8192, 896, r1024},  {16384, 896, r1024},
                          {4096, 1024, r1024},  {8192, 1024, r1024}, {16384, 1024, r1024},
                          {4096, 2048, r2048},  {8192, 2048, r2048}, {4096, 4096, r4096},
                          {8192, 4096, r4096}};
  const int min_steps[] = {1, 2, 4, 8, 16};
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("%-11s %-22s %6s %6s %9s  %s\n", "shape", "row", ">=steps", "grid", "us/call",
              "check vs uncapped");
  int status = 0;
  for (const Shape& s : shapes) {
    const int64_t m = s.m;
    const int n = s.n;
    const RowPlan& p = s.row.plan;
    const size_t count = size_t(m) * n;
    X *x, *g, *w, *gx;
    float *partials, *gw;
    CHECK(cudaMalloc(&x, count * 2));
    CHECK(cudaMalloc(&g, count * 2));
    CHECK(cudaMalloc(&gx, count * 2));
    CHECK(cudaMalloc(&w, n * 2));
    CHECK(cudaMalloc(&gw, n * 4));
    CHECK(cudaMalloc(&partials, size_t(sms) * 32 * n * 4));
    cli::fill<<<1024, 256>>>(x, count, 1);
    cli::fill<<<1024, 256>>>(g, count, 2);
    cli::fill<<<64, 256>>>(w, n, 3);
    CHECK(cudaDeviceSynchronize());  // the inputs before `stream` (non-blocking) reads them
    const int nvec = n / 8;
    const size_t smem = rmsnorm::plans::persistent_smem(p, nvec, 1);
    CHECK(cudaFuncSetAttribute(s.row.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int occ = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, s.row.fn, p.block, smem));
    const int64_t steps = (m + p.block / p.group - 1) / (p.block / p.group);
    const int64_t full = std::min<int64_t>(int64_t(sms) * occ, steps);
    char label[32], rowname[40];
    std::snprintf(label, sizeof label, "%lldx%d", (long long)m, n);
    std::snprintf(rowname, sizeof rowname, "{%d,%d,%d,%d,%s}", p.block, p.group, p.chunks,
                  p.stages, p.bulk ? "bulk" : "async");
    std::vector<float> ref_gx, ref_gw;
    int64_t last_grid = -1;
    for (int r : min_steps) {
      const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(full, steps / r));
      if (grid == last_grid) continue;
      last_grid = grid;
      rmsnorm::BwdArgs a{};
      a.x = x; a.w = w; a.g = g; a.gx = gx; a.gw = gw;
      a.partials = partials;
      a.rows = m; a.n = n; a.eps = 1e-5f;
      a.x_dtype = a.w_dtype = a.g_dtype = rmsnorm::DType::BF16;
      a.partial_rows = int(grid);
      void* params[] = {&a};
      const auto sum = rmsnorm::colsum_launch<float, true>(n);
      auto call = [&](cudaStream_t st) {
        CHECK(cudaLaunchKernel(s.row.fn, dim3(grid), dim3(p.block), params, smem, st));
        CHECK(cudaLaunchKernel(sum.fn, sum.grid, sum.block, params, 0, st));
      };
      const double us = cli::graph_median_us(stream, kCalls, graphs, call);
      CHECK(cudaMemsetAsync(gx, 0xff, count * 2, stream));  // poison, in stream order
      CHECK(cudaMemsetAsync(gw, 0xff, n * 4, stream));
      call(stream);
      CHECK(cudaStreamSynchronize(stream));
      auto hx = cli::to_host(gx, count);
      auto hw = cli::to_host(gw, n);  // gw in w's dtype (bf16)
      char check[48] = "reference";
      if (ref_gx.empty()) {
        ref_gx = hx;
        ref_gw = hw;
      } else {
        const double dx = cli::max_rel_diff(hx, ref_gx), dw = cli::max_rel_diff(hw, ref_gw);
        const bool ok = dx <= 1e-2 && dw <= 1e-2;
        std::snprintf(check, sizeof check, "gx %.1e gw %.1e %s", dx, dw, ok ? "ok" : "DIFFER");
        if (!ok) status = 1;
      }
      std::printf("%-11s %-22s %6d %6lld %9.2f  %s\n", label, rowname, r, (long long)grid,
                  us, check);
    }
    for (void* q : {(void*)x, (void*)g, (void*)gx, (void*)w, (void*)gw, (void*)partials})
      CHECK(cudaFree(q));
    std::fflush(stdout);
  }
  return status;
}
