// flashext: every op's schema, written once. Implementations register per backend in the op
// family's glue file (gelu.cpp, attention.cpp), for the CUDA, CPU and Meta keys alike; the
// autograd rules of the differentiable ones in autograd.cpp.
#include <torch/library.h>

TORCH_LIBRARY(flashext, m) {
  // out = gelu(x + y); approximate: "none" (erf) or "tanh"
  m.def("add_gelu(Tensor x, Tensor y, str approximate=\"none\") -> Tensor");
  m.def("add_gelu_out(Tensor x, Tensor y, str approximate, Tensor(a!) out) -> ()");
  // grad_x = grad_y = grad_out · gelu'(x + y)
  m.def("add_gelu_backward(Tensor grad_out, Tensor x, Tensor y, str approximate=\"none\") -> Tensor");
  // out = gelu(x + bias), bias broadcast over the last dimension
  m.def("bias_gelu(Tensor x, Tensor bias, str approximate=\"none\") -> Tensor");
  m.def("bias_gelu_out(Tensor x, Tensor bias, str approximate, Tensor(a!) out) -> ()");
  // (grad_x, grad_bias) with grad_bias = Σ over all leading dims of grad_x
  m.def("bias_gelu_backward(Tensor grad_out, Tensor x, Tensor bias, str approximate=\"none\") -> (Tensor, Tensor)");
  // (out, lse): out like q (B, Sq, H, D), lse (B, H, Sq) fp32, natural log. deterministic is the
  // backward's (autograd reads it from here). Outputs are contiguous, or with like_inputs in the
  // layout of the input they match (empty_like: out like q; in the backward dq, dk, dv like q, k,
  // v), as PyTorch's own attention kernels return them.
  m.def(
      "flash_attn_fwd(Tensor q, Tensor k, Tensor v, bool causal=False, float? softmax_scale=None, "
      "int window_left=-1, int window_right=-1, float softcap=0.0, bool align_top_left=False, "
      "bool deterministic=False, bool like_inputs=False) -> (Tensor, Tensor)");
  // the Hopper forward alone (D = 64, 128, 256, dense, sm_90a builds; flash_attn_fwd dispatches to it)
  m.def(
      "_flash_attn_fwd_sm90(Tensor q, Tensor k, Tensor v, bool causal=False, float? softmax_scale=None, "
      "int window_left=-1, int window_right=-1, float softcap=0.0) -> (Tensor, Tensor)");
  // the Hopper backward by itself, for its tests (D = 64 or 128, dense, full or causal)
  m.def(
      "_flash_attn_bwd_sm90(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal=False, "
      "float? softmax_scale=None) -> (Tensor, Tensor, Tensor)");
  // packed ragged batch: q (total_q, H, D), k/v (total_k, Hkv, D); lse (H, total_q)
  m.def(
      "flash_attn_varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
      "int max_seqlen_q, int max_seqlen_k, bool causal=False, float? softmax_scale=None, int window_left=-1, "
      "int window_right=-1, float softcap=0.0, bool validate=False, bool deterministic=False, "
      "bool like_inputs=False) -> (Tensor, Tensor)");
  // (dq, dk, dv) from dout, the forward's inputs, out and lse, and dlse when the lse was used
  m.def(
      "flash_attn_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? dlse, "
      "bool causal=False, float? softmax_scale=None, int window_left=-1, int window_right=-1, float softcap=0.0, "
      "bool align_top_left=False, bool deterministic=False, bool like_inputs=False) -> (Tensor, Tensor, Tensor)");
  m.def(
      "flash_attn_varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? dlse, "
      "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, bool causal=False, "
      "float? softmax_scale=None, int window_left=-1, int window_right=-1, float softcap=0.0, "
      "bool deterministic=False, bool like_inputs=False) -> (Tensor, Tensor, Tensor)");
  // block-sparse: query i sees key j only where block_mask[b, h, i / block_rows, j / block_cols]
  // (bool, (B or 1, H or 1, ⌈Sq/R⌉, ⌈Sk/C⌉)), and causal / windows as flash_attn_fwd; out like q,
  // lse (B, H, Sq). Forward only.
  m.def(
      "flash_attn_block_sparse_fwd(Tensor q, Tensor k, Tensor v, Tensor block_mask, int block_rows, int block_cols, "
      "bool causal=False, float? softmax_scale=None, int window_left=-1, int window_right=-1, float softcap=0.0) "
      "-> (Tensor, Tensor)");
  // attention over KV caches (dense or paged via block_table); k, v (new tokens) are written into
  // the caches at each sequence's length first; out like q, lse (B, H, Sq)
  m.def(
      "flash_attn_with_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cache_seqlens, "
      "Tensor? k=None, Tensor? v=None, Tensor? block_table=None, bool causal=False, float? softmax_scale=None, "
      "int window_left=-1, int window_right=-1, float softcap=0.0, int num_splits=0) -> (Tensor, Tensor)");
  // (o, lse) of attention over two disjoint key sets from each one's (o, lse): o (B, S, H, D) or
  // (total, H, D), lse (B, H, S) or (H, total), natural log
  m.def("merge_attention_states(Tensor o_a, Tensor lse_a, Tensor o_b, Tensor lse_b) -> (Tensor, Tensor)");
  // PyTorch's own FlashAttention-2 CUDA kernels (aten::_flash_attention_forward / _backward's),
  // called past the dispatcher: the fallback of the SDPA provider (flashext/integrations/sdpa.py)
  m.def(
      "_native_flash_attention_forward(Tensor query, Tensor key, Tensor value, Tensor? cum_seq_q, "
      "Tensor? cum_seq_k, int max_q, int max_k, float dropout_p, bool is_causal, bool return_debug_mask, "
      "float? scale=None, int? window_size_left=None, int? window_size_right=None, Tensor? seqused_k=None, "
      "Tensor? alibi_slopes=None, Tensor? block_table=None, int? num_splits=None) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "_native_flash_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, "
      "Tensor logsumexp, Tensor? cum_seq_q, Tensor? cum_seq_k, int max_q, int max_k, float dropout_p, "
      "bool is_causal, Tensor rng_state, Tensor unused, float? scale=None, int? window_size_left=None, "
      "int? window_size_right=None) -> (Tensor, Tensor, Tensor)");
  // softmax over the last dim with a running max and sum (the building block of the above)
  m.def("online_softmax(Tensor x) -> Tensor");
}
