// flashext SDPA provider: PyTorch's own FlashAttention-2 CUDA kernels, called past the dispatcher.
// While flashext is the active flash implementation (flashext/integrations/sdpa.py), it overrides
// aten::_flash_attention_forward / _backward for CUDA; a call flashext does not take (dropout,
// ALiBi, a paged cache, ...) falls back to these, which call at::native's kernels directly (the
// dispatcher would route straight back to the override). Schemas: registration.cpp.
#include <ATen/ops/_flash_attention_backward_native.h>
#include <ATen/ops/_flash_attention_forward_native.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <type_traits>

#include "common.h"

namespace flashext_torch {
namespace {

using Tensor = at::Tensor;
using OptTensor = std::optional<at::Tensor>;

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> native_flash_attention_forward(
    const Tensor& query, const Tensor& key, const Tensor& value, const OptTensor& cum_seq_q,
    const OptTensor& cum_seq_k, int64_t max_q, int64_t max_k, double dropout_p, bool is_causal,
    bool return_debug_mask, std::optional<double> scale, std::optional<int64_t> window_size_left,
    std::optional<int64_t> window_size_right, const OptTensor& seqused_k, const OptTensor& alibi_slopes,
    const OptTensor& block_table, std::optional<int64_t> num_splits) {
  const c10::cuda::CUDAGuard guard(query.device());
  // torch >= 2.12 added block_table and num_splits to the kernel; earlier ones take neither.
  const auto forward = [&](auto fn) {
    if constexpr (std::is_invocable_v<decltype(fn), const Tensor&, const Tensor&, const Tensor&, const OptTensor&,
                                      const OptTensor&, int64_t, int64_t, double, bool, bool, std::optional<double>,
                                      std::optional<int64_t>, std::optional<int64_t>, const OptTensor&,
                                      const OptTensor&, const OptTensor&, std::optional<int64_t>>) {
      return fn(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, scale,
                window_size_left, window_size_right, seqused_k, alibi_slopes, block_table, num_splits);
    } else {
      FX_CHECK(!block_table.has_value() && !num_splits.has_value(),
               "aten::_flash_attention_forward: this torch's flash kernel takes no block_table or num_splits");
      return fn(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, scale,
                window_size_left, window_size_right, seqused_k, alibi_slopes);
    }
  };
  return forward(&at::native::_flash_attention_forward);
}

std::tuple<Tensor, Tensor, Tensor> native_flash_attention_backward(
    const Tensor& grad_out, const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& out,
    const Tensor& logsumexp, const OptTensor& cum_seq_q, const OptTensor& cum_seq_k, int64_t max_q, int64_t max_k,
    double dropout_p, bool is_causal, const Tensor& rng_state, const Tensor& unused, std::optional<double> scale,
    std::optional<int64_t> window_size_left, std::optional<int64_t> window_size_right) {
  const c10::cuda::CUDAGuard guard(query.device());
  return at::native::_flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q.value_or(Tensor()),
                                               cum_seq_k.value_or(Tensor()), max_q, max_k, dropout_p, is_causal,
                                               rng_state, unused, scale, window_size_left, window_size_right);
}

}  // namespace
}  // namespace flashext_torch

TORCH_LIBRARY_IMPL(flashext, CUDA, m) {
  m.impl("_native_flash_attention_forward", &flashext_torch::native_flash_attention_forward);
  m.impl("_native_flash_attention_backward", &flashext_torch::native_flash_attention_backward);
}
