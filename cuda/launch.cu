// Host helpers shared by the planners, and the plain-runtime launcher used by
// the standalone CLI.
#include <map>
#include <mutex>
#include <tuple>

#include "dispatch.cuh"
#include "plans.h"

// The CUDA architectures this build has code for (the build sets it).
#ifndef RMSNORM_CUDA_ARCHS
#define RMSNORM_CUDA_ARCHS "(unknown)"
#endif

namespace rmsnorm {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "float32";
    case DType::F16:
      return "float16";
    case DType::BF16:
      return "bfloat16";
    default:
      return "none";
  }
}

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::Persistent:
      return "persistent";
    case Algorithm::Split:
      return "split";
    case Algorithm::Naive:
      return "naive";
    default:
      return "auto";
  }
}

int vector_width(DType t, int n, std::initializer_list<const void*> ptrs) {
  int full = 16 / static_cast<int>(dtype_size(t));
  if (n % full != 0) return 1;
  for (const void* p : ptrs)
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return 1;
  return full;
}

void bind_scratch(BwdArgs& a, const Plan& plan, void* scratch) {
  char* base = static_cast<char*>(scratch);
  a.partials = reinterpret_cast<float*>(base + plan.partials_offset);
  a.row_stats = reinterpret_cast<float*>(base + plan.row_stats_offset);
  a.naive_rows = base + plan.naive_offset;
  a.partial_rows = plan.partial_rows;
}

