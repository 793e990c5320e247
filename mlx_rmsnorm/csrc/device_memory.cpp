#include "device_memory.h"

#ifdef MLX_RMSNORM_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "mlx/backend/cuda/allocator.h"
#include "mlx/memory.h"

namespace mlx_rmsnorm {

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear a sticky allocation error
    throw std::runtime_error(std::string("[mlx_rmsnorm] ") + what + ": " +
                             cudaGetErrorString(err));
  }
}

bool use_mlx_allocator() {
  static const bool mlx = [] {
    // "mlx", any case, spaces around ignored: the rule of every variable
    // (_autopatch.read_environment, which stops the program at import on a
    // value that is neither "pool" nor "mlx")
    const char* v = std::getenv("MLX_RMSNORM_ALLOCATOR");
    std::string s = v ? v : "";
    const auto first = s.find_first_not_of(" \t\n");
    s = first == std::string::npos ? "" : s.substr(first, s.find_last_not_of(" \t\n") - first + 1);
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s == "mlx";
  }();
  return mlx;
}

// Block sizes are rounded so that a block freed by one call fits the next
// call of a similar shape: 512 B steps up to 64 KiB, then 64 KiB steps.
std::size_t round_size(std::size_t bytes) {
  const std::size_t step = bytes <= (64u << 10) ? 512 : (64u << 10);
  return (bytes + step - 1) / step * step;
}

// The cache holds at most what was ever live at once (a training step's
// outputs, kept for the backward), and never less than this.
constexpr std::size_t kMinCacheLimit = std::size_t(64) << 20;

// A block our arrays gave back, and when (a count of frees).
struct Freed {
  void* ptr;
  std::uint64_t at;
};

struct Pool {
  cudaMemPool_t pool = nullptr;
  cudaStream_t stream = nullptr;  // orders our allocations and frees only
  // Blocks our arrays gave back, by size. MLX drops an array only after the
  // GPU work that used it has completed (it keeps inputs and temporaries
  // alive until then), so a cached block can be handed out again at once:
  // no CUDA call and no host sync, which is what a call costs otherwise.
  std::multimap<std::size_t, Freed> cache;
  std::uint64_t frees = 0;
  std::size_t cached = 0;
  std::size_t in_use = 0;
  std::size_t peak_in_use = 0;
};

// Never destroyed: arrays that Python frees at exit still come back here.
std::mutex& mutex = *new std::mutex;
std::map<int, Pool>& pools = *new std::map<int, Pool>;

// The functions below run with `mutex` held.

Pool& pool_for(int device) {
  Pool& p = pools[device];
  if (p.pool == nullptr) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    check(cudaMemPoolCreate(&p.pool, &props), "cudaMemPoolCreate");
    // Keep freed memory for the next step instead of returning it to the
    // driver at every synchronization (the default threshold is 0).
    std::uint64_t keep = UINT64_MAX;
    check(cudaMemPoolSetAttribute(p.pool, cudaMemPoolAttrReleaseThreshold, &keep),
          "cudaMemPoolSetAttribute");
    check(cudaStreamCreateWithFlags(&p.stream, cudaStreamNonBlocking),
          "cudaStreamCreate");
  }
  return p;
}

// Gives cached blocks back to the pool until at most `keep` bytes stay,
// the longest unused first. (Largest first, as before, gave back the block
// that the next call of the current shape was about to take whenever blocks
// of earlier shapes filled the cache: measured with scripts/cuda_calls.py, a
// one-call 8192x2048 backward then paid 2 allocations, 2 host syncs and 2
// frees every eval, and a 20-call 8192x1024 backward 9 of each.)
void release_cached(Pool& p, std::size_t keep) {
  while (p.cached > keep && !p.cache.empty()) {
    auto oldest = p.cache.begin();
    for (auto it = p.cache.begin(); it != p.cache.end(); ++it)
      if (it->second.at < oldest->second.at) oldest = it;
    cudaFreeAsync(oldest->second.ptr, p.stream);
    p.cached -= oldest->first;
    p.cache.erase(oldest);
  }
}

