// Memory for the outputs and scratch of our GPU kernels.
//
// MLX's exported allocator::malloc returns managed memory, and when its cache
// hands back a buffer that an MLX op allocated on the device it first moves
// it to managed memory with a synchronous full copy (MLX 0.32: the stream
// ordered path, cu::malloc_async, is not exported). Inside a training graph
// that stalls the host on every norm call. So by default our outputs come
// from a device memory pool of our own (stream-ordered, retaining), with a
// host-side cache of freed blocks in front of it: a call whose sizes were
// seen before takes cached blocks and makes no CUDA call; only a new size
// goes to the pool, with a host sync on our own stream.
//
// MLX_RMSNORM_ALLOCATOR=mlx switches back to allocator::malloc.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mlx/array.h"

namespace mlx_rmsnorm {

namespace mx = mlx::core;

// Gives `a` fresh device memory of a.nbytes() on the stream's device.
void allocate_device(mx::array& a, int device);

struct PoolStats {
  std::uint64_t in_use;    // bytes in live arrays (block sizes)
  std::uint64_t reserved;  // bytes the pool holds from the driver (live,
                           // cached and free)
};
// Our pool on `device` (zeros when nothing was allocated there yet).
PoolStats pool_stats(int device);
// Returns the cached blocks and the pool's unused memory to the driver.
void trim_pool(int device);

}  // namespace mlx_rmsnorm
