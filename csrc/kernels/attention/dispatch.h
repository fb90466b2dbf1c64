// flashext attention: from a runtime dtype and head dim to the compiled kernels. Every attention
// entry point (forward, block-sparse, backward, decode, the Hopper path) picks its template
// arguments through these two, so the set of compiled head dims and dtypes lives in one place.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "flashext/attention.h"

namespace flashext {
namespace attention_detail {

template <typename T>
struct TypeTag {
  using type = T;
};

// fn(TypeTag<T>{}) for the 16-bit kernel types (fp16, bf16); `none` for any other dtype.
template <typename R, typename Fn>
R with_16bit_type(DType dtype, R none, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat16: return fn(TypeTag<__half>{});
    case DType::kBFloat16: return fn(TypeTag<__nv_bfloat16>{});
    default: return none;
  }
}

// fn(std::integral_constant<int, D>{}) for the compiled head dim D that serves head_dim (64, 128
// or 256: flash_fwd_kernel_head_dim); `none` when no kernel does.
template <typename R, typename Fn>
R with_kernel_head_dim(int head_dim, R none, Fn&& fn) {
  switch (flash_fwd_kernel_head_dim(head_dim)) {
    case 64: return fn(std::integral_constant<int, 64>{});
    case 128: return fn(std::integral_constant<int, 128>{});
    case 256: return fn(std::integral_constant<int, 256>{});
    default: return none;
  }
}

}  // namespace attention_detail
}  // namespace flashext
