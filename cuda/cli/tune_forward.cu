// Tuning bench for the forward's launch plans, without MLX:
//
//   tune_forward [iters] [N]
//
// For each benchmark shape (bf16) it times every candidate configuration
// below that fits the row, next to a device-to-device copy of x (the same
// bytes: one read, one write), and checks each candidate's y against the
// first one. Kernel alone, CUDA events, median; plans.h takes the winners.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "common.h"
#include "dispatch.cuh"
#include "forward.cuh"
#include "plans.h"

namespace {

using rmsnorm::plans::RowPlan;
using rmsnorm::plans::upto;
using X = __nv_bfloat16;

// Candidates, by field name (plans.h upto). stages 2 keeps the next rows
// loading while a step reduces (persistent only); persistent false launches a
// block per step of rows, w read late.
constexpr bool P = true, B = false;  // persistent grid, or a block per step
constexpr RowPlan kCandidates[] = {
    // N = 128 (16 vectors)
    upto(16).block(256).group(16).chunks(1).persistent(P),
    upto(16).block(256).group(16).chunks(1).stages(2).persistent(P),
    upto(16).block(128).group(16).chunks(1).persistent(B),
    upto(16).block(256).group(16).chunks(1).persistent(B),
    // N = 256 (32) and 512 (64)
    upto(32).block(256).group(32).chunks(1).persistent(P),
    upto(32).block(128).group(32).chunks(1).persistent(B),
    upto(32).block(64).group(32).chunks(1).persistent(B),
    upto(64).block(256).group(32).chunks(2).persistent(P),
    upto(64).block(128).group(32).chunks(2).persistent(B),
    upto(64).block(64).group(64).chunks(1).persistent(B),
    // N = 1024 (128)
    upto(128).block(256).group(32).chunks(4).persistent(P),
    upto(128).block(128).group(128).chunks(1).stages(2).persistent(P),
    upto(128).block(128).group(128).chunks(1).persistent(B),
    upto(128).block(64).group(64).chunks(2).persistent(B),
    upto(128).block(128).group(32).chunks(4).persistent(B),
    // N = 2048 (256)
    upto(256).block(256).group(256).chunks(1).persistent(P),
    upto(256).block(128).group(128).chunks(2).stages(2).persistent(P),
    upto(256).block(128).group(128).chunks(2).persistent(B),
    upto(256).block(64).group(64).chunks(4).persistent(B),
    upto(256).block(256).group(256).chunks(1).persistent(B),
    // N = 2880 (360) and 4096 (512)
    upto(512).block(256).group(256).chunks(2).persistent(P),
    upto(512).block(128).group(128).chunks(4).stages(2).persistent(P),
    upto(512).block(128).group(128).chunks(4).persistent(B),
    upto(512).block(256).group(256).chunks(2).persistent(B),
    upto(384).block(128).group(128).chunks(3).persistent(B),
    upto(384).block(128).group(128).chunks(3).stages(2).persistent(P),
    // N = 2560 (320), 3584 (448), 5120 (640): hidden sizes not a power of two
    upto(320).block(64).group(64).chunks(5).persistent(B),
    upto(320).block(160).group(160).chunks(2).persistent(B),
    upto(320).block(320).group(320).chunks(1).persistent(B),
    upto(448).block(64).group(64).chunks(7).persistent(B),
    upto(448).block(224).group(224).chunks(2).persistent(B),
    upto(448).block(128).group(128).chunks(4).persistent(B),
    upto(640).block(128).group(128).chunks(5).persistent(B),
    upto(640).block(160).group(160).chunks(4).persistent(B),
    upto(640).block(320).group(320).chunks(2).persistent(B),
    upto(640).block(640).group(640).chunks(1).persistent(B),
    upto(640).block(64).group(64).chunks(10).persistent(B),
    upto(640).block(256).group(256).chunks(4).persistent(B),
    upto(640).block(160).group(160).chunks(4).persistent(P),
    // N = 8192 (1024)
    upto(1024).block(256).group(256).chunks(4).persistent(P),
    upto(1024).block(512).group(512).chunks(2).stages(2).persistent(P),
    upto(1024).block(128).group(128).chunks(8).persistent(B),
    upto(1024).block(256).group(256).chunks(4).persistent(B),
    upto(1024).block(512).group(512).chunks(2).persistent(B),
    // N = 16384 (2048)
    upto(2048).block(512).group(512).chunks(4).persistent(P),
    upto(2048).block(512).group(512).chunks(4).stages(2).persistent(P),
    upto(2048).block(256).group(256).chunks(8).persistent(B),
    upto(2048).block(512).group(512).chunks(4).persistent(B),
    upto(2048).block(1024).group(1024).chunks(2).persistent(B),
    // N = 32768 (4096)
    upto(4096).block(1024).group(1024).chunks(4).persistent(B),
    upto(4096).block(512).group(512).chunks(8).persistent(B),
    // Rows a thread-block cluster (sm_90). B: a cluster a row, w read after
    // the reduction; P: w read into registers first, timed with a cluster a
    // row and with a grid of the resident clusters walking the rows (stages
    // 2: the next row loading while the sums cross the cluster).
    // Cluster rows capped (min_blocks: 1536 threads a SM at 4 vectors a
    // thread, 40 registers; 1024 at 8, 64; no spills in bf16): more rows'
    // loads in flight while a cluster's sums cross it.
    upto(4096).block(512).group(512).chunks(4).persistent(B).cluster(2),
    upto(4096).block(512).group(512).chunks(4).persistent(B).cluster(2).min_blocks(3),
    upto(4096).block(256).group(256).chunks(4).persistent(B).cluster(4).min_blocks(6),
    upto(4096).block(512).group(512).chunks(4).persistent(P).cluster(2),
    upto(4096).block(512).group(512).chunks(4).stages(2).persistent(P).cluster(2),
    upto(4096).block(512).group(512).chunks(2).persistent(B).cluster(4),
    upto(4096).block(256).group(256).chunks(4).persistent(B).cluster(4),
    // N = 65536 (8192)
    upto(8192).block(512).group(512).chunks(4).persistent(B).cluster(4),
    upto(8192).block(512).group(512).chunks(4).persistent(B).cluster(4).min_blocks(3),
    upto(8192).block(256).group(256).chunks(4).persistent(B).cluster(8).min_blocks(6),
    upto(8192).block(512).group(512).chunks(8).persistent(B).cluster(2),
    upto(8192).block(512).group(512).chunks(8).persistent(B).cluster(2).min_blocks(2),
    upto(8192).block(512).group(512).chunks(4).persistent(P).cluster(4),
    upto(8192).block(512).group(512).chunks(4).stages(2).persistent(P).cluster(4),
    upto(8192).block(512).group(512).chunks(4).stages(2).persistent(B).cluster(4),
    upto(8192).block(512).group(512).chunks(2).persistent(B).cluster(8),
    upto(8192).block(512).group(512).chunks(2).stages(2).persistent(P).cluster(8),
    upto(8192).block(256).group(256).chunks(4).persistent(B).cluster(8),
    upto(8192).block(1024).group(1024).chunks(2).persistent(B).cluster(4),
    upto(8192).block(1024).group(1024).chunks(4).persistent(B).cluster(2),
    // N = 131072 (16384)
    upto(16384).block(512).group(512).chunks(4).persistent(B).cluster(8),
    upto(16384).block(512).group(512).chunks(4).persistent(B).cluster(8).min_blocks(3),
    upto(16384).block(512).group(512).chunks(8).persistent(B).cluster(4).min_blocks(2),
    upto(16384).block(256).group(256).chunks(8).persistent(B).cluster(8).min_blocks(4),
    upto(16384).block(512).group(512).chunks(4).persistent(P).cluster(8),
    upto(16384).block(512).group(512).chunks(4).stages(2).persistent(P).cluster(8),
    upto(16384).block(512).group(512).chunks(4).stages(2).persistent(B).cluster(8),
    upto(16384).block(1024).group(1024).chunks(2).persistent(B).cluster(8),
    upto(16384).block(256).group(256).chunks(8).persistent(B).cluster(8),
    upto(16384).block(1024).group(1024).chunks(4).persistent(B).cluster(4),
    // N = 262144 (32768): the table's 512 x 8 slices of 8 (capped, two
    // blocks a SM) against slices of 16 (non-portable) and 1024-thread slices
    upto(32768).block(512).group(512).chunks(8).persistent(B).cluster(8).min_blocks(2),
    upto(32768).block(512).group(512).chunks(4).persistent(B).cluster(16).min_blocks(3),
    upto(32768).block(256).group(256).chunks(8).persistent(B).cluster(16).min_blocks(4),
    upto(32768).block(1024).group(1024).chunks(4).persistent(B).cluster(8),
};
constexpr int kCount = sizeof(kCandidates) / sizeof(kCandidates[0]);


}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 30;
  const std::pair<int64_t, int> shapes[] = {
      {8192, 2560},  {32768, 2560}, {8192, 3584},  {32768, 3584}, {8192, 5120},
      {32768, 5120}, {262144, 128}, {131072, 256}, {65536, 512},  {65536, 1024},
      {32768, 2048}, {16384, 2880}, {16384, 4096}, {16384, 8192},
      {4096, 8192},  {8192, 16384}, {4096, 32768}, {2048, 65536}, {1024, 131072},
      {512, 262144}};
  if (argc > 2) std::printf("(only N = %s)\n", argv[2]);
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("%-12s %-40s %6s %9s %7s %7s %s\n", "shape", "candidate", "grid", "us",
              "GB/s", "% ceil", "check vs first");
  int status = 0;
  for (auto [m, n] : shapes) {
    if (argc > 2 && n != std::atoi(argv[2])) continue;
    const size_t count = size_t(m) * n;
    X *x, *w, *y;
    CHECK(cudaMalloc(&x, count * 2));
    CHECK(cudaMalloc(&y, count * 2));
    CHECK(cudaMalloc(&w, n * 2));
    cli::fill<<<1024, 256>>>(x, count, 1);
    cli::fill<<<64, 256>>>(w, n, 3);

    const double ceil_us = cli::median_us(
        iters, [&] { CHECK(cudaMemcpyAsync(y, x, count * 2, cudaMemcpyDeviceToDevice)); });
    const double bytes = 2.0 * count * 2;
    char label[64];
    std::snprintf(label, sizeof label, "%lldx%d", (long long)m, n);
    std::printf("%-12s %-40s %6s %9.1f %7.0f %7s\n", label, "copy ceiling (x -> y)", "",
                ceil_us, bytes / ceil_us / 1e3, "100");

    const int nvec = n / 8;
    std::vector<float> ref;
    for (int i = 0; i < kCount; ++i) {
      const RowPlan& p = kCandidates[i];
      if (p.max_nvec < nvec || p.max_nvec >= 2 * nvec) continue;
      const void* fn = rmsnorm::fwd_kernel_for<X, X, rmsnorm::RmsRow, kCandidates>(i);
      const int rows_per_step = p.block / p.group;
      const int64_t steps = (m + rows_per_step - 1) / rows_per_step;
      // Grids to time: a block (cluster) per step; the resident ones for a
      // persistent row (a cluster's w-first row both ways, its stages 2 row
      // resident only).
      std::vector<std::pair<int64_t, const char*>> grids;
      if (p.cluster > 1) {
        const int64_t resident = std::min<int64_t>(steps, rmsnorm::detail::clusters_resident(fn, p.block, 0));
        if (p.stages == 1) grids.push_back({steps * p.cluster, "a row a cluster"});
        if (p.persistent || p.stages > 1) grids.push_back({resident * p.cluster, "resident"});
      } else if (p.persistent) {
        int occ = 0;
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, p.block, 0));
        grids.push_back({std::min<int64_t>(steps, int64_t(sms) * std::max(occ, 1)), ""});
      } else {
        grids.push_back({steps, ""});
      }
      for (const auto& [g, how] : grids) {
        const int64_t grid = g;  // (a lambda below takes it: no structured binding)
        rmsnorm::FwdArgs a{x, w, y, m, n, 1e-5f, rmsnorm::DType::BF16, rmsnorm::DType::BF16,
                           rmsnorm::DType::BF16};
        void* params[] = {&a};
        auto run = [&] { CHECK(cudaLaunchKernel(fn, dim3(grid), dim3(p.block), params, 0, 0)); };
        const double us = cli::median_us(iters, run);
        CHECK(cudaMemset(y, 0xff, count * 2));
        run();
        CHECK(cudaDeviceSynchronize());
        auto hy = cli::to_host(y, count);
        char name[64];
        char cap[16] = "";
        if (p.min_blocks > 0) std::snprintf(cap, sizeof cap, ",m%d", p.min_blocks);
        std::snprintf(name, sizeof name, "{%d,%d,%d,%d,%s,c%d%s%s%s}", p.block, p.group,
                      p.chunks, p.stages, p.persistent ? "w first" : "w late", p.cluster, cap,
                      *how ? "," : "", how);
        std::printf("%-12s %-40s %6lld %9.1f %7.0f %7.1f %s\n", "", name, (long long)grid, us,
                    bytes / us / 1e3, 100.0 * ceil_us / us, cli::check_y(ref, hy, status).c_str());
      }
    }
    for (void* p : {(void*)x, (void*)y, (void*)w}) CHECK(cudaFree(p));
    std::fflush(stdout);
  }
  return status;
}
