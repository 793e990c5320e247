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

struct Pool {
  cudaMemPool_t pool = nullptr;
  cudaStream_t stream = nullptr;  // orders our allocations and frees only
};

std::mutex mutex;
std::map<int, Pool> pools;

Pool& pool_for(int device) {
  std::lock_guard<std::mutex> lock(mutex);
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

void* pool_malloc(Pool& p, size_t bytes) {
  void* ptr = nullptr;
  cudaError_t err = cudaMallocFromPoolAsync(&ptr, bytes, p.pool, p.stream);
  if (err == cudaErrorMemoryAllocation) {
    // MLX's cache may hold what we need: let it go and try once more.
    cudaGetLastError();
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
  Pool& p = pool_for(device);
  void* ptr = pool_malloc(p, a.nbytes());
  auto* buf = new mx::cu::CudaBuffer{ptr, a.nbytes(), device};
  cudaStream_t stream = p.stream;
  // MLX drops an array only after the GPU work that used it has completed
  // (it keeps inputs alive until then), so the memory can go straight back.
  // A host read of the array first moves it to managed memory (MLX frees our
  // device pointer then): the buffer then says device -1.
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
  cudaMemPoolGetAttribute(it->second.pool, cudaMemPoolAttrUsedMemCurrent, &used);
  cudaMemPoolGetAttribute(it->second.pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
  return {used, reserved};
}

void trim_pool(int device) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = pools.find(device);
  if (it == pools.end()) return;
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
