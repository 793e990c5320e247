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
#include "forward.cuh"
#include "plans.h"

namespace {

using rmsnorm::plans::RowPlan;
using X = __nv_bfloat16;

// Candidates: {max_nvec, block, group, chunks, stages, -, -, persistent}.
// stages 2 keeps the next rows loading while a step reduces (persistent
// only); persistent false launches a block per step of rows, w read late.
constexpr bool P = true, B = false;  // persistent grid, or a block per step
constexpr RowPlan kCandidates[] = {
    // N = 128 (16 vectors)
    {16, 256, 16, 1, 1, false, 1, P}, {16, 256, 16, 1, 2, false, 1, P},
    {16, 128, 16, 1, 1, false, 1, B}, {16, 256, 16, 1, 1, false, 1, B},
    // N = 256 (32) and 512 (64)
    {32, 256, 32, 1, 1, false, 1, P}, {32, 128, 32, 1, 1, false, 1, B},
    {32, 64, 32, 1, 1, false, 1, B},
    {64, 256, 32, 2, 1, false, 1, P}, {64, 128, 32, 2, 1, false, 1, B},
    {64, 64, 64, 1, 1, false, 1, B},
    // N = 1024 (128)
    {128, 256, 32, 4, 1, false, 1, P}, {128, 128, 128, 1, 2, false, 1, P},
    {128, 128, 128, 1, 1, false, 1, B}, {128, 64, 64, 2, 1, false, 1, B},
    {128, 128, 32, 4, 1, false, 1, B},
    // N = 2048 (256)
    {256, 256, 256, 1, 1, false, 1, P}, {256, 128, 128, 2, 2, false, 1, P},
    {256, 128, 128, 2, 1, false, 1, B}, {256, 64, 64, 4, 1, false, 1, B},
    {256, 256, 256, 1, 1, false, 1, B},
    // N = 2880 (360) and 4096 (512)
    {512, 256, 256, 2, 1, false, 1, P}, {512, 128, 128, 4, 2, false, 1, P},
    {512, 128, 128, 4, 1, false, 1, B}, {512, 256, 256, 2, 1, false, 1, B},
    {384, 128, 128, 3, 1, false, 1, B}, {384, 128, 128, 3, 2, false, 1, P},
    // N = 2560 (320), 3584 (448), 5120 (640): hidden sizes not a power of two
    {320, 64, 64, 5, 1, false, 1, B},  {320, 160, 160, 2, 1, false, 1, B},
    {320, 320, 320, 1, 1, false, 1, B},
    {448, 64, 64, 7, 1, false, 1, B},  {448, 224, 224, 2, 1, false, 1, B},
    {448, 128, 128, 4, 1, false, 1, B},
    {640, 128, 128, 5, 1, false, 1, B}, {640, 160, 160, 4, 1, false, 1, B},
    {640, 320, 320, 2, 1, false, 1, B}, {640, 640, 640, 1, 1, false, 1, B},
    {640, 64, 64, 10, 1, false, 1, B},  {640, 256, 256, 4, 1, false, 1, B},
    {640, 160, 160, 4, 1, false, 1, P},
    // N = 8192 (1024)
    {1024, 256, 256, 4, 1, false, 1, P}, {1024, 512, 512, 2, 2, false, 1, P},
    {1024, 128, 128, 8, 1, false, 1, B}, {1024, 256, 256, 4, 1, false, 1, B},
    {1024, 512, 512, 2, 1, false, 1, B},
    // N = 16384 (2048)
    {2048, 512, 512, 4, 1, false, 1, P}, {2048, 512, 512, 4, 2, false, 1, P},
    {2048, 256, 256, 8, 1, false, 1, B}, {2048, 512, 512, 4, 1, false, 1, B},
    {2048, 1024, 1024, 2, 1, false, 1, B},
    // N = 32768 (4096)
    {4096, 1024, 1024, 4, 1, false, 1, B}, {4096, 512, 512, 8, 1, false, 1, B},
};
constexpr int kCount = sizeof(kCandidates) / sizeof(kCandidates[0]);

template <std::size_t... I>
const void* kernel_of(int i, std::index_sequence<I...>) {
  static const void* const kernels[] = {reinterpret_cast<const void*>(
      &rmsnorm::fwd_rows<X, X, kCandidates[I].block, kCandidates[I].group,
                         kCandidates[I].chunks, kCandidates[I].stages,
                         kCandidates[I].persistent>)...};
  return kernels[i];
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 30;
  const std::pair<int64_t, int> shapes[] = {
      {8192, 2560},  {32768, 2560}, {8192, 3584},  {32768, 3584}, {8192, 5120},
      {32768, 5120}, {262144, 128}, {131072, 256}, {65536, 512},  {65536, 1024},
      {32768, 2048}, {16384, 2880}, {16384, 4096}, {16384, 8192},
      {4096, 8192},  {8192, 16384}, {4096, 32768}};
  if (argc > 2) std::printf("(only N = %s)\n", argv[2]);
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("%-12s %-24s %6s %9s %7s %7s %s\n", "shape", "candidate", "grid", "us",
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
    std::printf("%-12s %-24s %6s %9.1f %7.0f %7s\n", label, "copy ceiling (x -> y)", "",
                ceil_us, bytes / ceil_us / 1e3, "100");

    const int nvec = n / 8;
    std::vector<float> ref;
    for (int i = 0; i < kCount; ++i) {
      const RowPlan& p = kCandidates[i];
      if (p.max_nvec < nvec || p.max_nvec >= 2 * nvec) continue;
      const void* fn = kernel_of(i, std::make_index_sequence<kCount>{});
      const int rows_per_step = p.block / p.group;
      int64_t grid = (m + rows_per_step - 1) / rows_per_step;
      if (p.persistent) {
        int occ = 0;
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, p.block, 0));
        grid = std::min<int64_t>(grid, int64_t(sms) * std::max(occ, 1));
      }
      rmsnorm::FwdArgs a{x, w, y, m, n, 1e-5f, rmsnorm::DType::BF16, rmsnorm::DType::BF16,
                         rmsnorm::DType::BF16};
      void* params[] = {&a};
      auto run = [&] { CHECK(cudaLaunchKernel(fn, dim3(grid), dim3(p.block), params, 0, 0)); };
      const double us = cli::median_us(iters, run);
      CHECK(cudaMemset(y, 0xff, count * 2));
      run();
      CHECK(cudaDeviceSynchronize());
      auto hy = cli::to_host(y, count);
      char name[48];
      std::snprintf(name, sizeof name, "{%d,%d,%d,%d,%s}", p.block, p.group, p.chunks,
                    p.stages, p.persistent ? "persistent" : "per-step");
      char check[48] = "reference";
      if (ref.empty()) {
        ref = hy;
      } else {
        const double d = cli::max_rel_diff(hy, ref);
        const bool ok = d <= 1e-2;
        std::snprintf(check, sizeof check, "y %.1e %s", d, ok ? "ok" : "DIFFER");
        if (!ok) status = 1;
      }
      std::printf("%-12s %-24s %6lld %9.1f %7.0f %7.1f %s\n", "", name, (long long)grid, us,
                  bytes / us / 1e3, 100.0 * ceil_us / us, check);
    }
    for (void* p : {(void*)x, (void*)y, (void*)w}) CHECK(cudaFree(p));
    std::fflush(stdout);
  }
  return status;
}
