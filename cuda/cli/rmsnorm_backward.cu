// Standalone check and timing of the backward chains, without MLX:
//
//   rmsnorm_backward <hidden> <rows> [iters]
//
// Runs the persistent, split and naive chains on the same random bf16 data,
// checks that they agree with each other (gx and gw), and prints the time of
// each (CUDA events, median of iters), its bandwidth counting x and g read and
// gx written once, and the passes over an M x N tensor that the chain makes.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common.h"
#include "rmsnorm.h"

namespace {

struct Chain {
  rmsnorm::Algorithm algorithm;
  const char* passes;  // M x N tensors moved: reads + writes
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <hidden> <rows> [iters]\n", argv[0]);
    return 2;
  }
  const int n = std::atoi(argv[1]);
  const int64_t rows = std::atoll(argv[2]);
  const int iters = argc > 3 ? std::atoi(argv[3]) : 50;
  if (n <= 0 || rows <= 0 || iters <= 0) {
    std::fprintf(stderr, "hidden, rows and iters must be positive\n");
    return 2;
  }
  const size_t count = size_t(n) * rows;

  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  auto random_bf16 = [&](size_t k) {
    std::vector<__nv_bfloat16> h(k);
    for (auto& v : h) v = __float2bfloat16(normal(rng));
    void* d = nullptr;
    CHECK(cudaMalloc(&d, k * 2));
    CHECK(cudaMemcpy(d, h.data(), k * 2, cudaMemcpyHostToDevice));
    return d;
  };
  void* x = random_bf16(count);
  void* g = random_bf16(count);
  void* w = random_bf16(n);
  void *gx = nullptr, *gw = nullptr;
  CHECK(cudaMalloc(&gx, count * 2));
  CHECK(cudaMalloc(&gw, size_t(n) * 2));

  int dev = 0;
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf("%s, %d SMs | N=%d M=%lld bf16 | %d iterations (median)\n",
              prop.name, prop.multiProcessorCount, n, (long long)rows, iters);
  std::printf("%-11s %-42s %10s %9s %s\n", "chain", "kernels", "us", "GB/s",
              "passes over M x N");

  const Chain chains[] = {
      {rmsnorm::Algorithm::Persistent, "3 (x, g read; gx written)"},
      {rmsnorm::Algorithm::Split, "5 (x, g read twice; gx written)"},
      {rmsnorm::Algorithm::Naive, "5 (+ M x N gw partial written, read)"},
  };
  std::vector<float> ref_gx, ref_gw;
  int status = 0;
  for (const Chain& chain : chains) {
    rmsnorm::BwdArgs a{};
    a.x = x;
    a.w = w;
    a.g = g;
    a.gx = gx;
    a.gw = gw;
    a.rows = rows;
    a.n = n;
    a.eps = 1e-5f;
    a.x_dtype = a.w_dtype = a.g_dtype = rmsnorm::DType::BF16;
    rmsnorm::Plan plan = rmsnorm::plan_backward(a, chain.algorithm);
    void* scratch = nullptr;
    if (plan.scratch_bytes) CHECK(cudaMalloc(&scratch, plan.scratch_bytes));
    rmsnorm::bind_scratch(a, plan, scratch);

    CHECK(cudaMemset(gx, 0xff, count * 2));  // poison: every element is written
    const double us = cli::median_us(iters, [&] { CHECK(rmsnorm::launch(plan, &a, 0)); });
    double gbs = 3.0 * count * 2 / (us * 1e3);

    std::string names;
    for (auto& c : plan.calls) names += std::string(names.empty() ? "" : "+") + c.name;
    std::printf("%-11s %-42s %10.1f %9.0f %s\n",
                rmsnorm::algorithm_name(plan.algorithm), names.c_str(), us, gbs,
                chain.passes);

    auto hx = cli::to_host(gx, count);
    auto hw = cli::to_host(gw, n);
    if (ref_gx.empty()) {
      ref_gx = hx;
      ref_gw = hw;
    } else {
      double dx = cli::max_rel_diff(hx, ref_gx), dw = cli::max_rel_diff(hw, ref_gw);
      // gx: one bf16 rounding apart at most; gw: the naive chain rounds its
      // M x N partial to bf16 (as the seed does), the others stay in fp32.
      bool ok = dx <= 1e-2 && dw <= 1e-2 && std::isfinite(dx) && std::isfinite(dw);
      std::printf("            vs persistent: gx %.2e, gw %.2e  %s\n", dx, dw,
                  ok ? "agree" : "DISAGREE");
      if (!ok) status = 1;
    }
    if (scratch) CHECK(cudaFree(scratch));
  }
  CHECK(cudaFree(x));
  CHECK(cudaFree(g));
  CHECK(cudaFree(w));
  CHECK(cudaFree(gx));
  CHECK(cudaFree(gw));
  return status;
}
