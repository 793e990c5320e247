// Helpers shared by the standalone tools in cuda/cli: error checks, input
// data, copies back to the host, the agreement measure (and a forward
// candidate's check column) and CUDA-event timing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK(call)                                                     \
  do {                                                                  \
    cudaError_t err_ = (call);                                          \
    if (err_ != cudaSuccess) {                                          \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(err_));                           \
      std::exit(1);                                                     \
    }                                                                   \
  } while (0)

namespace cli {

// Deterministic pseudo-random bf16 values in [-1, 1) from a hash of the index
// (the tuners' inputs: no host round trip for gigabytes of data).
__global__ void fill(__nv_bfloat16* p, int64_t count, unsigned seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
       i += (int64_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16(((h & 0xffff) / 32768.f) - 1.f);
  }
}

// `count` bf16 (or, with f32, float) values from the device, as floats.
inline std::vector<float> to_host(const void* dev, size_t count, bool f32 = false) {
  std::vector<float> out(count);
  if (f32) {
    CHECK(cudaMemcpy(out.data(), dev, count * 4, cudaMemcpyDeviceToHost));
    return out;
  }
  std::vector<__nv_bfloat16> h(count);
  CHECK(cudaMemcpy(h.data(), dev, count * 2, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < count; ++i) out[i] = __bfloat162float(h[i]);
  return out;
}

// max |a - b| / max |b|.
inline double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, (double)std::fabs(a[i] - b[i]));
    den = std::max(den, (double)std::fabs(b[i]));
  }
  return den > 0 ? num / den : num;
}

// The check column of a forward candidate: the first y at a shape becomes
// the reference ("reference"); a later one reports its largest relative
// difference from it, and one past 1e-2 ("DIFFER") sets status to 1.
inline std::string check_y(std::vector<float>& ref, const std::vector<float>& y, int& status) {
  if (ref.empty()) {
    ref = y;
    return "reference";
  }
  const double d = max_rel_diff(y, ref);
  const bool ok = d <= 1e-2;
  if (!ok) status = 1;
  char text[48];
  std::snprintf(text, sizeof text, "y %.1e %s", d, ok ? "ok" : "DIFFER");
  return text;
}

// Median over `iters` timed runs of launch() (CUDA events on the default
// stream), after one untimed run.
template <typename Launch>
double median_us(int iters, Launch launch) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  launch();
  CHECK(cudaDeviceSynchronize());
  std::vector<float> times;
  for (int i = 0; i < iters; ++i) {
    CHECK(cudaEventRecord(start));
    launch();
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1000.f);
  }
  CHECK(cudaGetLastError());
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Median over `graphs` replays of one CUDA graph that holds `per_graph`
// back-to-back runs of launch(stream), after one untimed replay: us per run
// (a chain of small kernels as MLX records them, launch gaps included).
template <typename Launch>
double graph_median_us(cudaStream_t stream, int per_graph, int graphs, Launch launch) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int k = 0; k < per_graph; ++k) launch(stream);
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  std::vector<float> times;
  for (int r = 0; r < graphs; ++r) {
    CHECK(cudaEventRecord(start, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1000.f / per_graph);
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace cli
