// flashext attention over KV caches: torch glue. Checks the inputs (for the CUDA kernels and for
// tracing alike: see common.h), appends the new tokens into the caches, builds FlashDecodeParams
// (flashext/attention.h) and launches on the current stream. Schema: registration.cpp; the public
// function: flashext/attention.py.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <array>
#include <cmath>
#include <optional>
#include <tuple>

#include "common.h"
#include "flashext/attention.h"

namespace flashext_torch {
namespace {

constexpr const char* kKvcache = "flashext.flash_attention_with_kvcache";

std::tuple<at::Tensor, at::Tensor> flash_attn_with_kvcache(
    const at::Tensor& q_in, at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& cache_seqlens,
    const std::optional<at::Tensor>& k_new, const std::optional<at::Tensor>& v_new,
    const std::optional<at::Tensor>& block_table, bool causal, std::optional<double> softmax_scale,
    int64_t window_left, int64_t window_right, double softcap, int64_t num_splits) {
  const char* fn = kKvcache;
  check_cuda_tensor(fn, q_in, "q");
  const auto type = q_in.scalar_type();
  FX_CHECK(type == at::kHalf || type == at::kBFloat16, fn, ": argument 'q' must be float16 or bfloat16, got ", type);
  FX_CHECK(q_in.dim() == 4, fn, ": argument 'q' must be 4-D (batch, seqlen_q, heads, head_dim), got shape ",
           q_in.sym_sizes());
  check_same_device_dtype(fn, q_in, "q", k_cache, "k_cache");
  check_same_device_dtype(fn, q_in, "q", v_cache, "v_cache");
  const bool paged = block_table.has_value();
  FX_CHECK(k_cache.dim() == 4, fn, ": argument 'k_cache' must be 4-D, ",
           paged ? "(num_pages, page_size, heads_kv, head_dim)" : "(batch, capacity, heads_kv, head_dim)", ", got shape ",
           k_cache.sym_sizes());
  FX_CHECK(v_cache.sym_sizes() == k_cache.sym_sizes(), fn, ": argument 'v_cache' must have the shape of 'k_cache' (",
           k_cache.sym_sizes(), "), got ", v_cache.sym_sizes());
  const c10::SymInt batch = q_in.sym_size(0), heads = q_in.sym_size(2), head_dim = q_in.sym_size(3);
  const c10::SymInt heads_kv = k_cache.sym_size(2);
  FX_CHECK(k_cache.sym_size(3) == head_dim, fn, ": arguments 'q' and 'k_cache' must have the same head dim, got ",
           head_dim, " and ", k_cache.sym_size(3));
  FX_CHECK(head_dim % 8 == 0 && head_dim <= 256 && head_dim > 0, fn,
           ": head dim must be a multiple of 8 between 8 and 256, got ", head_dim);
  FX_CHECK(heads_kv > 0 && heads % heads_kv == 0, fn, ": the number of query heads (", heads,
           ") must be a multiple of the number of key/value heads (", heads_kv, ")");
  FX_CHECK(batch <= 65535 && heads_kv <= 65535, fn, ": batch and key/value heads must be at most 65535");
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{q_in, "q"},
                                std::pair<const at::Tensor&, const char*>{k_cache, "k_cache"},
                                std::pair<const at::Tensor&, const char*>{v_cache, "v_cache"}}) {
    FX_CHECK(t.sym_stride(-1) == 1, fn, ": argument '", name, "' must have a contiguous last dimension");
  }
  FX_CHECK(cache_seqlens.defined() && cache_seqlens.device() == q_in.device() && cache_seqlens.scalar_type() == at::kInt &&
               cache_seqlens.dim() == 1 && cache_seqlens.sym_size(0) == batch && cache_seqlens.sym_stride(0) == 1,
           fn, ": argument 'cache_seqlens' must be a contiguous int32 tensor of shape [", batch,
           "] on the device of 'q'");
  if (paged) {
    const at::Tensor& table = *block_table;
    FX_CHECK(table.device() == q_in.device() && table.scalar_type() == at::kInt && table.dim() == 2 &&
                 table.sym_size(0) == batch && table.sym_stride(1) == 1,
             fn, ": argument 'block_table' must be an int32 tensor (batch, pages_per_seq) on the device of 'q', "
             "contiguous along its pages");
  } else {
    FX_CHECK(k_cache.sym_size(0) == batch, fn, ": a dense 'k_cache' must have the batch size of 'q' (", batch,
             "), got ", k_cache.sym_size(0));
  }
  FX_CHECK(k_new.has_value() == v_new.has_value(), fn, ": arguments 'k' and 'v' go together (both or neither)");
  if (k_new.has_value()) {
    for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{*k_new, "k"},
                                  std::pair<const at::Tensor&, const char*>{*v_new, "v"}}) {
      check_same_device_dtype(fn, q_in, "q", t, name);
      FX_CHECK(t.dim() == 4 && t.sym_size(0) == batch && t.sym_size(2) == heads_kv && t.sym_size(3) == head_dim, fn,
               ": argument '", name, "' must be (batch, seqlen_new, heads_kv, head_dim) = (", batch, ", *, ", heads_kv,
               ", ", head_dim, "), got shape ", t.sym_sizes());
      FX_CHECK(t.sym_stride(-1) == 1, fn, ": argument '", name, "' must have a contiguous last dimension");
    }
    FX_CHECK(v_new->sym_size(1) == k_new->sym_size(1), fn, ": arguments 'k' and 'v' must hold as many new tokens");
  }
  FX_CHECK(!softmax_scale.has_value() || (std::isfinite(*softmax_scale) && *softmax_scale > 0.0), fn,
           ": softmax_scale must be finite and > 0");
  FX_CHECK(window_left >= -1 && window_right >= -1, fn, ": window_size entries must be >= -1 (-1: unbounded)");
  FX_CHECK(softcap >= 0.0 && std::isfinite(softcap), fn, ": softcap must be >= 0 (0: off)");
  FX_CHECK(num_splits >= 0 && num_splits <= 64, fn, ": num_splits must be in [0, 64] (0: chosen from the shapes), got ",
           num_splits);

  at::Tensor out = at::empty_symint(q_in.sym_sizes(), q_in.options());
  const std::array<c10::SymInt, 3> lse_shape{batch, heads, q_in.sym_size(1)};
  at::Tensor lse = at::empty_symint(lse_shape, q_in.options().dtype(at::kFloat));
  const int64_t appended = k_new.has_value() ? k_new->size(1) : 0;
  if (is_meta(q_in) || (out.numel() == 0 && (appended == 0 || k_cache.numel() == 0 || q_in.size(0) == 0))) {
    return {out, lse};
  }

  const c10::cuda::CUDAGuard guard(q_in.device());
  FX_CHECK(rows_aligned16(k_cache) && rows_aligned16(v_cache), fn,
           ": the caches' rows must start 16-byte aligned (they are written in place, so they cannot be copied)");
  const at::Tensor q = aligned_rows(q_in);
  flashext::FlashDecodeParams p;
  p.q = q.data_ptr();
  p.o = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.q_batch_stride = q.stride(0), p.q_row_stride = q.stride(1), p.q_head_stride = q.stride(2);
  p.o_batch_stride = out.stride(0), p.o_row_stride = out.stride(1), p.o_head_stride = out.stride(2);
  p.lse_batch_stride = lse.stride(0), p.lse_head_stride = lse.stride(1);
  p.k_cache = k_cache.data_ptr();
  p.v_cache = v_cache.data_ptr();
  p.k_page_stride = k_cache.stride(0), p.k_row_stride = k_cache.stride(1), p.k_head_stride = k_cache.stride(2);
  p.v_page_stride = v_cache.stride(0), p.v_row_stride = v_cache.stride(1), p.v_head_stride = v_cache.stride(2);
  p.cache_seqlens = cache_seqlens.data_ptr<int32_t>();
  if (paged) {
    p.block_table = block_table->data_ptr<int32_t>();
    p.block_table_stride = block_table->stride(0);
    p.page_size = int(k_cache.size(1));
    p.num_pages = int(k_cache.size(0));
    p.capacity = int(std::min<int64_t>(block_table->size(1) * k_cache.size(1), INT32_MAX / 2));
  } else {
    p.capacity = int(std::min<int64_t>(k_cache.size(1), INT32_MAX / 2));
  }
  p.seqlen_new = k_new.has_value() ? int(k_new->size(1)) : 0;
  p.batch = int(q.size(0)), p.heads = int(q.size(2)), p.heads_kv = int(k_cache.size(2)), p.head_dim = int(q.size(3));
  p.seqlen_q = int(q.size(1));
  p.softmax_scale = float(softmax_scale.has_value() ? *softmax_scale : 1.0 / std::sqrt(double(p.head_dim)));
  p.softcap = float(softcap);
  const int64_t span = int64_t(p.capacity) + p.seqlen_q;  // windows at least this wide hide nothing
  p.window_left = window_left >= span ? -1 : int(window_left);
  p.window_right = causal ? 0 : (window_right >= span ? -1 : int(window_right));
  p.dtype = to_kernel_dtype(q.scalar_type());
  int sm_count = 0;  // a cheap attribute read; should it fail, one split (correct, maybe slower)
  if (cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, q.device().index()) != cudaSuccess) {
    sm_count = 0;
  }
  p.num_splits = num_splits > 0 ? int(num_splits)
                                : flashext::flash_decode_num_splits(p.batch, p.heads, p.heads_kv, p.seqlen_q, p.capacity,
                                                                    p.head_dim, sm_count, paged);
  const cudaStream_t stream = current_stream(q);
  if (p.seqlen_new > 0) {
    const at::Tensor kn = aligned_rows(*k_new);
    const at::Tensor vn = aligned_rows(*v_new);
    flashext::KvAppendParams a;
    a.k = kn.data_ptr(), a.v = vn.data_ptr();
    a.k_batch_stride = kn.stride(0), a.k_row_stride = kn.stride(1), a.k_head_stride = kn.stride(2);
    a.v_batch_stride = vn.stride(0), a.v_row_stride = vn.stride(1), a.v_head_stride = vn.stride(2);
    check_launch(fn, flashext::run_kvcache_append(p, a, stream));
  }
  if (out.numel() == 0) return {out, lse};  // no queries: the append was all there was to do
  const int64_t bytes = int64_t(flashext::flash_decode_workspace_bytes(p));
  at::Tensor workspace;
  if (bytes > 0) workspace = at::empty({bytes}, q.options().dtype(at::kByte));
  check_launch(fn, flashext::run_flash_decode(p, bytes > 0 ? workspace.data_ptr() : nullptr, stream));
  return {out, lse};
}

}  // namespace

// CUDA tensors run the kernels; CPU tensors reach the same checks, which refuse them by name; meta
// (fake) tensors get every check but the device ones.
TORCH_LIBRARY_IMPL(flashext, CUDA, m) { m.impl("flash_attn_with_kvcache", &flash_attn_with_kvcache); }
TORCH_LIBRARY_IMPL(flashext, CPU, m) { m.impl("flash_attn_with_kvcache", &flash_attn_with_kvcache); }
TORCH_LIBRARY_IMPL(flashext, Meta, m) { m.impl("flash_attn_with_kvcache", &flash_attn_with_kvcache); }

}  // namespace flashext_torch
