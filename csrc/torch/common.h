// flashext torch glue: the input checks and conversions every op family shares.
// Torch headers stay in csrc/torch; the kernels below csrc/kernels never see them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <c10/util/Exception.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "flashext/common.h"

namespace flashext_torch {

// ---- error messages -------------------------------------------------------------------------
// Messages are assembled into one std::string here and handed to TORCH_CHECK whole: formatting
// integers through TORCH_CHECK's own ostringstream crashed inside this library on the GPU
// machine (g++ 13 / torch 2.11; see docs/notes/gelu.md), so no iostream is used in the glue.
namespace detail {
inline void append(std::string& s, const char* v) { s += v; }
inline void append(std::string& s, std::string_view v) { s.append(v.data(), v.size()); }
inline void append(std::string& s, const std::string& v) { s += v; }
inline void append(std::string& s, int64_t v) { s += std::to_string(v); }
inline void append(std::string& s, int v) { s += std::to_string(v); }
inline void append(std::string& s, const c10::Device& v) { s += v.str(); }
inline void append(std::string& s, at::ScalarType v) { s += c10::toString(v); }
void append(std::string& s, const c10::SymInt& v);  // the value, or its symbol while tracing
void append(std::string& s, c10::SymIntArrayRef shape);  // "[2, 3]"
inline void append(std::string& s, at::IntArrayRef shape) { append(s, c10::fromIntArrayRefSlow(shape)); }
}  // namespace detail

// Raise a RuntimeError whose message is the concatenation of the pieces.
template <typename... Pieces>
[[noreturn]] void fail(const Pieces&... pieces) {
  std::string message;
  (detail::append(message, pieces), ...);
  TORCH_CHECK(false, message);
  __builtin_unreachable();
}

#define FX_CHECK(cond, ...)                                   \
  do {                                                        \
    if (!(cond)) ::flashext_torch::fail(__VA_ARGS__);         \
  } while (0)

// ---- one check per op, for the CUDA kernel and for tracing ----------------------------------
// Every op registers one function for the CUDA, CPU and Meta dispatch keys. It checks its
// inputs, allocates its outputs, and launches only on CUDA tensors. Meta tensors are what
// torch.compile's fake tensors reach (FakeTensorMode runs the Meta kernel): they get every check
// but the device ones, with the same words, and shapes may be symbolic there, so the checks read
// sizes through sym_size()/sym_sizes() (c10::SymInt compares like an integer; while tracing a
// comparison becomes a guard).
inline bool is_meta(const at::Tensor& t) { return t.is_meta(); }

// The compute capability of a CUDA device, queried once per device, then cached (no driver call
// on the hot path).
void device_capability(int device, int* major, int* minor);

// `t` is defined and, unless it is a meta tensor, on a CUDA device this build holds kernels for.
void check_cuda_tensor(const char* fn, const at::Tensor& t, const char* name);

// Refuses anything the kernels cannot take, naming the public function (fn) and the argument:
// a tensor that is not on a CUDA device, or whose dtype is not float32/float16/bfloat16, or a
// device this build has no kernels for (the device checks are skipped for meta tensors).
void check_float_cuda_tensor(const char* fn, const at::Tensor& t, const char* name);

// `t` lives on the same device and has the same dtype as `ref`.
void check_same_device_dtype(const char* fn, const at::Tensor& ref, const char* ref_name,
                             const at::Tensor& t, const char* name);

// `out` can receive a result of shape/dtype/device of `like`: contiguous, and not partially
// overlapping any input (exact aliasing, for in-place use, is allowed; not checkable on meta).
void check_out_tensor(const char* fn, const at::Tensor& out, const at::Tensor& like,
                      std::initializer_list<at::Tensor> inputs);

flashext::DType to_kernel_dtype(at::ScalarType type);

// x as rows × cols (cols = last dim) with a row stride, without a copy when its layout allows:
// last dim contiguous and the leading dims collapsible into one stride (e.g. a column slice of
// a wider matrix); otherwise a contiguous copy.
struct RowView {
  at::Tensor tensor;  // x itself, or a contiguous copy
  int64_t rows, cols, row_stride;
};
RowView row_view(const at::Tensor& x);

// Whether every row start of t (its pointer and each stride but the last) is 16-byte aligned, as
// the kernels' 16-byte loads and cp.async copies need.
bool rows_aligned16(const at::Tensor& t);

// t itself when its rows are 16-byte aligned, else a fresh contiguous copy. A copy, not
// contiguous(): a contiguous view that starts at an odd element offset is misaligned too, and
// contiguous() would hand it back unchanged. (The allocator's blocks are 512-byte aligned and the
// kernels' rows are multiples of 16 bytes, so the copy's rows are aligned.)
at::Tensor aligned_rows(const at::Tensor& t);

// Whether some dimension of t but the last has more than one element and stride 0 (a broadcast
// view, such as expand() makes), which TMA tensor maps cannot describe.
bool has_zero_strides(const at::Tensor& t);

// The stream PyTorch is using on t's device (what graph capture records).
cudaStream_t current_stream(const at::Tensor& t);

// Raise a Python RuntimeError naming fn when a launch failed.
void check_launch(const char* fn, cudaError_t err);

}  // namespace flashext_torch
