"""The instructions of a Hopper attention kernel's key loop on its shortest path, counted in SASS.

    python3 benchmarks/experiments/sass_hot_path.py KERNELS.cubin [NAME_REGEX] [--list] [--tile]

For each kernel of the cubin whose name matches NAME_REGEX (default: every flash_*_sm90_kernel), the
innermost loop that issues HGMMA (the back branch with the shortest body holding one), and the
shortest path through it from its head to that back branch: a full key block with no mask, no
soft-cap and no varlen guard, and every barrier wait passing at once, the iteration that dominates a
long call. Its counts by kind (FP: FADD, FMUL, FFMA, FMNMX, MUFU, F2FP; the rest is the integer,
uniform, predicate and synchronisation work around them) are what docs/notes/attention_sm90_*.md
compare with cuDNN's source-level profile. `--list` prints the path itself. `--tile` counts instead
what a tile costs outside its key loop: the shortest path through the outermost HGMMA loop (the tile
loop) that passes the first block's S and the last P V without entering the key loop (the walk, the
first block's S and softmax, the last P V, the epilogue; the shortest epilogue branch), which
a kernel whose first block runs inside its key loop (Sm90FwdConfig::kPeelFirstBlock false) has not.

The cubin: `nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc/include
-Icsrc/kernels -cubin csrc/kernels/attention/flash_fwd_sm90.cu -o fwd.cubin`; cuobjdump is taken
from the CUDA toolkit, or from Triton's bundled copy when the toolkit has none.
"""

import heapq
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.sass import cuobjdump, functions  # noqa: E402

FP = ("FADD", "FMUL", "FFMA", "FMNMX", "MUFU", "F2FP")


def kernels(cubin, pattern):
    """{name: [(address, instruction)]} of the matching functions."""
    tool = cuobjdump() or sys.exit("cuobjdump not found (no CUDA toolkit on PATH, no Triton)")
    return {name: code for name, code in functions(cubin, tool).items() if re.search(pattern, name)}


def target(instruction):
    m = re.search(r"\bBRA (?:\S+, )?(0x[0-9a-f]+)", instruction)
    return int(m.group(1), 16) if m and "U.ANY" not in instruction else None


def hgmma_loops(code):
    """(head, back branch, length) of every loop holding HGMMA: conditional back branches only (a
    barrier wait's retry stub jumps back unconditionally)."""
    order, ins = [a for a, _ in code], dict(code)
    loops = []
    for a in order:
        t = target(ins[a])
        if t is not None and t < a and ins[a].startswith("@"):
            body = [x for x in order if t <= x <= a]
            if any("HGMMA" in ins[x] for x in body):
                loops.append((t, a, len(body)))
    return loops


def shortest(code, start, end, lo, hi, banned=frozenset()):
    """The shortest instruction path from start to end within [lo, hi], avoiding `banned`."""
    order, ins = [a for a, _ in code], dict(code)
    index = {a: k for k, a in enumerate(order)}
    dist, prev, queue = {start: 1}, {start: None}, [(1, start)]
    while queue:
        d, a = heapq.heappop(queue)
        if a == end:
            break
        if d > dist[a]:
            continue
        i, t = ins[a], target(ins[a])
        nxt = order[index[a] + 1] if index[a] + 1 < len(order) else None
        succ = []
        if t is not None:
            succ.append(t)
            if i.startswith("@"):
                succ.append(nxt)
        elif "EXIT" not in i or i.startswith("@"):
            succ.append(nxt)
        for s in succ:
            if s is not None and lo <= s <= hi and s not in banned and d + 1 < dist.get(s, 1 << 30):
                dist[s], prev[s] = d + 1, a
                heapq.heappush(queue, (d + 1, s))
    if end not in prev:
        return []
    path, a = [], end
    while a is not None:
        path.append((a, ins[a]))
        a = prev.get(a)
    return path[::-1]


def hot_path(code):
    """The shortest path through the innermost HGMMA loop: [(address, instruction)]."""
    loops = hgmma_loops(code)
    if not loops:
        return []
    start, end, _ = min(loops, key=lambda loop: loop[2])
    return shortest(code, start, end, start, end)


def tile_path(code):
    """The shortest path through the tile loop past the first block's S and the last P V, outside
    the key loop."""
    loops = hgmma_loops(code)
    if len(loops) < 2:
        return []
    start, end, _ = max(loops, key=lambda loop: loop[2])
    inner = min(loops, key=lambda loop: loop[2])
    banned = frozenset(a for a, _ in code if inner[0] <= a <= inner[1])
    hgmma = [a for a, i in code if start <= a <= end and "HGMMA" in i]
    first = [a for a in hgmma if a < inner[0]]
    last = [a for a in hgmma if a > inner[1]]
    if not first or not last:
        return []
    legs = [shortest(code, start, first[0], start, end, banned), shortest(code, first[0], last[0], start, end, banned),
            shortest(code, last[0], end, start, end, banned)]
    if not all(legs):
        return []
    return legs[0] + legs[1][1:] + legs[2][1:]


def opcode(instruction):
    return re.sub(r"^@!?U?P\w+ ", "", instruction).split(" ")[0].split(".")[0]


def main():
    args = [a for a in sys.argv[1:] if a not in ("--list", "--tile")]
    if not args:
        sys.exit(__doc__)
    pattern = args[1] if len(args) > 1 else r"flash_\w+_sm90_kernel"
    for name, code in kernels(args[0], pattern).items():
        path = tile_path(code) if "--tile" in sys.argv else hot_path(code)
        kinds = Counter(opcode(i) for _, i in path)
        fp, hgmma = sum(kinds[k] for k in FP), kinds["HGMMA"]
        config = re.search(r"(Sm90\w*?Config)((?:ILi|Li)(\d+)E|Lb[01]E)+", name)
        numbers = re.findall(r"Li(\d+)E|Lb([01])E", config.group(0)) if config else []
        numbers = [n or ("true" if b == "1" else "false") for n, b in numbers]
        label = f"{config.group(1)}<{', '.join(numbers)}>" if config else name
        dtype = "bf16" if "bfloat16" in name else "fp16" if "half" in name else ""
        if not path:  # (--tile: a kernel whose first block runs inside its key loop has no such path)
            print(f"{dtype} {label}: no path found")
            continue
        print(f"{dtype} {label}: {len(path)} instructions "
              f"(FP {fp}, HGMMA {hgmma}, other {len(path) - fp - hgmma})")
        if "--list" in sys.argv:
            print("\n".join(f"  {a:05x} {i}" for a, i in path))


if __name__ == "__main__":
    main()
