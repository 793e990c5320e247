// The launch plans of this build's planners on a model GPU, with no GPU: for
// each op, direction, dtype pairing, shape and switch (fused add, misaligned
// w, bias, gw and gb, algorithm), every call the plan makes (kernel symbol, grid, block,
// dynamic shared memory, cluster). Two builds that print the same lines pick
// the same kernels the same way; with lab/sass_compare.py (the kernels' own
// code) this checks a refactor of the planners on a machine without a GPU.
//
//   python -m lab.plan_dump BUILD_DIR --out plans.txt   (lab/plan_dump.py)
//
// With --check it prints no plans but checks each one (check() says what),
// exits 1 on any violation: .ci/run runs it on the objects it compiles.
//
// The model GPU stands in for launch.cu's queries (target, occupancy,
// handles), which this program defines instead: family from
// PLAN_DUMP_FAMILY (90, 80 or 75), 132 SMs, and resident blocks and clusters
// that follow the block size and the shared memory. The numbers are
// not any real GPU's: the plans are for comparing, not for reading as the
// H100's.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "dispatch.cuh"
#include "rmsnorm.h"

namespace rmsnorm {

// launch.cu's, as it is (the planners call it).
int vector_width(DType t, int n, std::initializer_list<const void*> ptrs) {
  const int full = t == DType::F32 ? 4 : 8;
  if (n % full != 0) return 1;
  for (const void* p : ptrs)
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return 1;
  return full;
}

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::Persistent: return "persistent";
    case Algorithm::Split: return "split";
    case Algorithm::Naive: return "naive";
    default: return "auto";
  }
}

namespace detail {

[[noreturn]] void fail(const char* what, cudaError_t err) {
  std::fprintf(stderr, "plan_dump: %s failed (%d)\n", what, int(err));
  std::exit(2);
}

const Target& target() {
  static const char* const family = std::getenv("PLAN_DUMP_FAMILY");
  static const Target t{0, family ? std::atoi(family) : 90, 132};
  return t;
}

// The stub's offset in this executable, "@0x...": the stubs are local
// symbols (no dynamic name), so lab/plan_dump.py names them from `nm`.
static std::string symbol(const void* host_fn) {
  Dl_info info{};
  if (dladdr(host_fn, &info) == 0) return "?";
  char buf[32];
  const auto offset = static_cast<const char*>(host_fn) - static_cast<const char*>(info.dli_fbase);
  std::snprintf(buf, sizeof buf, "@0x%zx", size_t(offset));
  return buf;
}

// Occupancy from the launch shape alone (the same in both builds).
int blocks_per_sm(const void*, int block, unsigned smem) {
  if (smem > 227u * 1024) return 0;
  const int by_smem = smem == 0 ? 32 : int(228u * 1024 / (smem + 1024));
  return std::min(2048 / block, by_smem);
}

int clusters_resident(const void*, int block, unsigned smem) {
  return smem > 227u * 1024 ? 0 : 16 - block / 256;
}

KernelCall make_call(const void* host_fn, dim3 grid, dim3 block, unsigned smem,
                     const char* name, int cluster) {
  return KernelCall{host_fn, nullptr, grid, block, smem, name, cluster};
}

}  // namespace detail
}  // namespace rmsnorm

using namespace rmsnorm;

static void print(const char* what, const Plan& p) {
  std::printf("%s | scratch %zu partial_rows %d gx_call %d alg %d\n", what, p.scratch_bytes,
              p.partial_rows, p.gx_call, int(p.algorithm));
  for (const KernelCall& c : p.calls)
    std::printf("  %s %s grid %u block %u smem %u cluster %d\n", c.name,
                detail::symbol(c.host_fn).c_str(), c.grid.x, c.block.x, c.smem, c.cluster);
}

// --check: instead of printing the plans, what every plan must be on any
// GPU, whatever the occupancy: calls with a kernel, grids and blocks a launch
// takes, shared memory within a block's most, clusters only where the family
// has them (and whole clusters in the grid), the backward's gw finished by a
// column sum after the call that writes gx; no planner throws but the documented one (the
// fused add's backward has no naive plan).
static bool check_mode = false;
static long violations = 0;

static void violation(const char* what, const char* why) {
  ++violations;
  if (violations <= 50) std::printf("VIOLATION %s: %s\n", what, why);
}

