// flashext FlashAttention forward: checks the params, picks the compiled head dim and dtype.
// The instantiations live in flash_fwd_hdim{64,128,256}.cu (block-sparse: flash_fwd_sparse_hdim*.cu).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dispatch.h"
#include "flashext/attention.h"

namespace flashext {
namespace attention_detail {
template <typename T, int kHeadDim>
cudaError_t launch_flash_fwd(const FlashFwdParams& p, cudaStream_t stream);
template <typename T, int kHeadDim>
cudaError_t launch_flash_fwd_sparse(const FlashFwdParams& p, void* workspace, cudaStream_t stream);
template <int kHeadDim>
int64_t sparse_plan_ints(const FlashFwdParams& p);
}  // namespace attention_detail

namespace {
bool fwd_params_ok(const FlashFwdParams& p) {
  return p.batch >= 0 && p.heads > 0 && p.heads_kv > 0 && p.heads % p.heads_kv == 0 && p.seqlen_q >= 0 &&
         p.seqlen_k >= 0 && flash_fwd_kernel_head_dim(p.head_dim) != 0 &&
         (p.cu_seqlens_q == nullptr) == (p.cu_seqlens_k == nullptr);
}
}  // namespace

cudaError_t run_flash_fwd(const FlashFwdParams& p, cudaStream_t stream) {
  if (!fwd_params_ok(p)) return cudaErrorInvalidValue;
  if (p.batch == 0 || p.seqlen_q == 0) return cudaSuccess;
  using namespace attention_detail;
  return with_16bit_type(p.dtype, cudaErrorInvalidValue, [&](auto type) {
    return with_kernel_head_dim(p.head_dim, cudaErrorInvalidValue, [&](auto dim) {
      return launch_flash_fwd<typename decltype(type)::type, decltype(dim)::value>(p, stream);
    });
  });
}

size_t flash_block_sparse_workspace_bytes(const FlashFwdParams& p) {
  using namespace attention_detail;
  return with_kernel_head_dim(p.head_dim, size_t(0),
                              [&](auto dim) { return size_t(sparse_plan_ints<decltype(dim)::value>(p)) * sizeof(int); });
}

cudaError_t run_flash_block_sparse_fwd(const FlashFwdParams& p, void* workspace, cudaStream_t stream) {
  // (no keys: an empty mask, which may have no address; every query then sees none)
  if (!fwd_params_ok(p) || p.cu_seqlens_q != nullptr || (p.block_mask == nullptr && p.seqlen_k > 0) ||
      p.block_rows < 1 || p.block_cols < 1 || (workspace == nullptr && flash_block_sparse_workspace_bytes(p) > 0)) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0 || p.seqlen_q == 0) return cudaSuccess;
  using namespace attention_detail;
  return with_16bit_type(p.dtype, cudaErrorInvalidValue, [&](auto type) {
    return with_kernel_head_dim(p.head_dim, cudaErrorInvalidValue, [&](auto dim) {
      return launch_flash_fwd_sparse<typename decltype(type)::type, decltype(dim)::value>(p, workspace, stream);
    });
  });
}

}  // namespace flashext