cudaError_t launch(const Plan& plan, const void* args, cudaStream_t stream) {
  for (const KernelCall& c : plan.calls) {
    void* params[] = {const_cast<void*>(args)};
    cudaError_t err = cudaLaunchKernel(c.host_fn, c.grid, c.block, params,
                                       c.smem, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t kernel_graph(const KernelCall& c, const void* args, cudaGraph_t* graph) {
  cudaError_t err = cudaGraphCreate(graph, 0);
  if (err != cudaSuccess) return err;
  cudaKernelNodeParams params{};
  params.func = const_cast<void*>(c.host_fn);
  params.gridDim = c.grid;
  params.blockDim = c.block;
  params.sharedMemBytes = c.smem;
  void* arg = const_cast<void*>(args);
  params.kernelParams = &arg;  // copied into the node
  cudaGraphNode_t node;
  err = cudaGraphAddKernelNode(&node, *graph, nullptr, 0, &params);
  if (err != cudaSuccess) {
    cudaGraphDestroy(*graph);
    *graph = nullptr;
  }
  return err;
}

namespace detail {

void fail(const char* what, cudaError_t err) {
  throw std::runtime_error(std::string("[mlx_rmsnorm] ") + what + ": " +
                           cudaGetErrorString(err));
}

static std::mutex cache_mutex;

// Compiled like every kernel of ours: whether the GPU has code for it, and
// which PTX version that code came from, holds for all of them.
__global__ void probe() {}

[[noreturn]] static void no_code_for(int dev, cudaError_t err) {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, dev);
  const std::string cc = std::to_string(prop.major) + std::to_string(prop.minor);
  throw std::runtime_error(
      std::string("[mlx_rmsnorm] no GPU code for ") + prop.name + " (compute capability " +
      std::to_string(prop.major) + "." + std::to_string(prop.minor) +
      "): this build of mlx-rmsnorm has code for CUDA architectures " RMSNORM_CUDA_ARCHS
      " only (" + cudaGetErrorString(err) + "). Rebuild it for this GPU: "
      "MLX_RMSNORM_CUDA_ARCHS=" + cc +
      " pip install --force-reinstall --no-deps <mlx-rmsnorm source>, or without "
      "MLX_RMSNORM_CUDA_ARCHS for every architecture MLX supports.");
}

// The device use_device() made current on this thread; -1 before (the CLI
// never calls it: target() then asks the runtime).
static thread_local int current_device = -1;

const Target& target() {
  static std::map<int, Target> cache;
  // The last answer on this thread: map nodes never move, and a call on the
  // same device as the last one needs no lock and no runtime call.
  static thread_local const Target* last = nullptr;
  int dev = current_device;
  if (dev < 0) check(cudaGetDevice(&dev), "cudaGetDevice");
  if (last != nullptr && last->device == dev) return *last;
  std::lock_guard<std::mutex> lock(cache_mutex);
  auto it = cache.find(dev);
  if (it != cache.end()) return *(last = &it->second);
  cudaFuncAttributes attr{};
  cudaError_t err = cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(&probe));
  if (err == cudaErrorInvalidDeviceFunction || err == cudaErrorNoKernelImageForDevice ||
      err == cudaErrorUnsupportedPtxVersion) {
    cudaGetLastError();
    no_code_for(dev, err);
  }
  check(err, "cudaFuncGetAttributes");
  Target t{};
  t.device = dev;
  // ptxVersion is the virtual architecture the running code was compiled
  // for (x10): an sm_90 cubin says 90, compute_80 PTX JIT-compiled on an
  // H200 says 80, and that code has the family-80 paths (common.cuh arch).
  t.family = attr.ptxVersion >= 90 ? 90 : attr.ptxVersion >= 80 ? 80 : 75;
  check(cudaDeviceGetAttribute(&t.sms, cudaDevAttrMultiProcessorCount, dev),
        "cudaDeviceGetAttribute(SM count)");
  return *(last = &(cache[dev] = t));
}

// Lets a kernel take all the dynamic shared memory the device allows, once
// per kernel and device. One fixed limit: a kernel runs with different
// amounts for different row lengths, and a limit set to the last amount
// asked for would make a later, larger launch invalid. (The limit is only a
// permission; occupancy follows the amount each launch asks for.) Returns the
// largest dynamic amount the kernel can take. Caller holds cache_mutex.
static int allow_dynamic_smem(int dev, const void* host_fn) {
  static std::map<std::pair<int, const void*>, int> allowed;
  auto key = std::make_pair(dev, host_fn);
  auto it = allowed.find(key);
  if (it != allowed.end()) return it->second;
  int limit = 0;
  check(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
        "cudaDeviceGetAttribute(shared memory)");
  cudaFuncAttributes attr{};
  check(cudaFuncGetAttributes(&attr, host_fn), "cudaFuncGetAttributes");
  const int dynamic = limit - static_cast<int>(attr.sharedSizeBytes);
  check(cudaFuncSetAttribute(host_fn, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic),
        "cudaFuncSetAttribute(max dynamic shared memory)");
  return allowed[key] = dynamic;
}

// The answer cached under `key`, computed by f (with cache_mutex held) the
// first time. Called without the lock: target() takes it too.
template <typename Key, typename F>
static int cached(std::map<Key, int>& cache, const Key& key, F&& f) {
  std::lock_guard<std::mutex> lock(cache_mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  return cache[key] = f();
}

using OccupancyKey = std::tuple<int, const void*, int, unsigned>;

int blocks_per_sm(const void* host_fn, int block, unsigned smem) {
  static std::map<OccupancyKey, int> cache;
  const int dev = target().device;
  return cached(cache, OccupancyKey{dev, host_fn, block, smem}, [&] {
    int blocks = 0;
    if (smem <= static_cast<unsigned>(allow_dynamic_smem(dev, host_fn))) {
      check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, host_fn, block, smem),
            "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    }
    return blocks;
  });
}

int clusters_resident(const void* host_fn, int block, unsigned smem) {
  static std::map<OccupancyKey, int> cache;
  const int dev = target().device;
  return cached(cache, OccupancyKey{dev, host_fn, block, smem}, [&] {
    if (smem > static_cast<unsigned>(allow_dynamic_smem(dev, host_fn))) return 0;
    cudaFuncAttributes attr{};
    check(cudaFuncGetAttributes(&attr, host_fn), "cudaFuncGetAttributes");
    // A cluster past the portable size runs only where the kernel opts in
    // (plans::kMaxCluster); a GPU that refuses it holds none of its clusters.
    if (attr.requiredClusterWidth > plans::kMaxPortableCluster &&
        cudaFuncSetAttribute(host_fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
            cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    cudaLaunchConfig_t config{};  // one cluster of the kernel's own shape
    config.gridDim = dim3(attr.requiredClusterWidth > 0 ? attr.requiredClusterWidth : 1);
    config.blockDim = dim3(block);
    config.dynamicSmemBytes = smem;
    int clusters = 0;
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, host_fn, &config);
    // A shape this GPU cannot hold at all is "does not fit", not an error.
    if (err == cudaErrorInvalidClusterSize || err == cudaErrorInvalidValue) {
      cudaGetLastError();
      return 0;
    }
    check(err, "cudaOccupancyMaxActiveClusters");
    return clusters;
  });
}

KernelCall make_call(const void* host_fn, dim3 grid, dim3 block, unsigned smem,
                     const char* name, int cluster) {
  static std::map<std::pair<int, const void*>, cudaFunction_t> cache;
  // Every launch comes through here: a GPU this build has no code for gets
  // target()'s error (naming the GPU, the architectures built, the rebuild)
  // rather than the driver's bare "no kernel image".
  const int dev = target().device;
  cudaFunction_t fn = nullptr;
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (smem > 0) allow_dynamic_smem(dev, host_fn);
    auto key = std::make_pair(dev, host_fn);
    auto it = cache.find(key);
    if (it == cache.end()) {
      check(cudaGetFuncBySymbol(&fn, host_fn), "cudaGetFuncBySymbol");
      cache[key] = fn;
    } else {
      fn = it->second;
    }
  }
  return KernelCall{host_fn, fn, grid, block, smem, name, cluster};
}

}  // namespace detail

void use_device(int device) {
  if (device == detail::current_device) return;
  detail::check(cudaSetDevice(device), "cudaSetDevice");
  detail::current_device = device;
}

int device_family() { return detail::target().family; }

}  // namespace rmsnorm
