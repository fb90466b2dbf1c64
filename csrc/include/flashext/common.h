// flashext: torch-free vocabulary shared by every kernel family's launch API.
#pragma once

#include <cstdint>

namespace flashext {

// Element types the kernels are compiled for. The glue maps torch dtypes onto these.
enum class DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline int dtype_size(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

inline const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

// The CUDA architectures this build holds, as "90a;80" (set by setup.py / CMake).
const char* compiled_cuda_archs();

// Whether a device of compute capability major.minor can run this build's kernels.
// sm_XY machine code runs on major X, minor >= Y; an "a" target runs on exactly X.Y.
bool arch_supported(const char* arch_list, int major, int minor);

// The kernels compiled into this build, one name per line.
const char* compiled_kernels();

}  // namespace flashext
