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

// The CUDA targets this build holds, as nvcc names them, e.g. "sm_90a;sm_80;compute_80": sm_XY is
// machine code (SASS), compute_XY is PTX that the driver JIT-compiles at load (set by setup.py /
// CMake from FLASHEXT_CUDA_ARCHS).
const char* compiled_cuda_archs();

// Whether a device of compute capability major.minor can run a build of `arch_list`: entries
// separated by ';', ',' or spaces, each "sm_XY" / "XY" / "X.Y" (SASS: runs on major X with minor
// >= Y), "compute_XY" (PTX: runs on any device >= X.Y) or "XY+PTX" (both). An arch-specific
// target ("90a", "compute_90a"; likewise "f") runs only on exactly X.Y. Unparseable entries match
// nothing.
bool arch_supported(const char* arch_list, int major, int minor);

// The kernels compiled into this build, one name per line.
const char* compiled_kernels();

// Which calls the Hopper (sm_90a) kernels serve (on sm_90, in a build with sm_90a code):
//   kOff          none: the portable FA2-design kernels serve every call, as on other GPUs (to
//                 compare the two, or to fall back);
//   kWhereFaster  the calls where they beat the portable kernels (the default);
//   kAlways       every call they can take, also where the portable kernels are faster (to test
//                 them on every shape).
// Set by the environment's FLASHEXT_HOPPER when the library loads ("0", "false", "off" or "no":
// kOff; "always": kAlways) or by set_hopper_kernels. Process-wide; read at each call's dispatch.
enum class HopperKernels : int { kOff = 0, kWhereFaster = 1, kAlways = 2 };
HopperKernels hopper_kernels();
HopperKernels set_hopper_kernels(HopperKernels mode);  // returns the previous setting
inline bool hopper_kernels_enabled() { return hopper_kernels() != HopperKernels::kOff; }

}  // namespace flashext
