// Python bindings of the extension module mlx_rmsnorm._ext.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <cstdint>
#include <map>

#include "mlx/fast.h"

#include "device_memory.h"
#ifdef MLX_RMSNORM_CUDA
#include <cuda_runtime.h>

#include "gpu_util.h"  // kernel_dtype
#include "rmsnorm.h"   // cuda/: device_family
#endif
#include "op_util.h"
#include "ops.h"
#include "routing.h"

namespace nb = nanobind;
using namespace nb::literals;
namespace mx = mlx::core;

namespace {

// Whether patch()'s routed functions run the plugin on CPU streams too
// (routing.h says why they do not by default). The tests turn it on to run
// our CPU path under patch().
std::atomic<bool> route_cpu{false};

// Where a routed call on stream `s` runs (routing.h).
bool builtin_here(const mx::Stream& s) {
  return mlx_rmsnorm::route(s.device.type, mlx_rmsnorm::has_kernels(s.device.type),
                            route_cpu.load(std::memory_order_relaxed)) ==
         mlx_rmsnorm::Route::Builtin;
}

mx::Device::DeviceType device_kind(const std::string& kind) {
  if (kind == "cpu") return mx::Device::DeviceType::cpu;
  if (kind == "gpu") return mx::Device::DeviceType::gpu;
  throw std::invalid_argument("[_route] device_kind must be 'cpu' or 'gpu' but got '" + kind +
                              "'.");
}

// mx.fast's own docstrings: patch() puts these functions in mx.fast's place.
constexpr const char* kRmsNormDoc = R"(
        Root Mean Square normalization (RMS norm).

        The normalization is with respect to the last axis of the input ``x``.

        Args:
            x (array): Input array.
            weight (array, optional): A multiplicative weight to scale the result by.
              The ``weight`` should be one-dimensional with the same size
              as the last axis of ``x``. If set to ``None`` then no scaling happens.
            eps (float): A small additive constant for numerical stability.

        Returns:
            array: The output array.
      )";

constexpr const char* kLayerNormDoc = R"(
        Layer normalization.

        The normalization is with respect to the last axis of the input ``x``.

        Args:
            x (array): Input array.
            weight (array, optional): A multiplicative weight to scale the result by.
              The ``weight`` should be one-dimensional with the same size
              as the last axis of ``x``. If set to ``None`` then no scaling happens.
            bias (array, optional): An additive offset to be added to the result.
              The ``bias`` should be one-dimensional with the same size
              as the last axis of ``x``. If set to ``None`` then no translation happens.
            eps (float): A small additive constant for numerical stability.

        Returns:
            array: The output array.
      )";

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "RMSNorm primitives for MLX (forward and backward kernels).";

  m.attr("has_cuda_kernels") =
#ifdef MLX_RMSNORM_CUDA
      true;
#else
      false;
