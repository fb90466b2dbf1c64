// flashext: what this build holds (CUDA targets, kernels), for flashext.build_info(), the run-time
// device check and the C++ tests.
#include <algorithm>
#include <cctype>
#include <string>

#include "flashext/common.h"

namespace flashext {

// FLASHEXT_CUDA_ARCHS is the compiled targets' list, which setup.py and tests/cpp/CMakeLists.txt
// pass as -DFLASHEXT_CUDA_ARCHS="sm_90a;..." (a build without it does not compile).
const char* compiled_cuda_archs() { return FLASHEXT_CUDA_ARCHS; }

const char* compiled_kernels() {
  return "add_gelu_fwd\n"
         "add_gelu_bwd\n"
         "bias_gelu_fwd\n"
         "bias_gelu_bwd\n"
         "flash_fwd\n"
         "flash_bwd\n"
         "flash_decode\n"
         "kvcache_append\n"
         "merge_attention_states\n"
         "online_softmax\n";
}

namespace {

// One arch entry: the compute capability it names and the code it embeds.
struct ArchEntry {
  int major = 0, minor = 0;
  bool sass = false;      // machine code: runs on `major` with a minor >= `minor`
  bool ptx = false;       // PTX: the driver JIT-compiles it on any device >= major.minor
  bool specific = false;  // "a"/"f" target: either form runs on exactly major.minor
};

bool strip_prefix(std::string& s, const std::string& prefix) {
  if (s.compare(0, prefix.size(), prefix) != 0) return false;
  s.erase(0, prefix.size());
  return true;
}

// "90a", "9.0a", "sm_90a", "80+PTX", "compute_80" (any case) -> ArchEntry; false if unparseable.
bool parse_arch(std::string s, ArchEntry* out) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  ArchEntry e;
  const std::string plus_ptx = "+ptx";
  e.ptx = s.size() > plus_ptx.size() && s.compare(s.size() - plus_ptx.size(), plus_ptx.size(), plus_ptx) == 0;
  if (e.ptx) s.resize(s.size() - plus_ptx.size());
  if (strip_prefix(s, "compute_")) {
    if (e.ptx) return false;  // "compute_80+PTX" says PTX twice: refuse rather than guess
    e.ptx = true;
  } else {
    strip_prefix(s, "sm_");
    e.sass = true;
  }
  const size_t dot = s.find('.');
  if (dot != std::string::npos) s.erase(dot, 1);  // "8.0" -> "80"
  if (!s.empty() && (s.back() == 'a' || s.back() == 'f')) {
    e.specific = true;
    s.pop_back();
  }
  if (s.size() < 2 || s.size() > 3 || !std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); }))
    return false;
  const int value = std::stoi(s);
  e.major = value / 10;
  e.minor = value % 10;
  *out = e;
  return true;
}

bool runs_on(const ArchEntry& e, int major, int minor) {
  if (e.specific) return e.major == major && e.minor == minor;
  const bool sass_runs = e.sass && major == e.major && minor >= e.minor;
  const bool ptx_runs = e.ptx && (major > e.major || (major == e.major && minor >= e.minor));
  return sass_runs || ptx_runs;
}

}  // namespace

bool arch_supported(const char* arch_list, int major, int minor) {
  const std::string list(arch_list ? arch_list : "");
  size_t pos = 0;
  while (pos < list.size()) {
    size_t end = list.find_first_of(";, ", pos);
    if (end == std::string::npos) end = list.size();
    ArchEntry entry;
    if (end > pos && parse_arch(list.substr(pos, end - pos), &entry) && runs_on(entry, major, minor)) return true;
    pos = end + 1;
  }
  return false;
}

}  // namespace flashext
