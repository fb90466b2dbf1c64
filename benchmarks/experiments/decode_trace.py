"""Writes a copy of flash_decode.cu with per-block trace marks for probe_decode.cu (a debugging
tool): thread 0 of each block stores globaltimer at its start, when its first tile is in, when its
keys are done and at its exit, and its SM id, to g_decode_trace[block * 5 + i] where that pointer is
set. Marks are inserted at text found exactly once (an anchor of part of one line, no newline in
it: the one line that starts with it, whatever its indentation), so a patched kernel (an A/B
variant) keeps them as long as those lines stay.

    python benchmarks/experiments/decode_trace.py SRC DST
"""

import sys

MARKS = [
    # (text of the line, insert "before" or "after" it, the inserted code)
    ("template <typename T, typename Config>\n__global__ void __launch_bounds__(Config::kThreads",
     "before",
     "__device__ unsigned long long* g_decode_trace = nullptr;\n"
     "FX_DEVICE unsigned long long decode_now() {\n"
     "  unsigned long long t;\n"
     "  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t));\n"
     "  return t;\n"
     "}\n\n"),
    ("  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group_id = lane / 4, quad = lane % 4;\n",
     "before",
     "  unsigned long long* trace_slot = g_decode_trace == nullptr || threadIdx.x != 0 ? nullptr :\n"
     "      g_decode_trace + 5 * (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * size_t(blockIdx.z)));\n"
     "  if (trace_slot) {\n"
     "    unsigned smid;\n"
     "    asm volatile(\"mov.u32 %0, %%smid;\" : \"=r\"(smid));\n"
     "    trace_slot[0] = decode_now(), trace_slot[4] = smid;\n"
     "  }\n"),
    ("    __syncthreads();  // tile `it` is in", "after",
     "    if (trace_slot && it == 0) trace_slot[1] = decode_now();\n"),
    ("  ptx::cp_async_wait<0>();  // nothing in flight at exit\n", "after",
     "  if (trace_slot) trace_slot[2] = decode_now();\n"),
    ("  // Epilogue: this thread's rows", "before",
     "  struct TraceExit {\n"
     "    unsigned long long* slot;\n"
     "    FX_DEVICE ~TraceExit() { if (slot) slot[3] = decode_now(); }\n"
     "  } trace_exit{trace_slot};\n"),
]


def main(src, dst):
    text = open(src).read()
    for anchor, where, code in MARKS:
        if "\n" not in anchor:  # one line's start: the whole line that starts with it
            lines = [line for line in text.splitlines(keepends=True) if line.lstrip().startswith(anchor.lstrip())]
            anchor = lines[0] if len(lines) == 1 else anchor + "\n"
        if text.count(anchor) != 1:
            sys.exit(f"decode_trace.py: the line {anchor.strip()[:60]!r} is not in {src} exactly once")
        text = text.replace(anchor, code + anchor if where == "before" else anchor + code)
    open(dst, "w").write(text)


if __name__ == "__main__":
    main(*sys.argv[1:])
