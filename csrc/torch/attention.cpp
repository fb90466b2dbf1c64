// flashext FlashAttention: torch glue. Checks inputs (one place for the family, for the CUDA
// kernel and for tracing alike: see common.h), builds FlashFwdParams (flashext/attention.h) and
// launches on the current stream. Schemas: registration.cpp; autograd rules: autograd.cpp; the
// public functions: flashext/attention.py.
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <array>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <optional>
#include <tuple>

#include "common.h"
#include "flashext/attention.h"
#include "../kernels/attention/flash_bwd_sm90.h"
#include "../kernels/attention/flash_fwd_sm90.h"

namespace flashext_torch {
namespace {

constexpr const char* kFlash = "flashext.flash_attention";
constexpr const char* kFlashVarlen = "flashext.flash_attention_varlen";
constexpr const char* kFlashBwd = "flashext.flash_attention (backward)";
constexpr const char* kFlashVarlenBwd = "flashext.flash_attention_varlen (backward)";
constexpr const char* kBlockSparse = "flashext.block_sparse_attention";
constexpr const char* kSm90 = "flashext._flash_attn_fwd_sm90";
constexpr const char* kSm90Bwd = "flashext._flash_attn_bwd_sm90";


// The grid is (query blocks, heads, batch): gridDim.y and gridDim.z stop at 65535.
constexpr int64_t kMaxGridYZ = 65535;
// The kernel's row and key-block bounds are int: with lengths up to 2^29 every sum it forms
// (row + Sk − Sq + window + 1, windows of Sq + Sk or more being unbounded) stays below 2^31.
constexpr int64_t kMaxSeqlen = int64_t(1) << 29;

// q, k, v: same device and dtype (fp16/bf16), last dim contiguous, head dims equal, a multiple of
// 8 up to 256, H % Hkv == 0. `rank` is 4 (dense) or 3 (varlen). Runs on meta tensors too.
void check_qkv(const char* fn, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t rank) {
  check_cuda_tensor(fn, q, "q");
  const auto type = q.scalar_type();
  FX_CHECK(type == at::kHalf || type == at::kBFloat16, fn, ": argument 'q' must be float16 or bfloat16, got ", type);
  check_same_device_dtype(fn, q, "q", k, "k");
  check_same_device_dtype(fn, q, "q", v, "v");
  const char* layout = rank == 4 ? "(batch, seqlen, heads, head_dim)" : "(total_tokens, heads, head_dim)";
  FX_CHECK(q.dim() == rank, fn, ": argument 'q' must be ", rank, "-D ", layout, ", got shape ", q.sym_sizes());
  FX_CHECK(k.dim() == rank, fn, ": argument 'k' must be ", rank, "-D ", layout, ", got shape ", k.sym_sizes());
  FX_CHECK(v.sym_sizes() == k.sym_sizes(), fn, ": argument 'v' must have the shape of 'k' (", k.sym_sizes(),
           "), got ", v.sym_sizes());
  if (rank == 4) {
    FX_CHECK(k.sym_size(0) == q.sym_size(0), fn, ": arguments 'q' and 'k' must have the same batch size, got ",
             q.sym_size(0), " and ", k.sym_size(0));
    FX_CHECK(q.sym_size(0) <= kMaxGridYZ, fn, ": the batch size must be at most ", kMaxGridYZ, ", got ",
             q.sym_size(0));
  }
  const c10::SymInt heads = q.sym_size(-2), heads_kv = k.sym_size(-2), head_dim = q.sym_size(-1);
  FX_CHECK(k.sym_size(-1) == head_dim, fn, ": arguments 'q' and 'k' must have the same head dim, got ", head_dim,
           " and ", k.sym_size(-1));
  FX_CHECK(head_dim % 8 == 0 && head_dim <= 256 && head_dim > 0, fn,
           ": head dim must be a multiple of 8 between 8 and 256, got ", head_dim);
  FX_CHECK(heads_kv > 0 && heads % heads_kv == 0, fn, ": the number of query heads (", heads,
           ") must be a multiple of the number of key/value heads (", heads_kv, ")");
  FX_CHECK(heads <= kMaxGridYZ, fn, ": at most ", kMaxGridYZ, " query heads, got ", heads);
  if (rank == 4) {
    FX_CHECK(q.sym_size(1) <= kMaxSeqlen && k.sym_size(1) <= kMaxSeqlen, fn, ": sequence lengths must be at most 2^29 = ",
             kMaxSeqlen, ", got q ", q.sym_sizes(), " and k ", k.sym_sizes());
  } else {  // cu_seqlens are int32
    FX_CHECK(q.sym_size(0) <= INT32_MAX && k.sym_size(0) <= INT32_MAX, fn,
             ": packed tensors must have fewer than 2^31 rows, got q ", q.sym_sizes(), " and k ", k.sym_sizes());
  }
  FX_CHECK(q.sym_stride(-1) == 1, fn, ": argument 'q' must have a contiguous last dimension, got stride ",
           q.sym_stride(-1));
  FX_CHECK(k.sym_stride(-1) == 1, fn, ": argument 'k' must have a contiguous last dimension, got stride ",
           k.sym_stride(-1));
  FX_CHECK(v.sym_stride(-1) == 1, fn, ": argument 'v' must have a contiguous last dimension, got stride ",
           v.sym_stride(-1));
}

void check_options(const char* fn, std::optional<double> softmax_scale, int64_t window_left, int64_t window_right,
                   double softcap) {
  // The row max of the scores is the max of the scaled scores only for a positive scale.
  FX_CHECK(!softmax_scale.has_value() || (std::isfinite(*softmax_scale) && *softmax_scale > 0.0), fn,
           ": softmax_scale must be finite and > 0, got ", softmax_scale.has_value() ? std::to_string(*softmax_scale) : "");
  FX_CHECK(window_left >= -1 && window_right >= -1, fn, ": window_size entries must be >= -1 (-1: unbounded), got (",
           window_left, ", ", window_right, ")");
  FX_CHECK(softcap >= 0.0 && std::isfinite(softcap), fn, ": softcap must be >= 0 (0: off)");
}

// cu_seqlens_q/k: int32, contiguous 1-D of the same length (batch + 1), on q's device; the maxima
// in [0, 2^29]. The offsets' values are validate_cu_seqlens's (a host copy).
void check_cu_seqlens_args(const char* fn, const at::Tensor& q_in, const at::Tensor& cu_seqlens_q,
                           const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k) {
  for (const auto& [cu, name] : {std::pair<const at::Tensor&, const char*>{cu_seqlens_q, "cu_seqlens_q"},
                                 std::pair<const at::Tensor&, const char*>{cu_seqlens_k, "cu_seqlens_k"}}) {
    FX_CHECK(cu.defined() && cu.device() == q_in.device(), fn, ": argument '", name,
             "' must be on the device of 'q' (", q_in.device(), ")");
    FX_CHECK(cu.scalar_type() == at::kInt, fn, ": argument '", name, "' must be int32, got ",
             cu.scalar_type());
    FX_CHECK(cu.dim() == 1 && cu.sym_size(0) >= 1 && cu.is_contiguous(), fn, ": argument '", name,
             "' must be a contiguous 1-D tensor of batch + 1 offsets, got shape ", cu.sym_sizes());
  }
  FX_CHECK(cu_seqlens_k.sym_size(0) == cu_seqlens_q.sym_size(0), fn,
           ": arguments 'cu_seqlens_q' and 'cu_seqlens_k' must have the same length (batch + 1), got ",
           cu_seqlens_q.sym_size(0), " and ", cu_seqlens_k.sym_size(0));
  FX_CHECK(cu_seqlens_q.sym_size(0) <= kMaxGridYZ + 1, fn, ": at most ", kMaxGridYZ,
           " sequences, got ", cu_seqlens_q.sym_size(0) - 1);
  FX_CHECK(max_seqlen_q >= 0 && max_seqlen_k >= 0 && max_seqlen_q <= kMaxSeqlen && max_seqlen_k <= kMaxSeqlen,
           fn, ": max_seqlen_q and max_seqlen_k must be in [0, 2^29], got ", max_seqlen_q, " and ",
           max_seqlen_k);
}

// validate=True: the offsets' values, from one host copy of both (a sync), with the words of
// check_cu_seqlens's verdicts; returns whether the query sequences cover every row of q.
bool validate_cu_seqlens(const at::Tensor& cu_q, const at::Tensor& cu_k, int64_t total_q, int64_t total_k,
                         int64_t max_seqlen_q, int64_t max_seqlen_k) {
  const at::Tensor host = at::cat({cu_q, cu_k}).cpu();
  const int32_t* values = host.data_ptr<int32_t>();
  const int64_t n = cu_q.size(0);
  for (const auto& [name, cu, total, max_seqlen] :
       {std::tuple<const char*, const int32_t*, int64_t, int64_t>{"cu_seqlens_q", values, total_q, max_seqlen_q},
        std::tuple<const char*, const int32_t*, int64_t, int64_t>{"cu_seqlens_k", values + n, total_k, max_seqlen_k}}) {
    switch (flashext::check_cu_seqlens(cu, n, total, max_seqlen)) {
      case flashext::CuSeqlensError::kOk: break;
      case flashext::CuSeqlensError::kNotStartingAtZero: fail(kFlashVarlen, ": argument '", name, "' must start at 0");
      case flashext::CuSeqlensError::kDecreasing: fail(kFlashVarlen, ": argument '", name, "' must be non-decreasing");
      case flashext::CuSeqlensError::kPastTotal:
        fail(kFlashVarlen, ": argument '", name, "' ends past the packed tensor (", total, " rows)");
      case flashext::CuSeqlensError::kLongerThanMax:
        fail(kFlashVarlen, ": a sequence in '", name, "' is longer than its max_seqlen (", max_seqlen, ")");
    }
  }
  return values[n - 1] == total_q;
}

// An output shaped like `t`: contiguous, or with like_inputs in t's layout (empty_like), zeroed
// or not.
at::Tensor output_like(const at::Tensor& t, bool like_inputs, bool zeroed) {
  if (like_inputs) return zeroed ? at::zeros_like(t) : at::empty_like(t);
  return zeroed ? at::zeros_symint(t.sym_sizes(), t.options()) : at::empty_symint(t.sym_sizes(), t.options());
}

// (batch, row, head) element strides of a dense (B, S, H, D) or packed (total, H, D) tensor.
void set_strides(int64_t& batch, int64_t& row, int64_t& head, const at::Tensor& t) {
  const bool packed = t.dim() == 3;
  batch = packed ? 0 : t.stride(0);
  row = t.stride(packed ? 0 : 1);
  head = t.stride(packed ? 1 : 2);
}

// The kernel's fields for q, k, v, out and lse, dense or (with cu_seqlens) packed; the sequence
// lengths are the dense ones or the varlen maxima.
flashext::FlashFwdParams attention_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& out, const at::Tensor& lse, bool causal,
                                          std::optional<double> softmax_scale, int64_t window_left,
                                          int64_t window_right, double softcap, int64_t seqlen_q, int64_t seqlen_k,
                                          const at::Tensor* cu_seqlens_q = nullptr,
                                          const at::Tensor* cu_seqlens_k = nullptr, bool align_top_left = false) {
  const int64_t head_dim = q.size(-1);
  flashext::FlashFwdParams p;
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.o = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  set_strides(p.q_batch_stride, p.q_row_stride, p.q_head_stride, q);
  set_strides(p.k_batch_stride, p.k_row_stride, p.k_head_stride, k);
  set_strides(p.v_batch_stride, p.v_row_stride, p.v_head_stride, v);
  set_strides(p.o_batch_stride, p.o_row_stride, p.o_head_stride, out);
  // lse: dense (B, H, S), packed (H, total)
  p.lse_batch_stride = lse.dim() == 3 ? lse.stride(0) : 0;
  p.lse_head_stride = lse.stride(lse.dim() == 3 ? 1 : 0);
  if (cu_seqlens_q != nullptr) {
    p.cu_seqlens_q = cu_seqlens_q->data_ptr<int32_t>();
    p.cu_seqlens_k = cu_seqlens_k->data_ptr<int32_t>();
    p.total_q = q.size(0);
    p.total_k = k.size(0);
    p.batch = int(cu_seqlens_q->size(0) - 1);
  } else {
    p.batch = int(q.size(0));
  }
  // Varlen: rows of a sequence longer than max_seqlen_q are not computed (as in flash-attn): the
  // kernel clamps lengths to the maxima, never reading or writing past the packed tensors.
  p.seqlen_q = int(seqlen_q);
  p.seqlen_k = int(seqlen_k);
  p.heads = int(q.size(-2));
  p.heads_kv = int(k.size(-2));
  p.head_dim = int(head_dim);
  p.softmax_scale = float(softmax_scale.has_value() ? *softmax_scale : 1.0 / std::sqrt(double(head_dim)));
  p.softcap = float(softcap);
  // A window at least Sq + Sk wide hides nothing: unbounded (-1), which also keeps the kernel's
  // int arithmetic on row + window from overflowing for huge windows.
  const auto window = [&](int64_t w) { return w >= seqlen_q + seqlen_k ? -1 : int(w); };
  p.window_left = window(window_left);
  p.window_right = causal ? 0 : window(window_right);
  p.align_top_left = align_top_left;
  p.dtype = to_kernel_dtype(q.scalar_type());
  return p;
}

// Whether the Hopper forward serves a call of this head dim and key count (its kernels are compiled
// for D = 64, 128 and 256; other head dims run on the next of them, as the FA2-design ones do): where
// it beats the FA2-design one on the H200 (bench_attention, 227d902 and the A/B at 480322e), with
// the D = 128 and 256 kernels at every length, with the D = 64 one from 512 keys (without a mask
// 1.2x at 512; causal, on 128-row blocks, 1.05x at 512, 1.14x at 1K; shorter D = 64 calls, windowed
// calls and the padded head dims take the same thresholds, unmeasured); at every length in
// HopperKernels::kAlways.
bool hopper_forward_serves(int head_dim, int seqlen_k) {
  const int kernel_head_dim = flashext::flash_fwd_kernel_head_dim(head_dim);
  if (kernel_head_dim == 0) return false;
  return kernel_head_dim != 64 || seqlen_k >= 512 || flashext::hopper_kernels() == flashext::HopperKernels::kAlways;
}

// Whether the Hopper kernels may take a call whose TMA maps read these tensors: an sm_90 GPU with
// an sm_90a build, flashext::hopper_kernels_enabled(), and no zero strides (which broadcast views
// such as expand() have, and a TMA map does not take).
bool hopper_kernels_take(std::initializer_list<std::reference_wrapper<const at::Tensor>> tensors) {
  int major = 0, minor = 0;
  device_capability(tensors.begin()->get().get_device(), &major, &minor);
  for (const at::Tensor& t : tensors) {
    if (has_zero_strides(t)) return false;
  }
  return flashext::hopper_kernels_enabled() && flashext::flash_fwd_sm90_supported(major, minor);
}

// The forward of a dense or varlen call: the Hopper kernel where hopper_forward_serves, there are
// keys and hopper_kernels_take the inputs; else the FA2-design kernel.
cudaError_t run_forward(const flashext::FlashFwdParams& p, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& v) {
  const bool keys = p.seqlen_k > 0 && (p.cu_seqlens_q == nullptr || (p.total_q > 0 && p.total_k > 0));
  const bool hopper =
      hopper_forward_serves(p.head_dim, p.seqlen_k) && keys && hopper_kernels_take({q, k, v});
  return hopper ? flashext::run_flash_fwd_sm90(p, current_stream(q)) : flashext::run_flash_fwd(p, current_stream(q));
}

std::tuple<at::Tensor, at::Tensor> flash_attn_fwd(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                                  bool causal, std::optional<double> softmax_scale, int64_t window_left,
                                                  int64_t window_right, double softcap, bool align_top_left,
                                                  bool /*deterministic: the backward's*/, bool like_inputs) {
  check_qkv(kFlash, q_in, k_in, v_in, 4);
  check_options(kFlash, softmax_scale, window_left, window_right, softcap);
  at::Tensor out = output_like(q_in, like_inputs, false);
  at::Tensor lse = at::empty_symint({q_in.sym_size(0), q_in.sym_size(2), q_in.sym_size(1)},
                                    q_in.options().dtype(at::kFloat));
  if (is_meta(q_in) || out.numel() == 0) return {out, lse};
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = aligned_rows(q_in), k = aligned_rows(k_in), v = aligned_rows(v_in);
  const flashext::FlashFwdParams p = attention_params(q, k, v, out, lse, causal, softmax_scale, window_left,
                                                      window_right, softcap, q.size(1), k.size(1), nullptr, nullptr,
                                                      align_top_left);
  check_launch(kFlash, run_forward(p, q, k, v));
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor> flash_attn_varlen_fwd(const at::Tensor& q_in, const at::Tensor& k_in,
                                                         const at::Tensor& v_in, const at::Tensor& cu_seqlens_q,
                                                         const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                                         int64_t max_seqlen_k, bool causal,
                                                         std::optional<double> softmax_scale, int64_t window_left,
                                                         int64_t window_right, double softcap, bool validate,
                                                         bool /*deterministic: the backward's*/, bool like_inputs) {
  check_qkv(kFlashVarlen, q_in, k_in, v_in, 3);
  check_options(kFlashVarlen, softmax_scale, window_left, window_right, softcap);
  check_cu_seqlens_args(kFlashVarlen, q_in, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  // Rows no sequence covers (past cu_seqlens_q[-1], or past max_seqlen_q) are never computed: unless
  // validated offsets cover every row, they are filled first with 0 and lse −inf, rather than
  // reading whatever memory held.
  const bool covered = !is_meta(q_in) && validate && validate_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q_in.size(0),
                                                                         k_in.size(0), max_seqlen_q, max_seqlen_k);
  const std::array<c10::SymInt, 2> lse_shape{q_in.sym_size(1), q_in.sym_size(0)};
  at::Tensor out = output_like(q_in, like_inputs, !covered);
  at::Tensor lse = covered ? at::empty_symint(lse_shape, q_in.options().dtype(at::kFloat))
                           : at::full_symint(lse_shape, -INFINITY, q_in.options().dtype(at::kFloat));
  if (is_meta(q_in) || out.numel() == 0 || cu_seqlens_q.size(0) == 1) return {out, lse};
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = aligned_rows(q_in), k = aligned_rows(k_in), v = aligned_rows(v_in);
  const flashext::FlashFwdParams p = attention_params(q, k, v, out, lse, causal, softmax_scale, window_left,
                                                      window_right, softcap, max_seqlen_q, max_seqlen_k,
                                                      &cu_seqlens_q, &cu_seqlens_k);
  check_launch(kFlashVarlen, run_forward(p, q, k, v));
  return {out, lse};
}

// The Hopper kernels' private ops: an sm_90 GPU with a build holding sm_90a code, and no
// broadcast (zero-stride) views, which their TMA maps cannot describe.
void check_hopper_call(const char* fn, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  int major = 0, minor = 0;
  device_capability(q.get_device(), &major, &minor);
  FX_CHECK(flashext::flash_fwd_sm90_supported(major, minor), fn, ": needs an sm_90 GPU and a build with sm_90a ",
           "code; this is compute capability ", major, ".", minor, " and the build holds '",
           flashext::compiled_cuda_archs(), "'");
  FX_CHECK(!has_zero_strides(q) && !has_zero_strides(k) && !has_zero_strides(v), fn,
           ": broadcast (zero-stride) views are not supported (flash_attention takes them)");
}

// The Hopper forward by itself (flash_fwd_sm90.h), for its tests and the benchmark at every head dim
// it takes (flash_attention dispatches to it where hopper_forward_serves). Dense, on an sm_90 GPU with
// a build holding sm_90a code; q, k, v get the TMA's alignment (16-byte rows) by a copy.
std::tuple<at::Tensor, at::Tensor> flash_attn_fwd_sm90(const at::Tensor& q_in, const at::Tensor& k_in,
                                                       const at::Tensor& v_in, bool causal,
                                                       std::optional<double> softmax_scale, int64_t window_left,
                                                       int64_t window_right, double softcap) {
  check_qkv(kSm90, q_in, k_in, v_in, 4);
  check_options(kSm90, softmax_scale, window_left, window_right, softcap);
  FX_CHECK(k_in.sym_size(1) > 0, kSm90, ": argument 'k' must hold at least one key, got shape ", k_in.sym_sizes());
  at::Tensor out = output_like(q_in, false, false);
  at::Tensor lse = at::empty_symint({q_in.sym_size(0), q_in.sym_size(2), q_in.sym_size(1)},
                                    q_in.options().dtype(at::kFloat));
  if (is_meta(q_in) || out.numel() == 0) return {out, lse};
  const c10::cuda::CUDAGuard guard(q_in.device());
  check_hopper_call(kSm90, q_in, k_in, v_in);
  const at::Tensor q = aligned_rows(q_in), k = aligned_rows(k_in), v = aligned_rows(v_in);
  const flashext::FlashFwdParams p = attention_params(q, k, v, out, lse, causal, softmax_scale, window_left,
                                                      window_right, softcap, q.size(1), k.size(1));
  check_launch(kSm90, flashext::run_flash_fwd_sm90(p, current_stream(q)));
  return {out, lse};
}

// Block-sparse: flash_attn_fwd's checks, then block_mask: bool (B or 1, H or 1, ⌈Sq/R⌉, ⌈Sk/C⌉) on
// q's device, R and C ≥ 1.
std::tuple<at::Tensor, at::Tensor> flash_attn_block_sparse_fwd(const at::Tensor& q_in, const at::Tensor& k_in,
                                                               const at::Tensor& v_in, const at::Tensor& block_mask_in,
                                                               int64_t block_rows, int64_t block_cols, bool causal,
                                                               std::optional<double> softmax_scale, int64_t window_left,
                                                               int64_t window_right, double softcap) {
  check_qkv(kBlockSparse, q_in, k_in, v_in, 4);
  check_options(kBlockSparse, softmax_scale, window_left, window_right, softcap);
  FX_CHECK(block_rows >= 1 && block_cols >= 1, kBlockSparse, ": block_size entries must be >= 1, got (", block_rows,
           ", ", block_cols, ")");
  const at::Tensor& mask_in = block_mask_in;
  FX_CHECK(mask_in.defined() && mask_in.scalar_type() == at::kBool, kBlockSparse,
           ": argument 'block_mask' must be a bool tensor, got ", mask_in.defined() ? mask_in.scalar_type() : at::kBool);
  FX_CHECK(is_meta(q_in) || mask_in.device() == q_in.device(), kBlockSparse,
           ": argument 'block_mask' must be on the device of 'q' (", q_in.device(), "), got ", mask_in.device());
  const auto ceil_div = [](const c10::SymInt& n, int64_t d) { return n == 0 ? c10::SymInt(0) : (n - 1) / d + 1; };
  const c10::SymInt mask_rows = ceil_div(q_in.sym_size(1), block_rows);  // (no overflow for any block size)
  const c10::SymInt mask_cols = ceil_div(k_in.sym_size(1), block_cols);
  FX_CHECK(mask_in.dim() == 4 && (mask_in.sym_size(0) == 1 || mask_in.sym_size(0) == q_in.sym_size(0)) &&
               (mask_in.sym_size(1) == 1 || mask_in.sym_size(1) == q_in.sym_size(2)) &&
               mask_in.sym_size(2) == mask_rows && mask_in.sym_size(3) == mask_cols,
           kBlockSparse, ": argument 'block_mask' must have shape (batch or 1, heads or 1, ceil(seqlen_q / R), "
           "ceil(seqlen_k / C)) = (", q_in.sym_size(0), " or 1, ", q_in.sym_size(2), " or 1, ", mask_rows, ", ",
           mask_cols, "), got ", mask_in.sym_sizes());
  at::Tensor out = at::empty_symint(q_in.sym_sizes(), q_in.options());
  at::Tensor lse = at::empty_symint({q_in.sym_size(0), q_in.sym_size(2), q_in.sym_size(1)},
                                    q_in.options().dtype(at::kFloat));
  if (is_meta(q_in) || out.numel() == 0) return {out, lse};
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = aligned_rows(q_in), k = aligned_rows(k_in), v = aligned_rows(v_in);
  const at::Tensor mask = mask_in.stride(3) == 1 ? mask_in : mask_in.contiguous();
  flashext::FlashFwdParams p = attention_params(q, k, v, out, lse, causal, softmax_scale, window_left, window_right,
                                                softcap, q.size(1), k.size(1));
  p.block_mask = static_cast<const uint8_t*>(mask.data_ptr());
  p.mask_batch_stride = mask.size(0) == 1 ? 0 : mask.stride(0);  // broadcast dims read row 0
  p.mask_head_stride = mask.size(1) == 1 ? 0 : mask.stride(1);
  p.mask_row_stride = mask.stride(2);
  // A block taller (wider) than the sequence acts as one as tall (wide) as it: int-sized.
  p.block_rows = int(std::min<int64_t>(block_rows, std::max<int64_t>(q.size(1), 1)));
  p.block_cols = int(std::min<int64_t>(block_cols, std::max<int64_t>(k.size(1), 1)));
  const at::Tensor workspace =
      at::empty({int64_t(flashext::flash_block_sparse_workspace_bytes(p))}, q.options().dtype(at::kByte));
  check_launch(kBlockSparse, flashext::run_flash_block_sparse_fwd(p, workspace.data_ptr(), current_stream(q)));
  return {out, lse};
}

// dout and out have q's shape, device and dtype, out a contiguous last dim (dout may have any
// strides: autograd hands over expanded gradients; see grad_rows); lse (and dlse) are fp32 of
// lse_shape on q's device.
void check_grad_inputs(const char* fn, const at::Tensor& q, const at::Tensor& dout, const at::Tensor& out,
                       const at::Tensor& lse, const std::optional<at::Tensor>& dlse, c10::SymIntArrayRef lse_shape) {
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{dout, "dout"},
                                std::pair<const at::Tensor&, const char*>{out, "out"}}) {
    check_same_device_dtype(fn, q, "q", t, name);
    FX_CHECK(t.sym_sizes() == q.sym_sizes(), fn, ": argument '", name, "' must have the shape of 'q' (", q.sym_sizes(),
             "), got ", t.sym_sizes());
  }
  FX_CHECK(out.sym_stride(-1) == 1, fn, ": argument 'out' must have a contiguous last dimension");
  for (const auto& [t, name] : {std::pair<const at::Tensor*, const char*>{&lse, "lse"},
                                std::pair<const at::Tensor*, const char*>{dlse ? &*dlse : nullptr, "dlse"}}) {
    if (t == nullptr) continue;
    FX_CHECK(t->defined() && t->device() == q.device(), fn, ": argument '", name, "' must be on the device of 'q' (",
             q.device(), ")");
    FX_CHECK(t->scalar_type() == at::kFloat, fn, ": argument '", name, "' must be float32, got ", t->scalar_type());
    FX_CHECK(t->sym_sizes() == lse_shape, fn, ": argument '", name, "' must have shape ", lse_shape, ", got ",
             t->sym_sizes());
  }
}

