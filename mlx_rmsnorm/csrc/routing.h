// Where a norm call runs, below both families' ops: whether this build has
// kernels for a stream, the rule patch()'s routed functions follow, the
// LayerNorm plan predicates, and how many calls ran where (_ext._op_counts).
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "mlx/array.h"
#include "mlx/stream.h"
#include "op_util.h"

namespace mlx_rmsnorm {

namespace mx = mlx::core;

// Whether this build runs our primitives on a stream of this device: the CPU
// path always (portable C++); a GPU only with the CUDA kernels, i.e. built
// against MLX's CUDA flavor. A Metal GPU (macOS) or any GPU of a CPU-flavor
// build has none.
#ifdef MLX_RMSNORM_CUDA
inline constexpr bool kGpuKernels = true;
#else
inline constexpr bool kGpuKernels = false;
#endif
inline bool has_kernels(mx::Device::DeviceType kind) {
  return kind == mx::Device::DeviceType::cpu || kGpuKernels;
}

// Where a routed call (patch()'s mx.fast.rms_norm / layer_norm) runs: MLX's
// own op on a stream we have no kernels for, and on a CPU stream unless
// route_cpu (a CPU program under patch() then computes bit for bit what it
// computes unpatched: MLX's CPU op is a composition of plain ops that tests
// compare against, ours rounds differently); ours everywhere else. Pure, so
// that the rule is tested on a CPU (_ext._route) for every device kind.
enum class Route { Plugin, Builtin };
constexpr Route route(mx::Device::DeviceType kind, bool has_kernels, bool route_cpu) {
  if (!has_kernels) return Route::Builtin;
  if (kind == mx::Device::DeviceType::cpu && !route_cpu) return Route::Builtin;
  return Route::Plugin;
}

// Whether an op called explicitly writes MLX's own ops instead of a
// primitive of ours: while an export is traced (the file then holds what
// mx.fast writes) and on a stream without our kernels (so that an explicit
// call works wherever the built-in does).
inline bool builtin_only(const mx::Stream& s) {
  return export_tracing() || !has_kernels(s.device.type);
}

// LayerNorm's plan predicates: whether our kernels take rows of n elements
// on this GPU stream (both directions have a plan; with `add`, those of the
// fused residual add); false without GPU kernels.
bool layer_gpu_planned(mx::Dtype x_type, mx::Dtype out_type, int n, const mx::Stream& s,
                       bool add = false);
// Whether rows of n elements of x_type are a whole number of 16-byte vectors.
bool vector_rows(mx::Dtype x_type, int n);

// How many calls ran where since the module was loaded: a forward primitive
// of ours built (by its name), or a call that ran MLX's mx.fast op in its
// place (a routed call sent to MLX, an export trace, a stream without our
// kernels, LayerNorm rows no plan covers). One relaxed increment a call.
enum class Counted : int {
  RMSNormPlugin,
  AddRMSNormPlugin,
  LayerNormPlugin,
  AddLayerNormPlugin,
  BuiltinRmsNorm,
  BuiltinLayerNorm,
  Count_
};
extern std::atomic<std::uint64_t> op_counters[static_cast<int>(Counted::Count_)];
inline void count(Counted c) {
  op_counters[static_cast<int>(c)].fetch_add(1, std::memory_order_relaxed);
}
// (key, count) for every Counted: "RMSNormPlugin", ..., "builtin_rms_norm",
// "builtin_layer_norm".
std::vector<std::pair<const char*, std::uint64_t>> op_counts();

}  // namespace mlx_rmsnorm