#endif

  m.def(
      "gpu_family",
      [](int device) -> int {
#ifdef MLX_RMSNORM_CUDA
        if (cudaSetDevice(device) != cudaSuccess)
          throw std::runtime_error("[mlx_rmsnorm] no CUDA device " + std::to_string(device));
        return rmsnorm::device_family();
#else
        (void)device;
        return 0;
#endif
      },
      "device"_a = 0,
      R"(The GPU family whose launch plans run on ``device``: 90 (bulk copies),
        80 (per-thread asynchronous copies) or 75 (plain loads), from the
        architecture of the code the GPU runs (a PTX-only compute_80 build
        on an H200 says 80). 0 on a build without CUDA kernels. Raises
        ``RuntimeError`` naming the GPU and the rebuild command when this
        build has no code for it.)");

  m.def(
      "rms_norm",
      [](const mx::array& x, const std::optional<mx::array>& weight, float eps,
         float offset, mx::StreamOrDevice s) {
        return mlx_rmsnorm::rms_norm(x, weight, eps, s, offset);
      },
      "x"_a, "weight"_a.none(), "eps"_a, nb::kw_only(), "offset"_a = 0.f,
      "stream"_a = nb::none(),
        R"(Root Mean Square normalization (RMS norm).

        Normalizes ``x`` over its last axis and scales by ``weight``:
        ``y = x * rsqrt(mean(x**2, axis=-1) + eps) * weight``.

        Args:
            x (array): Input array with at least one dimension.
            weight (array, optional): 1-D array of size ``x.shape[-1]``, or
              ``None`` for no scaling.
            eps (float): Added to the mean square for numerical stability.
            offset (float): Scale by ``offset + weight`` instead, formed in
              fp32 (Gemma's ``1 + w`` without rounding it to the weight's
              dtype first). Needs a weight. Default: ``0``.
            stream (Stream, optional): Stream or device.

        Returns:
            array: ``y`` with the shape of ``x`` and dtype
            ``result_type(x, weight)``.
        )");

  m.def(
      "add_rms_norm",
      [](const mx::array& x, const mx::array& residual,
         const std::optional<mx::array>& weight, float eps, float offset,
         mx::StreamOrDevice s) {
        auto out = mlx_rmsnorm::add_rms_norm(x, residual, weight, eps, offset, s);
        return std::make_pair(out[0], out[1]);
      },
      "x"_a, "residual"_a, "weight"_a.none(), "eps"_a, nb::kw_only(),
      "offset"_a = 0.f, "stream"_a = nb::none(),
      R"(Fused residual add and RMS norm: ``h = x + residual``,
        ``y = rms_norm(h, weight, eps, offset=offset)``, in one pass.

        The pre-norm transformer's ``h = x + r; y = norm(h)``: the norm reads
        ``h`` as stored (rounded to its dtype), as the unfused composition
        does. Differentiable (both outputs' cotangents; ``x`` and ``residual``
        get the same gradient) through one backward pass.

        ``x`` and ``residual`` take any shapes that ``x + residual``
        broadcasts (a residual of shape ``(N,)`` or ``(1, N)``, either way
        round). The smaller one is expanded to ``h``'s shape first: on the
        GPU a copy, so the fused op then moves about as much memory as the
        unfused ``x + residual`` and ``rms_norm`` do (no speed-up; same
        values and gradients, summed back over the broadcast axes).

        Args:
            x (array): Input; with ``residual`` at least one dimension.
            residual (array): Added to ``x``; same shape or broadcast.
            weight (array, optional): 1-D of size ``h.shape[-1]``, or ``None``.
            eps (float): Added to the mean square for numerical stability.
            offset (float): Scale by ``offset + weight`` formed in fp32
              (Gemma: ``1.0``). Needs a weight. Default: ``0``.
            stream (Stream, optional): Stream or device.

        Returns:
            tuple(array, array): ``(y, h)``; ``h`` has dtype
            ``result_type(x, residual)``, ``y`` ``result_type(h, weight)``.
        )");

  m.def(
      "rms_norm_vjp",
      [](const mx::array& x, const std::optional<mx::array>& weight,
         const mx::array& g, float eps, bool need_gw, const std::string& algorithm,
         mx::StreamOrDevice s) -> std::pair<mx::array, std::optional<mx::array>> {
        auto out = mlx_rmsnorm::rms_norm_vjp(
            x, weight, g, eps, mlx_rmsnorm::parse_algorithm(algorithm), need_gw, s);
        if (out.size() == 2) return {out[0], out[1]};
        return {out[0], std::nullopt};
      },
      "x"_a, "weight"_a.none(), "g"_a, "eps"_a, nb::kw_only(),
      "need_gw"_a = true, "algorithm"_a = "auto", "stream"_a = nb::none(),
      R"(Backward of :func:`rms_norm`.

        Args:
            x (array): The forward input.
            weight (array, optional): The forward weight, or ``None``.
            g (array): Gradient of the loss with respect to ``y``; same shape
              as ``x``.
            eps (float): The forward ``eps``.
            need_gw (bool): Compute the weight's gradient (default). With
              ``False`` no work is done for it and ``gw`` is ``None``.
            algorithm (str): GPU backward: ``"auto"`` (default),
              ``"persistent"``, ``"split"`` or ``"naive"`` (the 3-kernel
              baseline). Ignored on the CPU.
            stream (Stream, optional): Stream or device.

        Returns:
            tuple(array, array or None): ``(gx, gw)``; ``gw`` is ``None``
            without a weight or with ``need_gw=False``.
        )");

  m.def("layer_norm", &mlx_rmsnorm::layer_norm, "x"_a, "weight"_a.none(), "bias"_a.none(),
        "eps"_a, nb::kw_only(), "stream"_a = nb::none(),
        R"(Layer normalization, with the contract of ``mx.fast.layer_norm``.

        Normalizes ``x`` over its last axis, then scales by ``weight`` and
        shifts by ``bias``: ``y = (x - mean) * rsqrt(var + eps) * weight + bias``.

        Args:
            x (array): Input array with at least one dimension.
            weight (array, optional): 1-D array of size ``x.shape[-1]``, or
              ``None`` for no scaling.
            bias (array, optional): 1-D array of size ``x.shape[-1]``, or
              ``None`` for no shift.
            eps (float): Added to the variance for numerical stability.
            stream (Stream, optional): Stream or device.

        Returns:
            array: ``y`` with the shape of ``x``; dtype
            ``result_type(x, weight, bias)`` with a weight, ``x.dtype``
            without one (the built-in's rule).
        )");

  m.def(
      "layer_norm_vjp",
      [](const mx::array& x, const std::optional<mx::array>& weight,
         const std::optional<mx::array>& bias, const mx::array& g, float eps,
         bool need_gw, bool need_gb, mx::StreamOrDevice s) {
        auto out = mlx_rmsnorm::layer_norm_vjp(x, weight, bias, g, eps, need_gw, need_gb, s);
        return std::make_tuple(*out[0], out[1], out[2]);
      },
      "x"_a, "weight"_a.none(), "bias"_a.none(), "g"_a, "eps"_a, nb::kw_only(),
      "need_gw"_a = true, "need_gb"_a = true, "stream"_a = nb::none(),
      R"(Backward of :func:`layer_norm`.

        Returns:
            tuple(array, array or None, array or None): ``(gx, gw, gb)``;
            ``gw`` is ``None`` without a weight or with ``need_gw=False``,
            ``gb`` likewise for the bias.
        )");

  m.def(
      "add_layer_norm",
      [](const mx::array& x, const mx::array& residual, const std::optional<mx::array>& weight,
         const std::optional<mx::array>& bias, float eps, mx::StreamOrDevice s) {
        auto out = mlx_rmsnorm::add_layer_norm(x, residual, weight, bias, eps, s);
        return std::make_pair(out[0], out[1]);
      },
      "x"_a, "residual"_a, "weight"_a.none(), "bias"_a.none(), "eps"_a, nb::kw_only(),
      "stream"_a = nb::none(),
      R"(Fused residual add and layer norm: ``h = x + residual``,
        ``y = layer_norm(h, weight, bias, eps)``, in one pass.

        The pre-norm transformer's ``h = x + r; y = norm(h)`` with a
        LayerNorm: the norm reads ``h`` as stored (rounded to its dtype), as
        the unfused composition does. Differentiable (both outputs'
        cotangents; ``x`` and ``residual`` get the same gradient) through one
        backward pass.

        ``x`` and ``residual`` take any shapes that ``x + residual``
        broadcasts (a residual of shape ``(N,)`` or ``(1, N)``, either way
        round). The smaller one is expanded to ``h``'s shape first: on the
        GPU a copy, so the fused op then moves about as much memory as the
        unfused ``x + residual`` and ``layer_norm`` do (no speed-up; same
        values and gradients, summed back over the broadcast axes).

        Args:
            x (array): Input; with ``residual`` at least one dimension.
            residual (array): Added to ``x``; same shape or broadcast.
            weight (array, optional): 1-D of size ``h.shape[-1]``, or ``None``
              for no scaling.
            bias (array, optional): 1-D of size ``h.shape[-1]``, or ``None``
              for no shift.
            eps (float): Added to the variance for numerical stability.
            stream (Stream, optional): Stream or device.

        Returns:
            tuple(array, array): ``(y, h)``; ``h`` has dtype
            ``result_type(x, residual)``, ``y`` that of ``layer_norm(h,
            weight, bias)``: ``result_type(h, weight, bias)`` with a weight,
            ``h.dtype`` without one.
        )");

  m.def(
      "add_layer_norm_vjp",
      [](const mx::array& h, const std::optional<mx::array>& weight,
         const std::optional<mx::array>& bias, const mx::array& g_y, const mx::array& g_h,
         float eps, bool need_gw, bool need_gb, mx::StreamOrDevice s) {
        auto out = mlx_rmsnorm::add_layer_norm_vjp(h, weight, bias, g_y, g_h, eps, need_gw,
                                                   need_gb, s);
        return std::make_tuple(*out[0], out[1], out[2]);
      },
      "h"_a, "weight"_a.none(), "bias"_a.none(), "g_y"_a, "g_h"_a, "eps"_a, nb::kw_only(),
      "need_gw"_a = true, "need_gb"_a = true, "stream"_a = nb::none(),
      R"(Backward of :func:`add_layer_norm` from its output ``h``.

        Returns:
            tuple(array, array or None, array or None): ``(gx, gw, gb)``:
            ``gx = g_h + d(norm)/dh`` is the gradient of both ``x`` and
            ``residual``; ``gw`` is ``None`` without a weight or with
            ``need_gw=False``, ``gb`` likewise for the bias.
        )");

  // What patch() puts in mx.fast's place: mx.fast's signatures and
  // docstrings; MLX's own op on a CPU stream (unless _set_route_cpu(True))
  // and on a stream this build has no kernels for (a Metal GPU), ours
  // elsewhere. In C++ rather than a Python wrapper: a decode step is
  // bound by the host, where a Python layer costs about 1 us a call.
  m.def(
      "routed_rms_norm",
      [](const mx::array& x, const std::optional<mx::array>& weight, float eps,
         mx::StreamOrDevice s) {
        auto stream = mx::to_stream(s);
        if (builtin_here(stream))
          return mlx_rmsnorm::builtin_rms_norm(x, weight, eps, 0.f, stream);
        return mlx_rmsnorm::rms_norm(x, weight, eps, stream);
      },
      "x"_a, "weight"_a.none(), "eps"_a, nb::kw_only(), "stream"_a = nb::none(),
      nb::sig("def routed_rms_norm(x: array, weight: array | None, eps: float, *, "
              "stream: StreamOrDevice = None) -> array"),
      kRmsNormDoc);
  m.def(
      "routed_layer_norm",
      [](const mx::array& x, const std::optional<mx::array>& weight,
         const std::optional<mx::array>& bias, float eps, mx::StreamOrDevice s) {
        auto stream = mx::to_stream(s);
        if (builtin_here(stream))
          return mlx_rmsnorm::builtin_layer_norm(x, weight, bias, eps, stream);
        return mlx_rmsnorm::layer_norm(x, weight, bias, eps, stream);
      },
      "x"_a, "weight"_a.none(), "bias"_a.none(), "eps"_a, nb::kw_only(),
      "stream"_a = nb::none(),
      nb::sig("def routed_layer_norm(x: array, weight: array | None, bias: array | None, "
              "eps: float, *, stream: StreamOrDevice = None) -> array"),
      kLayerNormDoc);
  m.def(
      "_set_route_cpu",
      [](bool on) { return route_cpu.exchange(on); },
      "on"_a,
      "Whether routed_rms_norm / routed_layer_norm run the plugin on CPU streams "
      "too (default: MLX's own op there); returns the previous value.");

  m.def(
      "_route",
      [](const std::string& kind, bool has_kernels, bool route_cpu_on) {
        return mlx_rmsnorm::route(device_kind(kind), has_kernels, route_cpu_on) ==
                       mlx_rmsnorm::Route::Plugin
                   ? "plugin"
                   : "builtin";
      },
      "device_kind"_a, "has_kernels"_a, "route_cpu"_a,
      R"(Where routed_rms_norm / routed_layer_norm send a call: ``"plugin"`` or
        ``"builtin"`` (MLX's own op), for a stream of ``device_kind``
        (``"cpu"`` or ``"gpu"``) in a build that has (``has_kernels``) our
        kernels for it or not, with ``_set_route_cpu(route_cpu)``. The rule
        itself, callable on any machine; this build's ``has_kernels`` is
        True for ``"cpu"`` and ``has_cuda_kernels`` for ``"gpu"``.)");
  m.def(
      "_op_counts",
      []() {
        std::map<std::string, std::uint64_t> out;
        for (const auto& [key, n] : mlx_rmsnorm::op_counts()) out[key] = n;
        return out;
      },
      R"(How many times each op ran since the module was loaded, eager or
        traced: ``"RMSNormPlugin"``, ``"AddRMSNormPlugin"``,
        ``"LayerNormPlugin"``, ``"AddLayerNormPlugin"`` (a forward primitive of
        ours built) and ``"builtin_rms_norm"``, ``"builtin_layer_norm"`` (a
        call that ran MLX's mx.fast op in its place: a routed call sent to
        MLX, an export trace, a stream without our kernels, LayerNorm rows
        no plan of ours covers).)");

  m.def(
      "_backward_kernels",
      [](int64_t rows, int n, mx::Dtype x_dtype, std::optional<mx::Dtype> g_dtype, bool add) {
        std::vector<std::pair<std::string, int>> out;
#ifdef MLX_RMSNORM_CUDA
        // Planned without data: aligned stand-in addresses, never read.
        void* p = reinterpret_cast<void*>(uintptr_t{256});
        rmsnorm::BwdArgs a{};
        a.x = a.w = a.g = p;
        a.gx = a.gw = p;
        a.gh = add ? p : nullptr;
        a.rows = rows;
        a.n = n;
        a.x_dtype = a.w_dtype = mlx_rmsnorm::gpu::kernel_dtype(x_dtype);
        a.g_dtype = mlx_rmsnorm::gpu::kernel_dtype(g_dtype.value_or(x_dtype));
        for (const auto& c : rmsnorm::plan_backward(a, rmsnorm::Algorithm::Auto).calls)
          out.emplace_back(c.name, c.cluster);
#endif
        return out;
      },
      "rows"_a, "n"_a, "x_dtype"_a, "g_dtype"_a = nb::none(), "add"_a = false,
      R"(The kernels the RMSNorm backward (``add``: add_rms_norm's) of ``rows`` x
        ``n`` would launch on the current GPU, planned without data, with a
        weight and gw wanted (``g_dtype`` defaults to ``x_dtype``):
        ``[(name, cluster blocks), ...]``. Empty in a
        build without CUDA kernels. Tests and the benchmark only.)");

  // Tests only: the GPU path of layer_norm for rows that are not a whole
  // number of 16-byte vectors, on any stream.
  m.def(
      "_layer_norm_builtin_forward_reference_backward",
      [](const mx::array& x, const std::optional<mx::array>& weight,
         const std::optional<mx::array>& bias, float eps) {
        std::vector<mx::array> in = {x};
        if (weight) in.push_back(*weight);
        if (bias) in.push_back(*bias);
        return mlx_rmsnorm::detail::builtin_forward_reference_backward(
            in, weight.has_value(), bias.has_value(), eps, mx::default_stream(mx::default_device()));
      },
      "x"_a, "weight"_a.none(), "bias"_a.none(), "eps"_a);

  m.def(
      "add_rms_norm_vjp",
      [](const mx::array& h, const std::optional<mx::array>& weight, const mx::array& g_y,
         const mx::array& g_h, float eps, float offset, bool need_gw,
         mx::StreamOrDevice s) -> std::pair<mx::array, std::optional<mx::array>> {
        auto out = mlx_rmsnorm::add_rms_norm_vjp(h, weight, g_y, g_h, eps, offset, need_gw, s);
        if (out.size() == 2) return {out[0], out[1]};
        return {out[0], std::nullopt};
      },
      "h"_a, "weight"_a.none(), "g_y"_a, "g_h"_a, "eps"_a, nb::kw_only(),
      "offset"_a = 0.f, "need_gw"_a = true, "stream"_a = nb::none(),
      R"(Backward of :func:`add_rms_norm` from its output ``h``.

        Returns:
            tuple(array, array or None): ``(gx, gw)``: ``gx = g_h + d(norm)/dh``
            is the gradient of both ``x`` and ``residual``; ``gw`` is ``None``
            without a weight or with ``need_gw=False``.
        )");

  // Used by mlx_rmsnorm/_patching.py around functions that mx.export_function
  // and mx.exporter trace (MLX does not expose its own flag).
  m.def("_set_export_tracing", &mlx_rmsnorm::set_export_tracing, "on"_a,
        "Sets this thread's export-tracing flag; returns the previous value.");
  m.def("_export_tracing", &mlx_rmsnorm::export_tracing,
        "Whether this thread is tracing a function for export.");

  m.def(
      "device_memory",
      [](int device) {
        auto st = mlx_rmsnorm::pool_stats(device);
        return std::make_pair(st.in_use, st.reserved);
      },
      "device"_a = 0,
      R"(Bytes of the plugin's own GPU memory pool on ``device``:
        ``(in_use, reserved)``. Our outputs and scratch come from this pool,
        which ``mx.get_active_memory()`` does not count. ``(0, 0)`` on a
        build without CUDA kernels or before the first GPU call.)");
  m.def("trim_device_memory", &mlx_rmsnorm::trim_pool, "device"_a = 0,
        "Returns the unused part of the plugin's GPU memory pool to the driver.");
}