// dout as the kernel reads it: aligned rows with a contiguous last dim, copied when it is not so
// (e.g. the stride-0 gradient of a sum).
at::Tensor grad_rows(const at::Tensor& dout) {
  return dout.stride(-1) == 1 ? aligned_rows(dout) : dout.contiguous();
}

// The opt-in shared memory per block of t's device, in KiB.
int64_t device_smem_kib(const at::Tensor& t) {
  int bytes = 0;
  cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, t.device().index());
  return bytes / 1024;
}

// The backward's launch after its checks, for dense and (with cu_seqlens) packed inputs alike:
// aligned rows, lse and dlse in one contiguous layout (autograd may hand over an expanded or
// strided dlse), the kernel's fields, and a workspace from torch's allocator.
void run_backward(const char* fn, const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in,
                  const at::Tensor& v_in, const at::Tensor& out_in, const at::Tensor& lse_in,
                  const std::optional<at::Tensor>& dlse_in, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
                  bool causal, std::optional<double> softmax_scale, int64_t window_left, int64_t window_right,
                  double softcap, int64_t seqlen_q, int64_t seqlen_k, const at::Tensor* cu_seqlens_q,
                  const at::Tensor* cu_seqlens_k, bool align_top_left, bool deterministic, bool sm90 = false) {
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = aligned_rows(q_in), k = aligned_rows(k_in), v = aligned_rows(v_in);
  const at::Tensor dout = grad_rows(dout_in), out = aligned_rows(out_in);
  const at::Tensor lse = lse_in.contiguous();
  const at::Tensor dlse = dlse_in.has_value() ? dlse_in->contiguous() : at::Tensor();
  flashext::FlashBwdParams p;
  static_cast<flashext::FlashFwdParams&>(p) =
      attention_params(q, k, v, out, lse, causal, softmax_scale, window_left, window_right, softcap, seqlen_q,
                       seqlen_k, cu_seqlens_q, cu_seqlens_k, align_top_left);
  p.dout = dout.data_ptr();
  p.dlse = dlse.defined() ? dlse.data_ptr<float>() : nullptr;
  p.dq = dq.data_ptr();
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  set_strides(p.do_batch_stride, p.do_row_stride, p.do_head_stride, dout);
  set_strides(p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, dq);
  set_strides(p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, dk);
  set_strides(p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, dv);
  p.deterministic = deterministic;
  FX_CHECK(flashext::flash_bwd_smem_bytes(p.head_dim) > 0, fn, ": head dim ", int64_t(p.head_dim),
           " has no backward kernel that fits this GPU's shared memory per block (", device_smem_kib(dq),
           " KiB); above head dim 128 the backward needs 145 KiB, as on A100 and H100");
  const int64_t bytes = int64_t(flashext::flash_bwd_workspace_bytes(p));
  const at::Tensor workspace = at::empty({bytes}, dq.options().dtype(at::kByte));
  if (sm90) {
    FX_CHECK(flashext::flash_bwd_sm90_takes(p), fn, ": these inputs are outside the Hopper backward's scope "
             "(head dims up to 128, 16-byte aligned rows)");
  }
  // The Hopper backward wherever it and hopper_kernels_take the call (on the H200 at every point of
  // bench_attention's training grid: D = 128 1.19-1.41x the FA2-design backward at eb68e1b, D = 64
  // 1.32-1.53x at da5a2b6).
  if (sm90 || (flashext::flash_bwd_sm90_takes(p) && hopper_kernels_take({q, k, v, dout}))) {
    check_launch(fn, flashext::run_flash_bwd_sm90(p, workspace.data_ptr(), current_stream(dq)));
  } else {
    check_launch(fn, flashext::run_flash_bwd(p, workspace.data_ptr(), current_stream(dq)));
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attn_bwd(
    const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& out_in, const at::Tensor& lse_in, const std::optional<at::Tensor>& dlse_in, bool causal,
    std::optional<double> softmax_scale, int64_t window_left, int64_t window_right, double softcap,
    bool align_top_left, bool deterministic, bool like_inputs) {
  check_qkv(kFlashBwd, q_in, k_in, v_in, 4);
  check_options(kFlashBwd, softmax_scale, window_left, window_right, softcap);
  const std::array<c10::SymInt, 3> lse_shape{q_in.sym_size(0), q_in.sym_size(2), q_in.sym_size(1)};
  check_grad_inputs(kFlashBwd, q_in, dout_in, out_in, lse_in, dlse_in, lse_shape);
  const bool empty = q_in.sym_numel() == 0 || k_in.sym_numel() == 0;
  // No query or no key: every gradient is 0 (an output that sees no key is 0 whatever k and v).
  at::Tensor dq = output_like(q_in, like_inputs, empty);
  at::Tensor dk = output_like(k_in, like_inputs, empty);
  at::Tensor dv = output_like(v_in, like_inputs, empty);
  if (is_meta(q_in) || empty) return {dq, dk, dv};
  run_backward(kFlashBwd, dout_in, q_in, k_in, v_in, out_in, lse_in, dlse_in, dq, dk, dv, causal, softmax_scale,
               window_left, window_right, softcap, q_in.size(1), k_in.size(1), nullptr, nullptr, align_top_left,
               deterministic);
  return {dq, dk, dv};
}

// The Hopper backward by itself (flash_bwd_sm90.h), for its tests (flash_attention's backward
// reaches it through run_backward): head dims up to 128, dense, full or causal, on an sm_90 GPU
// with a build holding sm_90a code.
std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attn_bwd_sm90(const at::Tensor& dout_in, const at::Tensor& q_in,
                                                                   const at::Tensor& k_in, const at::Tensor& v_in,
                                                                   const at::Tensor& out_in, const at::Tensor& lse_in,
                                                                   bool causal, std::optional<double> softmax_scale) {
  check_qkv(kSm90Bwd, q_in, k_in, v_in, 4);
  check_options(kSm90Bwd, softmax_scale, -1, -1, 0.0);
  const std::array<c10::SymInt, 3> lse_shape{q_in.sym_size(0), q_in.sym_size(2), q_in.sym_size(1)};
  check_grad_inputs(kSm90Bwd, q_in, dout_in, out_in, lse_in, std::nullopt, lse_shape);
  FX_CHECK(q_in.sym_size(-1) <= 128, kSm90Bwd, ": head dim must be at most 128, got ", q_in.sym_size(-1));
  FX_CHECK(q_in.sym_size(1) > 0 && k_in.sym_size(1) > 0, kSm90Bwd,
           ": arguments 'q' and 'k' must hold at least one row each, got shapes ", q_in.sym_sizes(), " and ",
           k_in.sym_sizes());
  at::Tensor dq = output_like(q_in, false, false);
  at::Tensor dk = output_like(k_in, false, false);
  at::Tensor dv = output_like(v_in, false, false);
  if (is_meta(q_in) || q_in.numel() == 0) return {dq, dk.zero_(), dv.zero_()};
  check_hopper_call(kSm90Bwd, q_in, k_in, v_in);
  run_backward(kSm90Bwd, dout_in, q_in, k_in, v_in, out_in, lse_in, std::nullopt, dq, dk, dv, causal, softmax_scale,
               -1, -1, 0.0, q_in.size(1), k_in.size(1), nullptr, nullptr, false, false, /*sm90=*/true);
  return {dq, dk, dv};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attn_varlen_bwd(
    const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& out_in, const at::Tensor& lse_in, const std::optional<at::Tensor>& dlse_in,
    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
    bool causal, std::optional<double> softmax_scale, int64_t window_left, int64_t window_right, double softcap,
    bool deterministic, bool like_inputs) {
  check_qkv(kFlashVarlenBwd, q_in, k_in, v_in, 3);
  check_options(kFlashVarlenBwd, softmax_scale, window_left, window_right, softcap);
  check_cu_seqlens_args(kFlashVarlenBwd, q_in, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  const std::array<c10::SymInt, 2> lse_shape{q_in.sym_size(1), q_in.sym_size(0)};
  check_grad_inputs(kFlashVarlenBwd, q_in, dout_in, out_in, lse_in, dlse_in, lse_shape);
  // Rows no sequence covers are never written (the kernels visit sequences' rows only): dq, dk and dv
  // start at 0.
  at::Tensor dq = output_like(q_in, like_inputs, true);
  at::Tensor dk = output_like(k_in, like_inputs, true);
  at::Tensor dv = output_like(v_in, like_inputs, true);
  if (is_meta(q_in)) return {dq, dk, dv};
  if (q_in.numel() == 0 || k_in.numel() == 0 || cu_seqlens_q.size(0) == 1) return {dq.zero_(), dk, dv};
  run_backward(kFlashVarlenBwd, dout_in, q_in, k_in, v_in, out_in, lse_in, dlse_in, dq, dk, dv, causal,
               softmax_scale, window_left, window_right, softcap, max_seqlen_q, max_seqlen_k, &cu_seqlens_q,
               &cu_seqlens_k, false, deterministic);
  return {dq, dk, dv};
}

void register_attention_impls(torch::Library& m) {
  m.impl("flash_attn_fwd", &flash_attn_fwd);
  m.impl("flash_attn_varlen_fwd", &flash_attn_varlen_fwd);
  m.impl("flash_attn_bwd", &flash_attn_bwd);
  m.impl("flash_attn_varlen_bwd", &flash_attn_varlen_bwd);
  m.impl("flash_attn_block_sparse_fwd", &flash_attn_block_sparse_fwd);
  m.impl("_flash_attn_fwd_sm90", &flash_attn_fwd_sm90);
  m.impl("_flash_attn_bwd_sm90", &flash_attn_bwd_sm90);
}

}  // namespace

// CUDA tensors run the kernel; CPU tensors reach the same checks, which refuse them by name; meta
// (fake) tensors get every check but the device ones, and empty outputs of the right shape.
TORCH_LIBRARY_IMPL(flashext, CUDA, m) { register_attention_impls(m); }
TORCH_LIBRARY_IMPL(flashext, CPU, m) { register_attention_impls(m); }
TORCH_LIBRARY_IMPL(flashext, Meta, m) { register_attention_impls(m); }

}  // namespace flashext_torch
