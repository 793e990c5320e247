// Tuning bench for add_layer_norm's forward past N = 16384 (sm_90), without
// MLX:
//
//   tune_add_forward [iters] [N]
//
// For each long-row shape (bf16 x, residual, w and b) it times the planner's
// own plan (plan_layer_forward) against one-pass AddLayerRow candidates below
// (x and the residual held in registers, a row a thread-block cluster), next
// to a device copy of the same bytes (x and the residual read, y and h
// written). Every candidate's y and h are checked against the plan's: h bit
// for bit, y within 1e-2 of the largest |y|. Kernel alone, CUDA events,
// median. (The two-call design it was written against, add_rows and then
// LayerNorm's row of h, is in git: 1253f40.)
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <vector>

#include "common.h"
#include "dispatch.cuh"
#include "forward.cuh"
#include "plans.h"

namespace {

using rmsnorm::plans::RowPlan;
using rmsnorm::plans::upto;
using X = __nv_bfloat16;

// One-pass candidates: slices of block x chunks vectors, a cluster a row, w
// and b read in x's dtype after the reduction; min_blocks caps registers
// (0: uncapped, as kForwardAddLong's rows ran add_layer_norm before).
constexpr RowPlan kCandidates[] = {
    // N = 24576, 32768 (4096 vectors)
    upto(4096).block(512).group(512).chunks(4).persistent(false).cluster(2),
    upto(4096).block(512).group(512).chunks(4).persistent(false).cluster(2).min_blocks(2),
    upto(4096).block(512).group(512).chunks(2).persistent(false).cluster(4).min_blocks(2),
    upto(4096).block(512).group(512).chunks(2).persistent(false).cluster(4).min_blocks(3),
    upto(4096).block(256).group(256).chunks(4).persistent(false).cluster(4).min_blocks(4),
    upto(4096).block(256).group(256).chunks(2).persistent(false).cluster(8).min_blocks(6),
    // N = 65536 (8192)
    upto(8192).block(512).group(512).chunks(4).persistent(false).cluster(4),
    upto(8192).block(512).group(512).chunks(4).persistent(false).cluster(4).min_blocks(2),
    upto(8192).block(512).group(512).chunks(2).persistent(false).cluster(8).min_blocks(2),
    upto(8192).block(512).group(512).chunks(2).persistent(false).cluster(8).min_blocks(3),
    upto(8192).block(256).group(256).chunks(4).persistent(false).cluster(8).min_blocks(4),
    upto(8192).block(256).group(256).chunks(2).persistent(false).cluster(16).min_blocks(6),
    // N = 131072 (16384)
    upto(16384).block(512).group(512).chunks(4).persistent(false).cluster(8),
    upto(16384).block(512).group(512).chunks(4).persistent(false).cluster(8).min_blocks(2),
    upto(16384).block(512).group(512).chunks(2).persistent(false).cluster(16).min_blocks(2),
    upto(16384).block(512).group(512).chunks(2).persistent(false).cluster(16).min_blocks(3),
    upto(16384).block(256).group(256).chunks(4).persistent(false).cluster(16).min_blocks(4),
    // N = 262144 (32768)
    upto(32768).block(512).group(512).chunks(4).persistent(false).cluster(16),
    upto(32768).block(512).group(512).chunks(4).persistent(false).cluster(16).min_blocks(2),
    upto(32768).block(1024).group(1024).chunks(2).persistent(false).cluster(16),
};
constexpr int kCount = static_cast<int>(std::size(kCandidates));

const void* candidate_kernel(int i) {
  return rmsnorm::kernel_by_row<std::size(kCandidates)>(i, [](auto k) {
    constexpr std::size_t I = decltype(k)::value;
    return rmsnorm::fwd_kernel_for<X, X, rmsnorm::AddLayerRow, kCandidates, I, false,
                                   kCandidates[I].min_blocks, true>();
  });
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 30;
  const std::pair<int64_t, int> shapes[] = {
      {4096, 24576}, {4096, 32768}, {2048, 65536}, {1024, 131072}, {512, 262144}};
  if (argc > 2) std::printf("(only N = %s)\n", argv[2]);
  std::printf("%-12s %-36s %6s %9s %7s %s\n", "shape", "candidate", "grid", "us", "% ceil",
              "check vs the plan");
  int status = 0;
  for (auto [m, n] : shapes) {
    if (argc > 2 && n != std::atoi(argv[2])) continue;
    const size_t count = size_t(m) * n;
    X *x, *r, *y, *h, *w, *b;
    CHECK(cudaMalloc(&x, count * 2));
    CHECK(cudaMalloc(&r, count * 2));
    CHECK(cudaMalloc(&y, count * 2));
    CHECK(cudaMalloc(&h, count * 2));
    CHECK(cudaMalloc(&w, n * 2));
    CHECK(cudaMalloc(&b, n * 2));
    cli::fill<<<1024, 256>>>(x, count, 1);
    cli::fill<<<1024, 256>>>(r, count, 2);
    cli::fill<<<64, 256>>>(w, n, 3);
    cli::fill<<<64, 256>>>(b, n, 4);
    rmsnorm::FwdArgs a{x, w, y, m, n, 1e-5f, rmsnorm::DType::BF16, rmsnorm::DType::BF16,
                       rmsnorm::DType::BF16};
    a.b = b;
    a.b_dtype = rmsnorm::DType::BF16;
    a.residual = r;
    a.h = h;

    // The same bytes as one pass moves: x and r read, y and h written.
    const double ceil_us = cli::median_us(iters, [&] {
      CHECK(cudaMemcpyAsync(y, x, count * 2, cudaMemcpyDeviceToDevice));
      CHECK(cudaMemcpyAsync(h, r, count * 2, cudaMemcpyDeviceToDevice));
    });
    char label[64];
    std::snprintf(label, sizeof label, "%lldx%d", (long long)m, n);
    std::printf("%-12s %-36s %6s %9.1f %7s\n", label, "copy ceiling (x -> y, r -> h)", "",
                ceil_us, "100");

    const rmsnorm::Plan plan = rmsnorm::plan_layer_forward(a);
    const double plan_us =
        cli::median_us(iters, [&] { CHECK(rmsnorm::launch(plan, &a, 0)); });
    CHECK(cudaDeviceSynchronize());
    std::vector<float> ref_y = cli::to_host(y, count), ref_h = cli::to_host(h, count);
    std::string names;
    for (const auto& c : plan.calls) names += std::string(names.empty() ? "" : " + ") + c.name;
    std::printf("%-12s %-36s %6s %9.1f %7.1f %s\n", "", ("plan: " + names).c_str(), "", plan_us,
                100.0 * ceil_us / plan_us, "reference");

    const int nvec = n / 8;
    for (int i = 0; i < kCount; ++i) {
      const RowPlan& p = kCandidates[i];
      if (p.max_nvec < nvec || p.max_nvec >= 2 * nvec) continue;
      const void* fn = candidate_kernel(i);
      // (also opts a cluster of 16 in: launch.cu)
      if (rmsnorm::detail::clusters_resident(fn, p.block, 0) == 0) {
        std::printf("%-12s {%d,%d,c%d,m%d} does not fit\n", "", p.block, p.chunks, p.cluster,
                    p.min_blocks);
        continue;
      }
      const int64_t grid = m * p.cluster;
      void* params[] = {&a};
      auto run = [&] { CHECK(cudaLaunchKernel(fn, dim3(grid), dim3(p.block), params, 0, 0)); };
      const double us = cli::median_us(iters, run);
      CHECK(cudaMemset(y, 0xff, count * 2));
      CHECK(cudaMemset(h, 0xff, count * 2));
      run();
      CHECK(cudaDeviceSynchronize());
      const double dy = cli::max_rel_diff(cli::to_host(y, count), ref_y);
      const double dh = cli::max_rel_diff(cli::to_host(h, count), ref_h);
      const bool ok = dy <= 1e-2 && dh == 0;
      if (!ok) status = 1;
      char name[64];
      std::snprintf(name, sizeof name, "{%d,%d,c%d,m%d}", p.block, p.chunks, p.cluster,
                    p.min_blocks);
      std::printf("%-12s %-36s %6lld %9.1f %7.1f y %.1e h %.1e %s\n", "", name, (long long)grid,
                  us, 100.0 * ceil_us / us, dy, dh, ok ? "ok" : "DIFFER");
    }
    for (void* p : {(void*)x, (void*)r, (void*)y, (void*)h, (void*)w, (void*)b}) CHECK(cudaFree(p));
    std::fflush(stdout);
  }
  return status;
}
