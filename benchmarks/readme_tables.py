"""Print the README's performance tables (markdown) from a bench_gelu.py results JSON.

    python benchmarks/readme_tables.py benchmarks/results/gelu.json
"""

import json
import sys
from pathlib import Path


def main(path: str) -> None:
    payload = json.loads(Path(path).read_text())
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
        if row["section"] == "add" and row["n"] >= 2**20:
            ours = row["flashext"]["gbps"]
            print(f"| {row['dtype']} | 2^{row['n'].bit_length() - 1} | {ours:.0f} | {ours / ceiling:.2f} | "
                  f"{ours / row['copy']['gbps']:.2f} | {speedup(row, 'triton_twin')} | {speedup(row, 'seed_triton')} | "
                  f"{speedup(row, 'eager')} | {speedup(row, 'torch_compile')} |")

    print("\n**backward, grad · gelu′(x + y)** — flashext and the twin read grad, x, y and write one tensor (4 tensors); "
          "eager `aten.gelu_backward` reads grad and the z = x + y that autograd saved (3 tensors)\n")
    print("| dtype | n | flashext GB/s | of ceiling | of same-bytes copy | vs Triton twin | vs eager (time) |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        if row["section"] == "add_bwd" and row["n"] >= 2**20:
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
