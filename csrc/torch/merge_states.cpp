// flashext merge_attention_states: torch glue. Checks the two partial results (for the CUDA kernel
// and for tracing alike: see common.h), builds MergeStatesParams (flashext/merge_states.h) and
// launches on the current stream. Schema: registration.cpp; the public function:
// flashext/attention.py.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <array>
#include <tuple>
#include <vector>

#include "common.h"
#include "flashext/merge_states.h"

namespace flashext_torch {
namespace {

constexpr const char* kMerge = "flashext.merge_attention_states";

// o as (B, S, H, D) strides (batch, seq, head): a packed (total, H, D) tensor is B = 1.
std::array<int64_t, 3> o_strides(const at::Tensor& o) {
  return o.dim() == 4 ? std::array<int64_t, 3>{o.stride(0), o.stride(1), o.stride(2)}
                      : std::array<int64_t, 3>{0, o.stride(0), o.stride(1)};
}

// lse as (B, H, S) strides (batch, head, seq): (H, total) is B = 1.
std::array<int64_t, 3> lse_strides(const at::Tensor& lse) {
  return lse.dim() == 3 ? std::array<int64_t, 3>{lse.stride(0), lse.stride(1), lse.stride(2)}
                        : std::array<int64_t, 3>{0, lse.stride(0), lse.stride(1)};
}

std::tuple<at::Tensor, at::Tensor> merge_attention_states(const at::Tensor& o_a, const at::Tensor& lse_a,
                                                          const at::Tensor& o_b, const at::Tensor& lse_b) {
  check_float_cuda_tensor(kMerge, o_a, "o_a");
  check_same_device_dtype(kMerge, o_a, "o_a", o_b, "o_b");
  FX_CHECK(o_a.dim() == 4 || o_a.dim() == 3, kMerge,
           ": argument 'o_a' must be (batch, seqlen, heads, head_dim) or (total_tokens, heads, head_dim), got shape ",
           o_a.sym_sizes());
  FX_CHECK(o_b.sym_sizes() == o_a.sym_sizes(), kMerge, ": argument 'o_b' must have the shape of 'o_a' (",
           o_a.sym_sizes(), "), got ", o_b.sym_sizes());
  const c10::SymInt head_dim = o_a.sym_size(-1);
  FX_CHECK(head_dim % 8 == 0 && head_dim > 0, kMerge, ": head dim must be a positive multiple of 8, got ", head_dim);
  FX_CHECK(o_a.sym_stride(-1) == 1 && o_b.sym_stride(-1) == 1, kMerge,
           ": arguments 'o_a' and 'o_b' must have a contiguous last dimension");
  // lse: (B, H, S) for 4-D o, (H, total) for 3-D o, fp32 on o's device
  std::vector<c10::SymInt> lse_shape;
  if (o_a.dim() == 4) {
    lse_shape = {o_a.sym_size(0), o_a.sym_size(2), o_a.sym_size(1)};
  } else {
    lse_shape = {o_a.sym_size(1), o_a.sym_size(0)};
  }
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{lse_a, "lse_a"},
                                std::pair<const at::Tensor&, const char*>{lse_b, "lse_b"}}) {
    FX_CHECK(t.defined() && t.device() == o_a.device(), kMerge, ": argument '", name,
             "' must be on the device of 'o_a' (", o_a.device(), ")");
    FX_CHECK(t.scalar_type() == at::kFloat, kMerge, ": argument '", name, "' must be float32, got ", t.scalar_type());
    FX_CHECK(t.sym_sizes() == c10::SymIntArrayRef(lse_shape), kMerge, ": argument '", name, "' must have shape ",
             c10::SymIntArrayRef(lse_shape), ", got ", t.sym_sizes());
  }
  at::Tensor o = at::empty_symint(o_a.sym_sizes(), o_a.options());
  at::Tensor lse = at::empty_symint(lse_shape, lse_a.options());
  if (is_meta(o_a) || o.numel() == 0) return {o, lse};
  const c10::cuda::CUDAGuard guard(o_a.device());
  const at::Tensor a = aligned_rows(o_a), b = aligned_rows(o_b);
  flashext::MergeStatesParams p;
  p.o_a = a.data_ptr();
  p.o_b = b.data_ptr();
  p.o = o.data_ptr();
  p.lse_a = lse_a.data_ptr<float>();
  p.lse_b = lse_b.data_ptr<float>();
  p.lse = lse.data_ptr<float>();
  p.batch = o.dim() == 4 ? o.size(0) : 1;
  p.seqlen = o.dim() == 4 ? o.size(1) : o.size(0);
  p.heads = int(o.size(-2));
  p.head_dim = int(o.size(-1));
  const auto copy = [](int64_t (&dst)[3], const std::array<int64_t, 3>& src) {
    for (int i = 0; i < 3; ++i) dst[i] = src[i];
  };
  copy(p.o_a_strides, o_strides(a));
  copy(p.o_b_strides, o_strides(b));
  copy(p.o_strides, o_strides(o));
  copy(p.lse_a_strides, lse_strides(lse_a));
  copy(p.lse_b_strides, lse_strides(lse_b));
  copy(p.lse_strides, lse_strides(lse));
  p.dtype = to_kernel_dtype(o.scalar_type());
  check_launch(kMerge, flashext::run_merge_attention_states(p, current_stream(o)));
  return {o, lse};
}

}  // namespace

// CUDA tensors run the kernel; CPU tensors reach the same checks, which refuse them by name; meta
// (fake) tensors get every check but the device ones.
TORCH_LIBRARY_IMPL(flashext, CUDA, m) { m.impl("merge_attention_states", &merge_attention_states); }
TORCH_LIBRARY_IMPL(flashext, CPU, m) { m.impl("merge_attention_states", &merge_attention_states); }
TORCH_LIBRARY_IMPL(flashext, Meta, m) { m.impl("merge_attention_states", &merge_attention_states); }

}  // namespace flashext_torch