// A cached block of at least `bytes` and at most a quarter more, if any;
// `bytes` becomes the block's size.
void* take_cached(Pool& p, std::size_t& bytes) {
  auto it = p.cache.lower_bound(bytes);
  if (it == p.cache.end() || it->first > bytes + bytes / 4) return nullptr;
  void* ptr = it->second.ptr;
  bytes = it->first;
  p.cached -= bytes;
  p.cache.erase(it);
  return ptr;
}

void* pool_malloc(Pool& p, std::size_t bytes) {
  void* ptr = nullptr;
  cudaError_t err = cudaMallocFromPoolAsync(&ptr, bytes, p.pool, p.stream);
  if (err == cudaErrorMemoryAllocation) {
    // Our cache or MLX's may hold what we need: let both go, try once more.
    cudaGetLastError();
    release_cached(p, 0);
    mx::clear_cache();
    err = cudaMallocFromPoolAsync(&ptr, bytes, p.pool, p.stream);
  }
  check(err, ("allocating " + std::to_string(bytes) + " bytes of GPU memory").c_str());
  // The memory is usable on MLX's stream once our stream has handed it out.
  check(cudaStreamSynchronize(p.stream), "cudaStreamSynchronize");
  return ptr;
}

}  // namespace

void allocate_device(mx::array& a, int device) {
  if (use_mlx_allocator() || a.nbytes() == 0) {
    a.set_data(mx::allocator::malloc(a.nbytes()));
    return;
  }
  std::size_t bytes = round_size(a.nbytes());
  void* ptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    Pool& p = pool_for(device);
    ptr = take_cached(p, bytes);
    if (ptr == nullptr) ptr = pool_malloc(p, bytes);
    p.in_use += bytes;
    p.peak_in_use = std::max(p.peak_in_use, p.in_use);
  }
  // The buffer's size is the block's, so that it goes back to the cache
  // under the size it was taken with.
  auto* buf = new mx::cu::CudaBuffer{ptr, bytes, device};
  a.set_data(mx::allocator::Data(
      mx::allocator::Buffer(buf), [device, bytes](mx::allocator::Buffer b) {
        auto* cb = static_cast<mx::cu::CudaBuffer*>(b.ptr());
        {
          std::lock_guard<std::mutex> lock(mutex);
          Pool& p = pools[device];
          p.in_use -= bytes;
          if (cb->device >= 0) {
            p.cache.emplace(bytes, Freed{cb->data, ++p.frees});
            p.cached += bytes;
            release_cached(p, std::max(p.peak_in_use, kMinCacheLimit));
          }
        }
        // A host read of the array moved it to managed memory (MLX freed
        // our block then, back into our pool): free the managed copy.
        if (cb->device < 0 && cb->data != nullptr) cudaFree(cb->data);
        delete cb;
      }));
}

PoolStats pool_stats(int device) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = pools.find(device);
  if (it == pools.end()) return {0, 0};
  std::uint64_t reserved = 0;
  cudaMemPoolGetAttribute(it->second.pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
  return {it->second.in_use, reserved};
}

void trim_pool(int device) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = pools.find(device);
  if (it == pools.end()) return;
  release_cached(it->second, 0);
  cudaStreamSynchronize(it->second.stream);
  cudaMemPoolTrimTo(it->second.pool, 0);
}

}  // namespace mlx_rmsnorm

#else  // CPU flavor: no GPU memory of ours

namespace mlx_rmsnorm {
void allocate_device(mx::array& a, int) {
  a.set_data(mx::allocator::malloc(a.nbytes()));
}
PoolStats pool_stats(int) { return {0, 0}; }
void trim_pool(int) {}
}  // namespace mlx_rmsnorm

#endif
