// Tuning bench for the forward of one wave of rows (decode: 1 to 64 rows),
// without MLX:
//
//   tune_decode [graphs]
//
// A decode step is a chain of small kernels, each waiting for the last, so
// what counts is one launch's latency inside a CUDA graph, not bandwidth.
// For each shape (bf16) and candidate below it captures kLaunches
// back-to-back launches of the kernel into one graph (each reads x, which
// the previous kernel's y sits beside in L2, as in a step) and reports the
// median over `graphs` replays of graph time / kLaunches, checking y against
// the first candidate. Every candidate loads w beside x (the PERSISTENT form
// of fwd_rows) except the ones marked "w late" (the many-row table's form).
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
using rmsnorm::plans::upto;
using X = __nv_bfloat16;
constexpr int kLaunches = 200;

// Rows by field name (plans.h upto): a block per row (group == block) or a
// warp per row (group 32), chunks vectors a thread; persistent(W): w first.
constexpr bool W = true, L = false;  // w loaded beside x, or after the reduction
constexpr RowPlan kCandidates[] = {
    // N = 1024 (128 vectors)
    upto(128).block(64).group(64).chunks(2).persistent(W),
    upto(128).block(64).group(64).chunks(2).persistent(L),
    upto(128).block(128).group(128).chunks(1).persistent(W),
    upto(128).block(32).group(32).chunks(4).persistent(W),
    // N = 2048 (256)
    upto(256).block(128).group(128).chunks(2).persistent(W),
    upto(256).block(128).group(128).chunks(2).persistent(L),
    upto(256).block(256).group(256).chunks(1).persistent(W),
    upto(256).block(64).group(64).chunks(4).persistent(W),
    // N = 2560 (320)
    upto(320).block(160).group(160).chunks(2).persistent(W),
    upto(320).block(160).group(160).chunks(2).persistent(L),
    upto(320).block(320).group(320).chunks(1).persistent(W),
    // N = 4096 (512)
    upto(512).block(128).group(128).chunks(4).persistent(W),
    upto(512).block(128).group(128).chunks(4).persistent(L),
    upto(512).block(256).group(256).chunks(2).persistent(W),
    upto(512).block(512).group(512).chunks(1).persistent(W),
    // N = 5120 (640)
    upto(640).block(160).group(160).chunks(4).persistent(W),
    upto(640).block(160).group(160).chunks(4).persistent(L),
    upto(640).block(320).group(320).chunks(2).persistent(W),
    upto(640).block(640).group(640).chunks(1).persistent(W),
    // N = 8192 (1024)
    upto(1024).block(256).group(256).chunks(4).persistent(W),
    upto(1024).block(256).group(256).chunks(4).persistent(L),
    upto(1024).block(512).group(512).chunks(2).persistent(W),
    upto(1024).block(1024).group(1024).chunks(1).persistent(W),
};
constexpr int kCount = sizeof(kCandidates) / sizeof(kCandidates[0]);


}  // namespace

int main(int argc, char** argv) {
  const int graphs = argc > 1 ? std::atoi(argv[1]) : 20;
  const int ns[] = {1024, 2048, 2560, 4096, 5120, 8192};
  const int64_t row_counts[] = {1, 16, 64};
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("%-10s %-26s %9s  %s\n", "shape", "candidate", "us/launch", "check vs first");
  int status = 0;
  for (int n : ns) {
    for (int64_t m : row_counts) {
      const size_t count = size_t(m) * n;
      X *x, *w, *y;
      CHECK(cudaMalloc(&x, count * 2));
      CHECK(cudaMalloc(&y, count * 2));
      CHECK(cudaMalloc(&w, n * 2));
      cli::fill<<<64, 256>>>(x, count, 1);
      cli::fill<<<64, 256>>>(w, n, 3);
      CHECK(cudaDeviceSynchronize());
      char label[32];
      std::snprintf(label, sizeof label, "%lldx%d", (long long)m, n);
      std::vector<float> ref;
      for (int i = 0; i < kCount; ++i) {
        const RowPlan& p = kCandidates[i];
        if (p.max_nvec != n / 8) continue;
        const void* fn = rmsnorm::fwd_kernel_for<X, X, rmsnorm::RmsRow, kCandidates>(i);
        const int64_t grid = (m + p.block / p.group - 1) / (p.block / p.group);
        rmsnorm::FwdArgs a{x, w, y, m, n, 1e-5f, rmsnorm::DType::BF16, rmsnorm::DType::BF16,
                           rmsnorm::DType::BF16};
        void* params[] = {&a};
        auto run = [&](cudaStream_t s) {
          CHECK(cudaLaunchKernel(fn, dim3(grid), dim3(p.block), params, 0, s));
        };
        const double us = cli::graph_median_us(stream, kLaunches, graphs, run);
        CHECK(cudaMemsetAsync(y, 0xff, count * 2, stream));  // poison, in stream order
        run(stream);
        CHECK(cudaStreamSynchronize(stream));
        auto hy = cli::to_host(y, count);
        char name[48];
        std::snprintf(name, sizeof name, "{%d,%d,%d}%s", p.block, p.group, p.chunks,
                      p.persistent ? " w first" : " w late");
        std::printf("%-10s %-26s %9.3f  %s\n", label, name, us,
                    cli::check_y(ref, hy, status).c_str());
      }
      for (void* p : {(void*)x, (void*)y, (void*)w}) CHECK(cudaFree(p));
      std::fflush(stdout);
    }
  }
  return status;
}
