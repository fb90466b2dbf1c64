#include "common.h"

#include <ATen/MemoryOverlap.h>
#include <c10/core/SymNodeImpl.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>

namespace flashext_torch {

void device_capability(int device, int* major, int* minor) {
  constexpr int kMaxDevices = 64;
  static std::array<std::atomic<int>, kMaxDevices> cache{};  // 0 unknown, else 10 · major + minor + 1
  const bool cacheable = device >= 0 && device < kMaxDevices;
  int known = cacheable ? cache[device].load(std::memory_order_relaxed) : 0;
  if (known == 0) {
    *major = *minor = 0;
    cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, device);
    known = 10 * *major + *minor + 1;
    if (cacheable && *major > 0) cache[device].store(known, std::memory_order_relaxed);
  }
  *major = (known - 1) / 10;
  *minor = (known - 1) % 10;
}

namespace {

// Whether this build holds kernels for `device`.
bool device_supported(int device, int* major, int* minor) {
  device_capability(device, major, minor);
  return flashext::arch_supported(flashext::compiled_cuda_archs(), *major, *minor);
}

}  // namespace

void detail::append(std::string& s, const c10::SymInt& v) {
  if (const auto value = v.maybe_as_int()) {
    s += std::to_string(*value);
  } else {
    s += v.toSymNode()->str();
  }
}

void detail::append(std::string& s, c10::SymIntArrayRef shape) {
  s += '[';
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    append(s, shape[i]);
  }
  s += ']';
}

void check_cuda_tensor(const char* fn, const at::Tensor& t, const char* name) {
  FX_CHECK(t.defined(), fn, ": argument '", name, "' is undefined (None)");
  if (is_meta(t)) return;
  FX_CHECK(t.is_cuda(), fn, ": argument '", name, "' must be a CUDA tensor, got a tensor on ",
           t.device());
  int major = 0, minor = 0;
  FX_CHECK(device_supported(t.get_device(), &major, &minor), fn,
           ": this build of flashext holds kernels for CUDA archs '",
           flashext::compiled_cuda_archs(), "', not for the compute capability ", major, ".",
           minor, " of ", t.device(), "; rebuild with FLASHEXT_CUDA_ARCHS including it");
}

void check_float_cuda_tensor(const char* fn, const at::Tensor& t, const char* name) {
  check_cuda_tensor(fn, t, name);
  const auto type = t.scalar_type();
  FX_CHECK(type == at::kFloat || type == at::kHalf || type == at::kBFloat16, fn,
           ": argument '", name, "' must be float32, float16 or bfloat16, got ", type);
}

void check_same_device_dtype(const char* fn, const at::Tensor& ref, const char* ref_name,
                             const at::Tensor& t, const char* name) {
  FX_CHECK(t.defined(), fn, ": argument '", name, "' is undefined (None)");
  FX_CHECK(t.device() == ref.device(), fn, ": argument '", name,
              "' must be on the same device as '", ref_name, "' (", ref.device(), "), got ",
              t.device());
  FX_CHECK(t.scalar_type() == ref.scalar_type(), fn, ": argument '", name,
              "' must have the dtype of '", ref_name, "' (", ref.scalar_type(), "), got ",
              t.scalar_type());
}

void check_out_tensor(const char* fn, const at::Tensor& out, const at::Tensor& like,
                      std::initializer_list<at::Tensor> inputs) {
  check_same_device_dtype(fn, like, "x", out, "out");
  FX_CHECK(out.sym_sizes() == like.sym_sizes(), fn, ": argument 'out' must have shape ", like.sym_sizes(),
           ", got ", out.sym_sizes());
  FX_CHECK(out.is_contiguous(), fn, ": argument 'out' must be contiguous");
  if (is_meta(out)) return;
  for (const at::Tensor& input : inputs) {
    FX_CHECK(at::get_overlap_status(out, input) != at::MemOverlapStatus::Partial, fn,
                ": argument 'out' partially overlaps an input; it may alias one exactly or not at all");
  }
}

flashext::DType to_kernel_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return flashext::DType::kFloat32;
    case at::kHalf: return flashext::DType::kFloat16;
    case at::kBFloat16: return flashext::DType::kBFloat16;
    default: fail("flashext: unsupported dtype ", type);
  }
}

RowView row_view(const at::Tensor& x) {
  const int64_t cols = x.size(-1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  int64_t row_stride = cols;
  bool strided_ok = x.size(-1) <= 1 || x.stride(-1) == 1;
  int64_t expected = -1;  // stride the next leading dim must have, once one is seen
  for (int64_t d = x.dim() - 2; d >= 0 && strided_ok; --d) {
    if (x.size(d) == 1) continue;
    if (expected < 0) {
      row_stride = x.stride(d);
      strided_ok = row_stride >= cols;  // rows must not overlap
    } else {
      strided_ok = x.stride(d) == expected;
    }
    expected = x.stride(d) * x.size(d);
  }
  if (strided_ok) return {x, rows, cols, row_stride};
  return {x.contiguous(), rows, cols, cols};
}

bool rows_aligned16(const at::Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) {
    if (t.size(d) > 1 && (t.stride(d) * t.element_size()) % 16 != 0) return false;
  }
  return true;
}

bool has_zero_strides(const at::Tensor& t) {
  for (int64_t d = 0; d + 1 < t.dim(); ++d) {
    if (t.size(d) > 1 && t.stride(d) == 0) return true;
  }
  return false;
}

at::Tensor aligned_rows(const at::Tensor& t) {
  return rows_aligned16(t) ? t : t.clone(at::MemoryFormat::Contiguous);
}

cudaStream_t current_stream(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.get_device()).stream();
}

void check_launch(const char* fn, cudaError_t err) {
  FX_CHECK(err == cudaSuccess, fn, ": CUDA error: ", cudaGetErrorString(err));
}

}  // namespace flashext_torch
