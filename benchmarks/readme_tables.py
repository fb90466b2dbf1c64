"""Print the README's performance tables (markdown) from a bench_gelu.py or bench_attention.py
results JSON.

    python benchmarks/readme_tables.py benchmarks/results/gelu.json
    python benchmarks/readme_tables.py benchmarks/results/attention.json
"""

import json
import statistics
import sys
from pathlib import Path


def attention_tables(payload) -> None:
    meta, rows = payload["meta"], payload["rows"]
    print(f"{meta['gpu']}, torch {meta['torch']}, Triton {meta['triton']}, commit `{meta['commit'][:10]}`, "
          f"{meta['date'][:10]}. Forward TFLOP/s = 4·B·H·S²·D (halved when causal) / time; B·S = 16384, "
          "H = 2048 / D; ratios are time(anchor) / time(flashext).\n")
    fwd = [r for r in rows if r["section"] == "fwd"]
    anchors = ["sdpa_flash", "sdpa_cudnn", "flex_attention", "triton_twin", "sdpa_mem_efficient"]

    def ratio(row, name):
        cell = row.get(name, {})
        return cell["ms"] / row["flashext"]["ms"] if "ms" in cell else None

    print("| head dim | vs " + " | vs ".join(anchors) + " |")
    print("|---|" + "---|" * len(anchors))
    for head_dim in sorted({r["head_dim"] for r in fwd}):
        cells = []
        for name in anchors:
            values = [x for x in (ratio(r, name) for r in fwd if r["head_dim"] == head_dim) if x is not None]
            cells.append(f"{min(values):.2f}× / {statistics.median(values):.2f}×" if values else "n/a")
        print(f"| {head_dim} | " + " | ".join(cells) + " |")
    print("\n(worst / median over fp16 and bf16, causal and not, S = 512 … 16384)\n")
    print("| dtype | D | mask | S | flashext TFLOP/s | SDPA flash | cuDNN | FlexAttention | Triton twin |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in fwd:
        cells = [f"{r[n]['tflops']:.0f}" if "tflops" in r.get(n, {}) else "n/a"
                 for n in ("sdpa_flash", "sdpa_cudnn", "flex_attention", "triton_twin")]
        print(f"| {r['dtype']} | {r['head_dim']} | {'causal' if r['causal'] else 'full'} | {r['seqlen']} | "
              f"{r['flashext']['tflops']:.0f} | " + " | ".join(cells) + " |")
    memory = [r for r in rows if r["section"] == "memory"]
    if memory:
        print("\n**Peak extra memory** of the forward (B = 1, H = 1, D = 128, fp16): what the call allocates, its output and lse included\n")
        print("| S | flashext | SDPA math |")
        print("|---|---|---|")
        for r in memory:
            print(f"| {r['seqlen']} | {r['flashext']['peak_extra_mib']:.0f} MiB | "
                  f"{r['sdpa_math'].get('peak_extra_mib', float('nan')):.0f} MiB |")
    softmax = [r for r in rows if r["section"] == "softmax"]
    if softmax:
        print("\n**online_softmax** — GB/s counting one read and one write\n")
        print("| dtype | rows × cols | flashext GB/s | torch.softmax GB/s | speedup |")
        print("|---|---|---|---|---|")
        for r in softmax:
            print(f"| {r['dtype']} | {r['rows']}×{r['cols']} | {r['flashext']['gbps']:.0f} | {r['torch']['gbps']:.0f} | "
                  f"{r['torch']['ms'] / r['flashext']['ms']:.2f}× |")


def main(path: str) -> None:
    payload = json.loads(Path(path).read_text())
    if any(r["section"] == "fwd" for r in payload["rows"]):
        attention_tables(payload)
        return
    meta = payload["meta"]
    ceiling = max(payload["ceiling_copy_gbps"], payload.get("ceiling_copy_gbps_end", 0))
    rows = payload["rows"]
    print(f"{meta['gpu']}, torch {meta['torch']}, Triton {meta['triton']}, commit `{meta['commit'][:10]}`, "
          f"{meta['date'][:10]}; copy ceiling {ceiling:.0f} GB/s (2 GiB device-to-device copy).\n")

    def speedup(row, name):
        return f"{row[name]['ms'] / row['flashext']['ms']:.2f}×" if name in row else ""

    print("**gelu(x + y)** — GB/s counting x, y and the output; ratios are time(anchor) / time(flashext)\n")
    print("| dtype | n | flashext GB/s | of ceiling | of same-bytes copy | vs Triton twin | vs seed Triton | vs eager | vs torch.compile |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        if row["section"] == "add":
            ours = row["flashext"]["gbps"]
            print(f"| {row['dtype']} | 2^{row['n'].bit_length() - 1} | {ours:.0f} | {ours / ceiling:.2f} | "
                  f"{ours / row['copy']['gbps']:.2f} | {speedup(row, 'triton_twin')} | {speedup(row, 'seed_triton')} | "
                  f"{speedup(row, 'eager')} | {speedup(row, 'torch_compile')} |")

    print("\n**backward, grad · gelu′(x + y)** — flashext and the twin read grad, x, y and write one tensor (4 tensors); "
          "eager `aten.gelu_backward` reads grad and the z = x + y that autograd saved (3 tensors)\n")
    print("| dtype | n | flashext GB/s | of ceiling | of same-bytes copy | vs Triton twin | vs eager (time) |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        if row["section"] == "add_bwd":
            ours = row["flashext"]["gbps"]
            print(f"| {row['dtype']} | 2^{row['n'].bit_length() - 1} | {ours:.0f} | {ours / ceiling:.2f} | "
                  f"{ours / row['copy']['gbps']:.2f} | {speedup(row, 'triton_twin')} | {speedup(row, 'eager')} |")

    print("\n**gelu(x + bias)** (tokens × hidden) — forward: x and the output; backward: grad, x, grad_x "
          "(eager backward: `gelu_backward` from the saved x + b, then `.sum(0)`)\n")
    print("| pass | dtype | shape | flashext GB/s | of ceiling | of same-bytes copy | vs Triton twin | vs eager | vs torch.compile |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        if row["section"] in ("bias", "bias_bwd"):
            ours = row["flashext"]["gbps"]
            print(f"| {'fwd' if row['section'] == 'bias' else 'bwd'} | {row['dtype']} | {row['rows']}×{row['cols']} | "
                  f"{ours:.0f} | {ours / ceiling:.2f} | {ours / row['copy']['gbps']:.2f} | {speedup(row, 'triton_twin')} | "
                  f"{speedup(row, 'eager')} | {speedup(row, 'torch_compile')} |")

    for row in rows:
        if row["section"] == "graph":
            print(f"\n**Launch overhead**: {row['layers']} × (Linear {row['width']}→{row['width']} + GeLU) on a "
                  f"{row['batch']}×{row['width']} fp16 input\n")
            print("| | eager | CUDA graph replay | speedup |")
            print("|---|---|---|---|")
            for name, label in (("torch", "`F.gelu(F.linear(h, W, b))`"), ("flashext", "`flashext.bias_gelu(h @ W.T, b)`")):
                cell = row[name]
                print(f"| {label} | {cell['eager_us']:.0f} µs | {cell['graph_us']:.0f} µs | {cell['speedup']:.1f}× |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent / "results" / "gelu.json"))
