#include "device_memory.h"

#ifdef MLX_RMSNORM_CUDA

#include <cuda_runtime.h>

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
    const char* v = std::getenv("MLX_RMSNORM_ALLOCATOR");
    return v != nullptr && std::strcmp(v, "mlx") == 0;
  }();
  return mlx;
}

std::mutex mutex;
std::map<int, cudaMemPool_t> pools;

cudaMemPool_t pool_for(int device) {
  std::lock_guard<std::mutex> lock(mutex);
  cudaMemPool_t& pool = pools[device];
  if (pool == nullptr) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
    // Keep freed memory for the next step instead of returning it to the
    // driver at every synchronization (the default threshold is 0).
    std::uint64_t keep = UINT64_MAX;
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
          "cudaMemPoolSetAttribute");
  }
  return pool;
}

// Stream-ordered on MLX's stream: the graph that uses the memory is launched
// on that stream after this call, and a free there (below) is ordered after
// everything launched before it, so the pool may hand the memory out again
// on that stream at once, and the host never waits.
void* pool_malloc(cudaMemPool_t pool, size_t bytes, cudaStream_t stream) {
  void* ptr = nullptr;
  cudaError_t err = cudaMallocFromPoolAsync(&ptr, bytes, pool, stream);
  if (err == cudaErrorMemoryAllocation) {
    // MLX's cache may hold what we need: let it go and try once more.
    cudaGetLastError();
    mx::clear_cache();
    err = cudaMallocFromPoolAsync(&ptr, bytes, pool, stream);
  }
  check(err, ("allocating " + std::to_string(bytes) + " bytes of GPU memory").c_str());
  return ptr;
}

}  // namespace

void allocate_device(mx::array& a, int device, void* stream_handle) {
  if (use_mlx_allocator() || a.nbytes() == 0) {
    a.set_data(mx::allocator::malloc(a.nbytes()));
    return;
  }
  auto stream = static_cast<cudaStream_t>(stream_handle);
  void* ptr = pool_malloc(pool_for(device), a.nbytes(), stream);
  auto* buf = new mx::cu::CudaBuffer{ptr, a.nbytes(), device};
  // MLX drops an array only after the GPU work that used it has completed
  // (it keeps inputs alive until then). A host read of the array first moves
  // it to managed memory (MLX frees our device pointer then): the buffer
  // then says device -1.
  a.set_data(mx::allocator::Data(
      mx::allocator::Buffer(buf), [stream](mx::allocator::Buffer b) {
        auto* cb = static_cast<mx::cu::CudaBuffer*>(b.ptr());
        if (cb->device >= 0) {
          cudaFreeAsync(cb->data, stream);
        } else if (cb->data != nullptr) {
          cudaFree(cb->data);
        }
        delete cb;
      }));
}

PoolStats pool_stats(int device) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = pools.find(device);
  if (it == pools.end()) return {0, 0};
  std::uint64_t used = 0, reserved = 0;
  cudaMemPoolGetAttribute(it->second, cudaMemPoolAttrUsedMemCurrent, &used);
  cudaMemPoolGetAttribute(it->second, cudaMemPoolAttrReservedMemCurrent, &reserved);
  return {used, reserved};
}

void trim_pool(int device) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = pools.find(device);
  if (it == pools.end()) return;
  // Frees still queued on MLX's stream return their memory once they run.
  int current = 0;
  cudaGetDevice(&current);
  cudaSetDevice(device);
  cudaDeviceSynchronize();
  cudaSetDevice(current);
  cudaMemPoolTrimTo(it->second, 0);
}

}  // namespace mlx_rmsnorm

#else  // CPU flavor: no GPU memory of ours

namespace mlx_rmsnorm {
void allocate_device(mx::array& a, int, void*) {
  a.set_data(mx::allocator::malloc(a.nbytes()));
}
PoolStats pool_stats(int) { return {0, 0}; }
void trim_pool(int) {}
}  // namespace mlx_rmsnorm

#endif