static void check(const char* what, const Plan& p, bool gw_wanted) {
  if (p.calls.empty()) return violation(what, "no calls");
  if (p.gx_call < 0 || p.gx_call >= int(p.calls.size())) violation(what, "gx_call out of range");
  // gw (and gb) are finished by a column sum, the plan's last call: after the
  // call that writes gx (gx_call itself may be that column sum, where what
  // reads gx must wait for it: layer_norm.cu's cluster rows)
  if (gw_wanted && (p.calls.size() < 2 ||
                    std::strncmp(p.calls.back().name, "colsum", 6) != 0))
    violation(what, "nothing finishes gw");
  for (const KernelCall& c : p.calls) {
    if (c.host_fn == nullptr) violation(what, "a call without a kernel");
    if (c.grid.x < 1 || c.grid.y < 1) violation(what, "an empty grid");
    if (c.block.x * c.block.y < 32 || c.block.x * c.block.y > 1024)
      violation(what, "a block of fewer than 32 or more than 1024 threads");
    if (c.smem > 227u * 1024) violation(what, "more shared memory than a block can have");
    if (c.cluster < 1 || (c.cluster > 1 && (detail::target().family < 90 || c.grid.x % c.cluster)))
      violation(what, "a cluster off sm_90, or a grid of part clusters");
  }
}

template <typename F>
static void guarded(const char* what, F&& plan, bool gw_wanted = false) {
  try {
    const Plan p = plan();
    if (check_mode)
      check(what, p, gw_wanted);
    else
      print(what, p);
  } catch (const std::exception& e) {
    if (!check_mode)
      std::printf("%s | throws: %s\n", what, e.what());
    else if (!std::strstr(e.what(), "has no naive plan"))
      violation(what, e.what());
  }
}

int main(int argc, char** argv) {
  check_mode = argc > 1 && std::strcmp(argv[1], "--check") == 0;
  // Pointers the planners only test for 16-byte alignment.
  char* const aligned = reinterpret_cast<char*>(uintptr_t(1) << 20);
  char* const odd = aligned + 2;
  const DType kDtypes[][2] = {{DType::BF16, DType::BF16}, {DType::F16, DType::F16},
                              {DType::F32, DType::F32},   {DType::BF16, DType::F32},
                              {DType::F16, DType::F32}};
  const int kN[] = {8,    32,    64,    96,    128,   200,   256,   512,   640,   768,
                    1000, 1024,  2048,  2560,  2880,  3584,  4096,  5120,  8192,  12288,
                    16384, 16392, 24576, 32768, 40000, 65536, 98304, 131072, 262144};
  const int64_t kM[] = {1, 7, 64, 1000, 4096, 65536};
  char what[256];
  for (auto [xt, yt] : kDtypes) {
    for (int n : kN) {
      for (int64_t m : kM) {
        for (int add = 0; add < 2; ++add) {
          for (int w_odd = 0; w_odd < 2; ++w_odd) {
            for (int bias = 0; bias < 2; ++bias) {
              FwdArgs f{aligned, w_odd ? odd : aligned, aligned, m, n, 1e-5f, xt, xt, yt,
                        bias ? aligned : nullptr, xt};
              if (add) f.residual = aligned, f.h = aligned;
              std::snprintf(what, sizeof what, "fwd x%d y%d n%d m%lld add%d wodd%d bias%d",
                            int(xt), int(yt), n, (long long)m, add, w_odd, bias);
              if (!bias) guarded(what, [&] { return plan_forward(f); });
              std::string ln = std::string("layer_") + what;
              if (layer_norm_planned(xt, yt, n, add))
                guarded(ln.c_str(), [&] { return plan_layer_forward(f); });
              else if (!check_mode)
                std::printf("%s | not planned\n", ln.c_str());
            }
          }
          for (int gw = 0; gw < 2; ++gw) {
            BwdArgs b{};
            b.x = aligned, b.w = aligned, b.g = aligned, b.gx = aligned;
            b.gw = gw ? aligned : nullptr;
            b.rows = m, b.n = n, b.eps = 1e-5f;
            b.x_dtype = xt, b.w_dtype = xt, b.g_dtype = yt;
            b.gb = gw ? aligned : nullptr, b.b_dtype = xt;
            if (add) b.gh = aligned;
            for (Algorithm alg : {Algorithm::Auto, Algorithm::Persistent, Algorithm::Split,
                                  Algorithm::Naive}) {
              std::snprintf(what, sizeof what, "bwd x%d g%d n%d m%lld add%d gw%d %s", int(xt),
                            int(yt), n, (long long)m, add, gw, algorithm_name(alg));
              guarded(what, [&] { return plan_backward(b, alg); }, gw == 1);
            }
            std::snprintf(what, sizeof what, "layer_bwd x%d g%d n%d m%lld add%d gw%d", int(xt),
                          int(yt), n, (long long)m, add, gw);
            if (layer_norm_planned(xt, yt, n, add))
              guarded(what, [&] { return plan_layer_backward(b); }, gw == 1);
            else if (!check_mode)
              std::printf("%s | not planned\n", what);
          }
        }
      }
    }
  }
  if (check_mode)
    std::printf("plan_dump --check, family %d: %ld violations\n", detail::target().family,
                violations);
  return violations == 0 ? 0 : 1;
}
