// flashext: packs of elements moved as one 16-byte access, and fp32 conversions.
//
// A Pack<T, N> is N consecutive elements of storage type T (float, __half, __nv_bfloat16).
// When sizeof(Pack) == 16 the loads and stores below are single 128-bit instructions
// (LDG.E.128 / STG.E.128 in SASS). They use the default cache policy: the evict-first hints
// (ld/st.global.cs) measured 3-7% slower on the H200 at 2^28 elements (docs/notes/gelu.md).
// Plain ld.global is coherent (unlike ld.global.nc), so an output may alias an input.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "macros.h"

namespace flashext {

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T elem[N];
};

FX_DEVICE float to_float(float v) { return v; }
FX_DEVICE float to_float(__half v) { return __half2float(v); }
FX_DEVICE float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// The N elements of a pack as fp32. bf16 is widened a 32-bit word (two elements) at a time: the
// low element is the word shifted up, the high one the word with its low half cleared, one
// instruction each (converting element by element spends a PRMT more on every high element:
// 29 instead of 16 instructions for the backward's two 8-element packs).
template <typename T, int N>
FX_DEVICE void unpack(const Pack<T, N>& p, float (&out)[N]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16> && N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      uint32_t word;
      memcpy(&word, &p.elem[i], sizeof(word));
      out[i] = __uint_as_float(word << 16);
      out[i + 1] = __uint_as_float(word & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(p.elem[i]);
  }
}

template <typename T> FX_DEVICE T from_float(float v);
template <> FX_DEVICE float from_float<float>(float v) { return v; }
template <> FX_DEVICE __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> FX_DEVICE __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Load N elements starting at ptr[index · N].
template <typename T, int N>
FX_DEVICE Pack<T, N> load_pack(const T* ptr, int64_t index) {
  return reinterpret_cast<const Pack<T, N>*>(ptr)[index];
}

// Store N elements starting at ptr[index · N].
template <typename T, int N>
FX_DEVICE void store_pack(T* ptr, int64_t index, const Pack<T, N>& value) {
  reinterpret_cast<Pack<T, N>*>(ptr)[index] = value;
}

// Elements per 16-byte access for a storage type.
template <typename T>
constexpr int kVec16 = 16 / sizeof(T);

}  // namespace flashext
