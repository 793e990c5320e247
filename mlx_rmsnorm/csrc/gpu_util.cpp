// The helpers of the primitives' GPU evaluation (gpu_util.h).
#ifdef MLX_RMSNORM_CUDA

#include "gpu_util.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "device_memory.h"

namespace mlx_rmsnorm {

namespace gpu {

rmsnorm::DType kernel_dtype(mx::Dtype t) {
  switch (t) {
    case mx::float32:
      return rmsnorm::DType::F32;
    case mx::float16:
      return rmsnorm::DType::F16;
    case mx::bfloat16:
      return rmsnorm::DType::BF16;
    default:
      throw std::runtime_error("[mlx_rmsnorm] unsupported dtype on the GPU");
  }
}

rmsnorm::Algorithm kernel_algorithm(Algorithm a) {
  static_assert(static_cast<int>(Algorithm::Auto) == static_cast<int>(rmsnorm::Algorithm::Auto) &&
                static_cast<int>(Algorithm::Persistent) ==
                    static_cast<int>(rmsnorm::Algorithm::Persistent) &&
                static_cast<int>(Algorithm::Split) == static_cast<int>(rmsnorm::Algorithm::Split) &&
                static_cast<int>(Algorithm::Naive) == static_cast<int>(rmsnorm::Algorithm::Naive));
  return static_cast<rmsnorm::Algorithm>(static_cast<int>(a));
}

const void* ptr(const mx::array& a) { return mx::gpu_ptr<void>(a); }
void* ptr(mx::array& a) { return mx::gpu_ptr<void>(a); }

void allocate(mx::array& out, const mx::Stream& s,
              std::initializer_list<const mx::array*> donors) {
  for (const mx::array* d : donors) {
    if (d && d->is_donatable() && d->dtype() == out.dtype() &&
        d->flags().row_contiguous && d->size() == out.size()) {
      out.copy_shared_buffer(*d);
      return;
    }
  }
  allocate_device(out, s.device.index);
}

mx::array temporary(const mx::Shape& shape, mx::Dtype dtype, const mx::Stream& s,
                    mx::cu::CommandEncoder& enc) {
  mx::array a(shape, dtype, nullptr, {});
  allocate(a, s);
  enc.add_temporary(a);
  return a;
}

// Our kernels run through our own copy of the CUDA runtime: see
// rmsnorm::use_device (no runtime call while the device stays the same).
void use_device(const mx::Stream& s) { rmsnorm::use_device(s.device.index); }

const mx::array& rows_of(const mx::array& in, std::optional<mx::array>& copy,
                         const mx::Stream& s, mx::cu::CommandEncoder& enc,
                         bool aligned16) {
  if (in.flags().row_contiguous &&
      (!aligned16 || reinterpret_cast<uintptr_t>(ptr(in)) % 16 == 0))
    return in;
  copy = temporary(in.shape(), in.dtype(), s, enc);
  rmsnorm::GatherArgs a{};
  a.src = ptr(in);
  a.dst = ptr(*copy);
  a.count = static_cast<int64_t>(in.size());
  a.elem_bytes = static_cast<int>(in.itemsize());
  a.ndim = static_cast<int>(in.ndim());
  for (int d = 0; d < a.ndim && d < rmsnorm::kGatherMaxDims; ++d) {
    a.shape[d] = in.shape(d);
    a.strides[d] = in.strides()[d];
  }
  const rmsnorm::Plan plan = rmsnorm::plan_gather(a);
  for (const auto& c : plan.calls) {
    enc.set_input_array(in);
    enc.set_output_array(*copy);
    record(enc, c, a);
  }
  return *copy;
}

void record_cluster(mx::cu::CommandEncoder& enc, const rmsnorm::KernelCall& c,
                    const void* args) {
  // Built through our runtime, which knows the kernel; a graph is a driver
  // object, so MLX's runtime takes it. Adding it clones it: ours goes after.
  cudaGraph_t child = nullptr;
  const cudaError_t err = rmsnorm::kernel_graph(c, args, &child);
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("[mlx_rmsnorm] a cluster launch's graph: ") +
                             cudaGetErrorString(err));
  struct Destroy {
    void operator()(cudaGraph_t g) const { cudaGraphDestroy(g); }
  };
  std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, Destroy> owned(child);
  enc.add_graph_node(child, "(K" + std::to_string(c.cluster) + ")", /*is_updatable=*/true);
}

void record_backward(mx::cu::CommandEncoder& enc, const mx::Stream& s,
                     const rmsnorm::Plan& plan, rmsnorm::BwdArgs& a,
                     std::initializer_list<const mx::array*> inputs, mx::array& gx,
                     std::initializer_list<mx::array*> column_sums) {
  std::optional<mx::array> tmp;
  if (plan.scratch_bytes > 0) {
    // fp32 scratch (the column partials, row statistics)
    tmp = temporary({static_cast<int>((plan.scratch_bytes + 3) / 4)}, mx::float32, s, enc);
    rmsnorm::bind_scratch(a, plan, ptr(*tmp));
  }
  // MLX orders graph nodes by the arrays declared before each one, and a
  // node that reads an array waits for the last node that declared it as an
  // output. The inputs are declared once, before the chain's first node:
  // declared again, their bytes would count again toward the size at which
  // MLX commits its graph (1000 MB on Hopper; a 32768 x 4096 bf16 backward
  // then ended a graph at every call, 0.95x the built-in, instead of every
  // other one). The nodes of the chain follow each other through the
  // scratch and the column sums; gx is declared up to the node that writes
  // it, so what reads gx need not wait for the column sums that finish gw.
  for (std::size_t i = 0; i < plan.calls.size(); ++i) {
    if (i == 0)
      for (const mx::array* in : inputs)
        if (in) enc.set_input_array(*in);
    if (tmp) {
      enc.set_input_array(*tmp);
      enc.set_output_array(*tmp);
    }
    if (i <= static_cast<std::size_t>(plan.gx_call)) enc.set_output_array(gx);
    for (mx::array* out : column_sums)
      if (out) enc.set_output_array(*out);
    record(enc, plan.calls[i], a);
  }
}

namespace {

// What FwdArgs and BwdArgs both carry: x and w, the rows, eps and offset.
template <typename Args>
void set_rows(Args& a, const NormPrimitive& prim, const mx::array& x, const mx::array* w) {
  a.x = ptr(x);
  a.w = w ? ptr(*w) : nullptr;
  a.n = x.shape(-1);
  a.rows = a.n == 0 ? 0 : static_cast<int64_t>(x.size() / a.n);
  a.eps = prim.eps();
  a.offset = prim.offset();
  a.x_dtype = kernel_dtype(x.dtype());
  a.w_dtype = w ? kernel_dtype(w->dtype()) : rmsnorm::DType::None;
}

}  // namespace

ForwardCall::ForwardCall(NormPrimitive& prim, const std::vector<mx::array>& inputs,
                         std::vector<mx::array>& outputs, bool aligned16)
    : enc(mx::cu::get_command_encoder(prim.stream())) {
  const mx::Stream s = prim.stream();
  use_device(s);
  // Members, not locals: rows_of returns a row-contiguous input itself, and
  // run() reads w_ and b_ after this constructor has returned.
  w_in_ = prim.weight(inputs), b_in_ = prim.bias(inputs);
  x_ = &rows_of(inputs[0], x_copy_, s, enc, aligned16);
  res_ = prim.add() ? &rows_of(inputs[1], r_copy_, s, enc, aligned16) : nullptr;
  w_ = w_in_ ? &rows_of(*w_in_, w_copy_, s, enc) : nullptr;
  b_ = b_in_ ? &rows_of(*b_in_, b_copy_, s, enc) : nullptr;
  y_ = &outputs[0];
  h_ = prim.add() ? &outputs[1] : nullptr;
  if (h_) {
    // h takes x's buffer or residual's, y the other one where dtypes allow
    // (every row element is read before it is written, by the same thread).
    allocate(*h_, s, {x_, res_});
    auto free_donor = [&](const mx::array& d) {
      return d.data_shared_ptr() == h_->data_shared_ptr() ? nullptr : &d;
    };
    allocate(*y_, s, {free_donor(*x_), free_donor(*res_)});
  } else {
    allocate(*y_, s, {x_});
  }
  rmsnorm::FwdArgs& a = args;
  set_rows(a, prim, *x_, w_);
  a.b = b_ ? ptr(*b_) : nullptr;
  a.y = ptr(*y_);
  a.residual = res_ ? ptr(*res_) : nullptr;
  a.h = h_ ? ptr(*h_) : nullptr;
  a.b_dtype = b_ ? kernel_dtype(b_->dtype()) : rmsnorm::DType::None;
  a.y_dtype = kernel_dtype(y_->dtype());
}

void ForwardCall::run(const rmsnorm::Plan& plan) {
  enc.set_input_array(*x_);
  if (res_) enc.set_input_array(*res_);
  if (w_) enc.set_input_array(*w_);
  if (b_) enc.set_input_array(*b_);
  enc.set_output_array(*y_);
  if (h_) enc.set_output_array(*h_);
  for (const auto& c : plan.calls) record(enc, c, args);
}

BackwardCall::BackwardCall(NormPrimitive& prim, const std::vector<mx::array>& inputs,
                           std::vector<mx::array>& outputs, bool aligned16)
    : enc(mx::cu::get_command_encoder(prim.stream())), s_(prim.stream()) {
  use_device(s_);
  w_in_ = prim.weight(inputs);  // a member: see ForwardCall
  x_ = &rows_of(inputs[0], x_copy_, s_, enc, aligned16);
  w_ = w_in_ ? &rows_of(*w_in_, w_copy_, s_, enc) : nullptr;
  g_ = &rows_of(prim.tail(inputs, 0), g_copy_, s_, enc, aligned16);
  gh_ = prim.add() ? &rows_of(prim.tail(inputs, 1), gh_copy_, s_, enc, aligned16) : nullptr;
  gx_ = &outputs[0];
  gw_ = prim.has_gw() ? &outputs[1] : nullptr;
  gb_ = prim.need_gb() ? &outputs.back() : nullptr;
  // gx takes g_h's buffer first (the fused add), else x's or g's
  if (gh_) {
    allocate(*gx_, s_, {gh_, x_, g_});
  } else {
    allocate(*gx_, s_, {x_, g_});
  }
  if (gw_) allocate(*gw_, s_);
  if (gb_) allocate(*gb_, s_);
  rmsnorm::BwdArgs& a = args;
  set_rows(a, prim, *x_, w_);
  a.g = ptr(*g_);
  a.gh = gh_ ? ptr(*gh_) : nullptr;
  a.gx = ptr(*gx_);
  a.gw = gw_ ? ptr(*gw_) : nullptr;
  a.gb = gb_ ? ptr(*gb_) : nullptr;
  a.b_dtype = gb_ ? kernel_dtype(gb_->dtype()) : rmsnorm::DType::None;
  a.g_dtype = kernel_dtype(g_->dtype());
}

void BackwardCall::run(const rmsnorm::Plan& plan) {
  record_backward(enc, s_, plan, args, {x_, w_, g_, gh_}, *gx_, {gw_, gb_});
}

}  // namespace gpu

}  // namespace mlx_rmsnorm

#endif  // MLX_RMSNORM_CUDA
