// flashext: what this build holds (archs, kernels), for flashext.build_info() and the C++ tests.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "flashext/common.h"

#ifndef FLASHEXT_CUDA_ARCHS
#error "FLASHEXT_CUDA_ARCHS must name the compiled archs, e.g. -DFLASHEXT_CUDA_ARCHS=\"90a\""
#endif

namespace flashext {

const char* compiled_cuda_archs() { return FLASHEXT_CUDA_ARCHS; }

const char* compiled_kernels() {
  return "add_gelu_fwd\n"
         "add_gelu_bwd\n"
         "bias_gelu_fwd\n"
         "bias_gelu_bwd\n"
         "flash_fwd\n"
         "online_softmax\n";
}

bool arch_supported(const char* arch_list, int major, int minor) {
  // arch_list: "90a;80" or "9.0a 8.0" style entries separated by ';', ',' or spaces.
  std::string list(arch_list ? arch_list : "");
  size_t pos = 0;
  while (pos < list.size()) {
    const size_t end = list.find_first_of(";, ", pos);
    std::string entry = list.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    pos = end == std::string::npos ? list.size() : end + 1;
    entry.erase(std::remove(entry.begin(), entry.end(), '.'), entry.end());
    if (entry.size() < 2) continue;
    const bool arch_specific = entry.back() == 'a' || entry.back() == 'f';
    if (arch_specific) entry.pop_back();
    const int value = std::atoi(entry.c_str());
    const int entry_major = value / 10, entry_minor = value % 10;
    if (entry_major != major) continue;
    if (arch_specific ? entry_minor == minor : entry_minor <= minor) return true;
  }
  return false;
}

}  // namespace flashext
