"""Decode attention over KV caches against its anchors, same process, same inputs (ANCHORS.md).

    python benchmarks/bench_decode.py [--quick] [--only decode,paged]

decode  one query token, GQA 32 query / 8 KV heads, D = 128, fp16 and bf16, batch × KV length
        1 × 32K, 32 × 4K, 48 × 8K, 64 × 8K, 128 × 2K, 8 × 128K: GB/s of K + V read (B · S · Hkv · D ·
        2 tensors · 2 bytes) for flashext.flash_attention_with_kvcache (dense cache, num_splits
        chosen by the op; flashext_split1: one split, to judge that choice), SDPA's cuDNN and flash
        backends and the naive math path (each on (B, H, 1, D) queries and (B, Hkv, S, D) caches
        with enable_gqa; the math path only where B · S <= 2^18, as it materialises the scores and
        repeats K and V per query head: not at 48 × 8K, 64 × 8K and 8 × 128K), and a read-only anchor: one pass that reads the same K and V bytes (a
        sum), the ceiling for this traffic. FLASHEXT_BENCH_DECODE_SPLITS="33,64" adds a column
        flashext_split<N> per split count (the heuristic's alternatives, for the notes).
        FLASHEXT_BENCH_DECODE_LENGTHS=ragged: each sequence holds a random length in [1, KV
        length] (the same draw in every run), GB/s over the bytes those lengths hold, and only
        flashext's columns (the anchors read whole caches); for A/Bs of the kernels themselves
        (`gpu.sh ab` with FLASHEXT_AB_ANCHOR=flashext_split1).
paged   flashext on the same caches as shuffled pages of 1, 16, 64 and 256 tokens against its
        dense cache, same shapes. FLASHEXT_BENCH_PAGED_SPLITS="4,32" adds per split count the dense
        cache (flashext_split<N>) and every page size (flashext_split<N>_page<P>) at that count.
Every implementation is first checked against flashext.reference.attention_with_kvcache on the
first two sequences; rounds in a balanced order, median round. Writes decode.json and decode.png to
$OUT (or benchmarks/results).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import flashext  # noqa: E402
from benchmarks.common import bench_rounds, output_dir, parse_args, run_metadata, write_json  # noqa: E402
from flashext import reference as ref  # noqa: E402
from flashext.testing import judge  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
HEADS, HEADS_KV, HEAD_DIM = 32, 8, 128
SHAPES = [(1, 32768), (32, 4096), (48, 8192), (64, 8192), (128, 2048), (8, 131072)]


def sdpa_backend(backend):
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return run


def check(name, out, q, k_cache, v_cache, lens, rows=2):
    """out (B, 1, H, D) against the reference on the first `rows` sequences."""
    want = ref.attention_with_kvcache(q[:rows], k_cache[:rows], v_cache[:rows], lens[:rows])
    base = ref.attention_with_kvcache(q[:rows], k_cache[:rows], v_cache[:rows], lens[:rows], compute_dtype=q.dtype)
    return judge(name, out[:rows], want, base)


def paged_copy(cache, page_size, generator):
    batch, capacity = cache.shape[:2]
    pages_per_seq = -(-capacity // page_size)
    table = torch.randperm(batch * pages_per_seq, generator=generator).view(batch, pages_per_seq).int().cuda()
    pages = torch.empty(batch * pages_per_seq, page_size, *cache.shape[2:], dtype=cache.dtype, device="cuda")
    t = torch.arange(capacity, device="cuda")
    for b in range(batch):
        pages[table[b, t // page_size].long(), t % page_size] = cache[b]
    return pages, table


def env_splits(name: str) -> list[int]:
    """The split counts a comma-separated environment variable names (none where unset)."""
    return [int(x) for x in os.environ.get(name, "").split(",") if x.strip()]


def section(rows, quick: bool, paged: bool):
    from torch.nn.attention import SDPBackend

    shapes = SHAPES[:2] if quick else SHAPES
    for dname, dtype in DTYPES.items():
        for batch, seqlen in shapes:
            q = torch.randn(batch, 1, HEADS, HEAD_DIM, device="cuda").to(dtype)
            k_cache = torch.randn(batch, seqlen, HEADS_KV, HEAD_DIM, device="cuda").to(dtype)
            v_cache = torch.randn(batch, seqlen, HEADS_KV, HEAD_DIM, device="cuda").to(dtype)
            lens = torch.full((batch,), seqlen, dtype=torch.int32, device="cuda")
            ragged = not paged and os.environ.get("FLASHEXT_BENCH_DECODE_LENGTHS", "") == "ragged"
            if ragged:
                g = torch.Generator().manual_seed(batch * seqlen)
                lens = torch.randint(1, seqlen + 1, (batch,), generator=g, dtype=torch.int32).cuda()
            nbytes = 2 * int(lens.sum()) * HEADS_KV * HEAD_DIM * k_cache.element_size()
            row = {"section": "paged" if paged else "decode", "dtype": dname, "batch": batch, "seqlen": seqlen,
                   "bytes": nbytes}
            fns = {"flashext": lambda: flashext.flash_attention_with_kvcache(q, k_cache, v_cache, lens)}
            if paged:
                g = torch.Generator().manual_seed(seqlen)
                splits = env_splits("FLASHEXT_BENCH_PAGED_SPLITS")
                for n in splits:
                    fns[f"flashext_split{n}"] = lambda n=n: flashext.flash_attention_with_kvcache(
                        q, k_cache, v_cache, lens, num_splits=n)
                for page_size in (1, 16, 64, 256):
                    if page_size == 1 and batch * seqlen > 2**20:
                        continue  # the page-table build alone would dominate the run
                    pk, table = paged_copy(k_cache, page_size, g)
                    pv = torch.empty_like(pk)
                    t = torch.arange(seqlen, device="cuda")
                    for b in range(batch):
                        pv[table[b, t // page_size].long(), t % page_size] = v_cache[b]
                    fns[f"flashext_page{page_size}"] = (
                        lambda pk=pk, pv=pv, table=table: flashext.flash_attention_with_kvcache(
                            q, pk, pv, lens, block_table=table))
                    for n in splits:
                        fns[f"flashext_split{n}_page{page_size}"] = (
                            lambda pk=pk, pv=pv, table=table, n=n: flashext.flash_attention_with_kvcache(
                                q, pk, pv, lens, block_table=table, num_splits=n))
            else:
                # the split heuristic against no split (num_splits=1) on the same call
                fns["flashext_split1"] = lambda: flashext.flash_attention_with_kvcache(q, k_cache, v_cache, lens,
                                                                                       num_splits=1)
                for n in env_splits("FLASHEXT_BENCH_DECODE_SPLITS"):
                    fns[f"flashext_split{n}"] = lambda n=n: flashext.flash_attention_with_kvcache(q, k_cache, v_cache,
                                                                                                  lens, num_splits=n)
            anchors = not paged and not ragged  # (SDPA and the read anchor take no lengths: whole caches)
            if anchors:
                qt, kt, vt = q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2)
                for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                                      ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
                    fns[name] = lambda backend=backend: sdpa_backend(backend)(qt, kt, vt).transpose(1, 2)
                if batch * seqlen <= 2**18:  # the math path materialises (B, H, 1, S) scores and repeats K, V
                    fns["sdpa_math"] = lambda: sdpa_backend(SDPBackend.MATH)(qt, kt, vt).transpose(1, 2)
            timed = {}
            for name, fn in fns.items():
                try:
                    verdict = check(name, fn(), q, k_cache, v_cache, lens)
                    row[name] = {"valid": verdict.ok, "error": verdict.error}
                    timed[name] = fn
                except Exception as exc:  # an anchor that does not run here: say so, keep going
                    row[name] = {"error_message": f"{type(exc).__name__}: {str(exc)[:200]}"}
            if anchors:  # the read-only anchor: one pass over the same K and V bytes
                kv = torch.stack([k_cache, v_cache])
                timed["read_anchor"] = lambda kv=kv: kv.sum(dtype=torch.float32)
                row["read_anchor"] = {"valid": True}
            for name, (ms, times) in bench_rounds(timed).items():
                row[name].update(ms=ms, gbps=nbytes / ms / 1e6, rounds_ms=times)
            rows.append(row)
            cells = [f"{n} {c['gbps']:5.0f}" + ("" if c.get("valid", True) else "(INVALID)")
                     for n, c in row.items() if isinstance(c, dict) and "gbps" in c]
            print(f"{row['section']} {dname} {batch:3d} x {seqlen:6d} GB/s: " + "  ".join(cells), flush=True)
            del q, k_cache, v_cache, fns, timed
            torch.cuda.empty_cache()


def plot(payload, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), squeeze=False)
    for ax, section in zip(axes[0], ("decode", "paged")):
        rows = [r for r in payload["rows"] if r["section"] == section and r["dtype"] == "bf16"]
        labels = [f"{r['batch']}x{r['seqlen'] // 1024}K" for r in rows]
        names = sorted({n for r in rows for n, c in r.items() if isinstance(c, dict) and "gbps" in c})
        width = 0.8 / max(1, len(names))
        for i, name in enumerate(names):
            ax.bar([x + i * width for x in range(len(rows))], [r.get(name, {}).get("gbps", 0) for r in rows],
                   width=width, label=name)
        ax.set_xticks([x + 0.4 for x in range(len(rows))], labels)
        ax.set_ylabel("GB/s of K + V read")
        ax.set_title(f"{section}, bf16, GQA {HEADS}/{HEADS_KV}, D = {HEAD_DIM}")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"flashext decode on {payload['meta']['gpu']} (torch {payload['meta']['torch']}, "
                 f"commit {payload['meta']['commit'][:10]})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summarize(payload):
    print("\nsummary: flashext against each anchor (GB/s ratio, same inputs, same run)")
    for row in payload["rows"]:
        if "gbps" not in row.get("flashext", {}):
            continue
        parts = [f"{row['flashext']['gbps'] / c['gbps']:.2f}x {n}" if n != "read_anchor" else
                 f"{row['flashext']['gbps'] / c['gbps']:.2f} of {n}"
                 for n, c in row.items() if isinstance(c, dict) and n != "flashext" and "gbps" in c]
        print(f"  {row['section']} {row['dtype']} {row['batch']:3d} x {row['seqlen']:6d} "
              f"{row['flashext']['gbps']:5.0f} GB/s: " + ", ".join(parts))


def main():
    args = parse_args(__doc__, "decode,paged", "the first two shapes", plot, summarize)
    if args is None:
        return
    torch.manual_seed(0)
    payload = {"meta": run_metadata(), "rows": []}
    print(f"{payload['meta']['gpu']}, torch {payload['meta']['torch']}, GPU state {payload['meta']['gpu_state_start']}",
          flush=True)
    sections = set(args.only.split(","))
    if "decode" in sections:
        section(payload["rows"], args.quick, paged=False)
    if "paged" in sections:
        section(payload["rows"], args.quick, paged=True)
    path = write_json("decode.json", payload)
    plot(payload, output_dir() / "decode.png")
    print(f"wrote {path}")
    summarize(payload)


if __name__ == "__main__":
    main()
