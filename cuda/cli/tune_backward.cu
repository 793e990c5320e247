// Tuning bench for the persistent backward's launch plans, without MLX:
//
//   tune_backward [iters]
//
// For each benchmark shape (bf16) it times every candidate configuration
// below that fits the row, next to our copy ceiling (bandwidth.cuh: the same
// bytes, two reads and one write), and checks each candidate's gx and gw
// against the first one. The persistent kernel alone is timed (CUDA events,
// median), so the table shows what a plan entry is worth; plans.h takes the
// winners. Grids are sized as the planner sizes them (SMs x resident blocks).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "backward.cuh"
#include "bandwidth.cuh"
#include "colsum.cuh"
#include "common.h"
#include "dispatch.cuh"
#include "plans.h"

namespace {

using rmsnorm::plans::RowPlan;
using rmsnorm::plans::upto;
using X = __nv_bfloat16;

// Candidates, by field name (plans.h upto; cluster: blocks a row). The
// first entry for a row length is the reference the others are checked
// against.
constexpr RowPlan kCandidates[] = {
    // N = 896 (112 vectors): the hidden size of small models (and 1024's
    // bulk reference below, which also covers it)
    upto(128).block(128).group(128).chunks(1).stages(2),
    upto(112).block(64).group(64).chunks(2).stages(2),
    upto(112).block(64).group(64).chunks(2).stages(2).bulk(),
    // N = 2560 (320)
    upto(320).block(160).group(160).chunks(2).stages(2),
    upto(320).block(320).group(320).chunks(1).stages(2),
    upto(320).block(64).group(64).chunks(5).stages(2),
    upto(320).block(160).group(160).chunks(2).stages(2).bulk(),
    upto(320).block(128).group(128).chunks(3).stages(2),
    // N = 5120 (640)
    upto(640).block(128).group(128).chunks(5).stages(2),
    upto(640).block(160).group(160).chunks(4).stages(2),
    upto(640).block(320).group(320).chunks(2).stages(2),
    upto(640).block(128).group(128).chunks(5).stages(2).bulk(),
    upto(640).block(320).group(320).chunks(2).stages(2).bulk(),
    // N = 3584 (448)
    upto(448).block(224).group(224).chunks(2).stages(2),
    upto(448).block(128).group(128).chunks(4).stages(2),
    upto(448).block(224).group(224).chunks(2).stages(2).bulk(),
    // N = 4096 (512), more
    upto(512).block(128).group(128).chunks(4).stages(2),
    upto(512).block(128).group(128).chunks(4).stages(3),
    upto(512).block(256).group(256).chunks(2).stages(3),
    // N = 128 (16 vectors)
    upto(16).block(256).group(16).chunks(1).stages(2),
    upto(16).block(256).group(16).chunks(1).stages(2).bulk(),
    upto(16).block(128).group(16).chunks(1).stages(2).bulk(),
    // N = 1024 (128)
    upto(128).block(256).group(32).chunks(4).stages(2),
    upto(128).block(256).group(32).chunks(4).stages(2).bulk(),
    upto(128).block(128).group(128).chunks(1).stages(2).bulk(),
    // N = 2048 (256)
    upto(256).block(256).group(256).chunks(1).stages(2),
    upto(256).block(256).group(256).chunks(1).stages(2).bulk(),
    upto(256).block(128).group(128).chunks(2).stages(2).bulk(),
    upto(256).block(128).group(128).chunks(2).stages(2),
    // N = 2880 (360) and 4096 (512)
    upto(512).block(256).group(256).chunks(2).stages(2),
    upto(512).block(256).group(256).chunks(2).stages(2).bulk(),
    upto(512).block(128).group(128).chunks(4).stages(2).bulk(),
    upto(512).block(512).group(512).chunks(1).stages(2).bulk(),
    upto(384).block(192).group(192).chunks(2).stages(2),
    upto(384).block(192).group(192).chunks(2).stages(2).bulk(),
    upto(384).block(384).group(384).chunks(1).stages(2).bulk(),
    upto(384).block(384).group(384).chunks(1).stages(2),
    // N = 8192 (1024)
    upto(1024).block(256).group(256).chunks(4).stages(2),
    upto(1024).block(256).group(256).chunks(4).stages(2).bulk(),
    upto(1024).block(512).group(512).chunks(2).stages(2).bulk(),
    // N = 16384 (2048)
    upto(2048).block(512).group(512).chunks(4).stages(2),
    upto(2048).block(512).group(512).chunks(4).stages(2).bulk(),
    upto(2048).block(1024).group(1024).chunks(2).stages(2).bulk(),
    // N = 32768 (4096): a row over a cluster of 2 or 4 blocks
    upto(4096).block(512).group(512).chunks(4).stages(2).bulk().cluster(2),
    upto(4096).block(512).group(512).chunks(4).stages(2).cluster(2),
    upto(4096).block(512).group(512).chunks(2).stages(2).bulk().cluster(4),
    upto(4096).block(256).group(256).chunks(4).stages(2).bulk().cluster(4),
    // N = 65536 (8192)
    upto(8192).block(512).group(512).chunks(4).stages(2).bulk().cluster(4),
    upto(8192).block(512).group(512).chunks(4).stages(2).cluster(4),
    upto(8192).block(512).group(512).chunks(2).stages(2).bulk().cluster(8),
    upto(8192).block(512).group(512).chunks(2).stages(2).cluster(8),
    // N = 131072 (16384): the table's 512 x 4 slices of 8 against 1024 x 2
    // slices of 8 and 512 x 2 of 16 (non-portable)
    upto(16384).block(512).group(512).chunks(4).stages(2).cluster(8),
    upto(16384).block(1024).group(1024).chunks(2).stages(2).cluster(8),
    upto(16384).block(512).group(512).chunks(2).stages(2).cluster(16),
    // N = 262144 (32768): 512 x 4 slices of 16 (the table's) against 1024 x 2
    upto(32768).block(512).group(512).chunks(4).stages(2).cluster(16),
    upto(32768).block(1024).group(1024).chunks(2).stages(2).cluster(16),
};
constexpr int kCount = sizeof(kCandidates) / sizeof(kCandidates[0]);


}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 30;
  // The training shapes (4k-32k tokens) first, then the big ones.
  const std::pair<int64_t, int> shapes[] = {
      {8192, 1024},  {8192, 2048},  {8192, 2560},  {8192, 4096},  {8192, 5120},
      {16384, 896},  {16384, 3584}, {4096, 8192},  {131072, 128}, {262144, 128},
      {65536, 1024}, {32768, 2048}, {16384, 2880}, {16384, 4096}, {16384, 8192},
      {8192, 16384}, {4096, 32768}, {2048, 65536}, {1024, 131072}, {512, 262144}};
  if (argc > 2) std::printf("(only N = %s)\n", argv[2]);
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("%-12s %-26s %5s %5s %9s %7s %7s %s\n", "shape", "candidate", "grid",
              "units", "us", "GB/s", "% ceil", "check vs first");
  int status = 0;
  for (auto [m, n] : shapes) {
    if (argc > 2 && n != std::atoi(argv[2])) continue;
    const size_t count = size_t(m) * n;
    X *x, *g, *w, *gx, *out;
    float *partials, *gw;
    CHECK(cudaMalloc(&x, count * 2));
    CHECK(cudaMalloc(&g, count * 2));
    CHECK(cudaMalloc(&gx, count * 2));
    CHECK(cudaMalloc(&out, count * 2));
    CHECK(cudaMalloc(&w, n * 2));
    CHECK(cudaMalloc(&gw, n * 4));
    CHECK(cudaMalloc(&partials, size_t(sms) * 32 * n * 4));
    cli::fill<<<1024, 256>>>(x, count, 1);
    cli::fill<<<1024, 256>>>(g, count, 2);
    cli::fill<<<64, 256>>>(w, n, 3);

    rmsnorm::CopyArgs c{x, g, out, int64_t(count), rmsnorm::DType::BF16};
    rmsnorm::Plan copy = rmsnorm::plan_copy(c);
    const double ceil_us = cli::median_us(iters, [&] { CHECK(rmsnorm::launch(copy, &c, 0)); });
    const double bytes = 3.0 * count * 2;
    char label[64];
    std::snprintf(label, sizeof label, "%lldx%d", (long long)m, n);
    std::printf("%-12s %-26s %5s %5s %9.1f %7.0f %7s\n", label, "copy ceiling (x+g)", "", "",
                ceil_us, bytes / ceil_us / 1e3, "100");

    const int nvec = n / 8;
    std::vector<float> ref_gx, ref_gw;
    for (int i = 0; i < kCount; ++i) {
      const RowPlan& p = kCandidates[i];
      // Candidates for this row: the ones whose row capacity covers it
      // without doubling it (2880 bf16 = 360 vectors tries 384 and 512).
      if (p.max_nvec < nvec || p.max_nvec >= 2 * nvec) continue;
      const void* fn = rmsnorm::persistent_kernel_for<X, X, rmsnorm::RmsRow, kCandidates>(i);
      const int rows_per_step = p.block / p.group;
      const size_t smem = rmsnorm::plans::persistent_smem(p, nvec, 1);
      CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
      // Resident units (blocks, or clusters of p.cluster blocks), as the
      // planner counts them.
      const int occ = rmsnorm::detail::units_resident(fn, p.block, smem, p.cluster);
      char name[48];
      std::snprintf(name, sizeof name, "{%d,%d,%d,%d,%s,x%d}", p.block, p.group, p.chunks,
                    p.stages, p.bulk ? "bulk" : "async", p.cluster);
      if (occ == 0) {
        std::printf("%-12s %s does not fit\n", "", name);
        continue;
      }
      const int64_t units = std::min<int64_t>(occ, (m + rows_per_step - 1) / rows_per_step);
      const int64_t grid = units * p.cluster;
      rmsnorm::BwdArgs a{};
      a.x = x; a.w = w; a.g = g; a.gx = gx; a.gw = gw;
      a.partials = partials;
      a.rows = m; a.n = n; a.eps = 1e-5f;
      a.x_dtype = a.w_dtype = a.g_dtype = rmsnorm::DType::BF16;
      a.partial_rows = int(units);
      rmsnorm::Plan plan;
      plan.calls.push_back(rmsnorm::KernelCall{fn, nullptr, dim3(grid), dim3(p.block),
                                               unsigned(smem), "bwd_persistent"});
      auto run = [&] { CHECK(rmsnorm::launch(plan, &a, 0)); };
      const double us = cli::median_us(iters, run);
      CHECK(cudaMemset(gx, 0xff, count * 2));
      run();
      const auto sum = rmsnorm::colsum_launch<float, true>(n);
      void* params[] = {&a};
      CHECK(cudaLaunchKernel(sum.fn, sum.grid, sum.block, params, 0, 0));
      CHECK(cudaDeviceSynchronize());
      auto hx = cli::to_host(gx, count);
      auto hw = cli::to_host(gw, n);
      char check[48] = "reference";
      if (ref_gx.empty()) {
        ref_gx = hx;
        ref_gw = hw;
      } else {
        double dx = cli::max_rel_diff(hx, ref_gx), dw = cli::max_rel_diff(hw, ref_gw);
        bool ok = dx <= 1e-2 && dw <= 1e-2;
        std::snprintf(check, sizeof check, "gx %.1e gw %.1e %s", dx, dw, ok ? "ok" : "DIFFER");
        if (!ok) status = 1;
      }
      std::printf("%-12s %-26s %5lld %5lld %9.1f %7.0f %7.1f %s\n", "", name, (long long)grid,
                  (long long)units,
                  us, bytes / us / 1e3, 100.0 * ceil_us / us, check);
    }
    for (void* p : {(void*)x, (void*)g, (void*)gx, (void*)out, (void*)w, (void*)gw,
                    (void*)partials})
      CHECK(cudaFree(p));
    std::fflush(stdout);
  }
  return status;
}
