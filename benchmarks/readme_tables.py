"""Print the performance tables (markdown) from a bench_gelu.py, bench_attention.py or
bench_decode.py (or bench_models.py) results JSON, or from the per-point medians of several runs that
benchmarks/attention_runs.py gathers (a *_runs.json, with its *_runs_sdpa_flash.json beside it where
there is one): every point (docs/performance.md), or with --summary one table per op family (the
README).

    python benchmarks/readme_tables.py benchmarks/results/gelu.json
    python benchmarks/readme_tables.py --summary benchmarks/results/attention.json
    python benchmarks/readme_tables.py --summary benchmarks/results/attention_train.json
    python benchmarks/readme_tables.py --summary benchmarks/results/decode.json
    python benchmarks/readme_tables.py benchmarks/results/attention_sparse.json
    python benchmarks/readme_tables.py benchmarks/results/models.json
    python benchmarks/readme_tables.py --summary benchmarks/results/attention_h100_runs.json
    python benchmarks/readme_tables.py benchmarks/results/decode_h100_runs.json
"""

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.compare_ab import key  # noqa: E402  (what names a grid point)


def commit_label(meta: dict) -> str:
    """The commit a results file names, in backticks (a hash cut to 10 characters, a "hash+patch" kept
    whole), and its commit_note in brackets where it has one."""
    commit = meta["commit"] if "+" in meta["commit"] else meta["commit"][:10]
    return f"`{commit}`" + (f" ({meta['commit_note']})" if meta.get("commit_note") else "")


def table(columns: list[str], lines) -> None:
    """A markdown table: the header row, its rule, then one row per list of cells in `lines`."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for cells in lines:
        print("| " + " | ".join(cells) + " |")


def attention_tables(payload, summary: bool = False) -> None:
    meta, rows = payload["meta"], payload["rows"]
    fwd = [r for r in rows if r["section"] == "fwd" and "ms" in r.get("flashext", {})]  # (an A/B may time others only)
    print(f"{meta['gpu']}, torch {meta['torch']}, Triton {meta['triton']}, commit {commit_label(meta)}, "
          f"{meta['date'][:10]}." + (" Forward TFLOP/s = 4·B·H·S²·D (halved when causal) / time; B·S = 16384, "
                                     "H = 2048 / D; ratios are time(anchor) / time(flashext).\n" if fwd else "\n"))
    anchors = [name for name in ("sdpa_flash", "sdpa_cudnn", "sdpa_default", "flex_attention", "triton_twin",
                                 "sdpa_mem_efficient", "flashext_fa2") if any(name in r for r in fwd)]  # the ones this run measured

    def ratio(row, name):
        cell = row.get(name, {})
        return cell["ms"] / row["flashext"]["ms"] if "ms" in cell else None

    def worst_median(head_dim):
        for name in anchors:
            values = [x for x in (ratio(r, name) for r in fwd if r["head_dim"] == head_dim) if x is not None]
            yield f"{min(values):.2f}× / {statistics.median(values):.2f}×" if values else "n/a"

    if fwd:
        table(["head dim"] + [f"vs {name}" for name in anchors],
              ([str(d), *worst_median(d)] for d in sorted({r["head_dim"] for r in fwd})))
        print("\n(worst / median over fp16 and bf16, causal and not, S = 512 … 16384)\n")
    if summary:
        softmax = [r for r in rows if r["section"] == "softmax"]
        if softmax:
            print("**online_softmax** against `torch.softmax` (GB/s counting one read and one write; rows of 4096 … "
                  "65536 columns)\n")
            table(["dtype", "flashext GB/s", "speedup, worst / median"],
                  ([dtype, f"{min(r['flashext']['gbps'] for r in group):.0f}-{max(r['flashext']['gbps'] for r in group):.0f}",
                    f"{min(r['torch']['ms'] / r['flashext']['ms'] for r in group):.2f}× / "
                    f"{statistics.median(r['torch']['ms'] / r['flashext']['ms'] for r in group):.2f}×"]
                   for dtype in sorted({r["dtype"] for r in softmax})
                   for group in [[r for r in softmax if r["dtype"] == dtype]]))
        return
    # (name, header, shown when the run did not time it): SDPA with no backend chosen, the Hopper
    # kernel alone and the FA2-design kernel alone only where the run timed them
    columns = [(name, header) for name, header, always in (
        ("sdpa_flash", "SDPA flash", True), ("sdpa_cudnn", "cuDNN", True), ("sdpa_default", "SDPA default", False),
        ("flex_attention", "FlexAttention", True), ("triton_twin", "Triton twin", True),
        ("flashext_sm90", "Hopper kernel", False), ("flashext_fa2", "FA2-design kernel", False))
        if always or any(name in r for r in fwd)]
    matmul = {r["dtype"]: r["tflops"] for r in rows if r["section"] == "matmul"}  # the run's matmul ceilings
    if matmul:
        print("Dense matmul (8192³ `a @ b`) in the same run: "
              + ", ".join(f"{d} {t:.0f} TFLOP/s" for d, t in matmul.items()) + ".\n")

    def of_matmul(r):  # flashext's fraction of its dtype's matmul ceiling, where the run measured one
        if not matmul:
            return []
        return [f"{r['flashext']['tflops'] / matmul[r['dtype']]:.2f}" if r["dtype"] in matmul else "n/a"]

    if fwd:
        table(["dtype", "D", "mask", "S", "flashext TFLOP/s"] + (["of matmul"] if matmul else [])
              + [header for _, header in columns],
              ([r["dtype"], str(r["head_dim"]), "causal" if r["causal"] else "full", str(r["seqlen"]),
                f"{r['flashext']['tflops']:.0f}", *of_matmul(r),
                *(f"{r[n]['tflops']:.0f}" if "tflops" in r.get(n, {}) else "n/a" for n, _ in columns)] for r in fwd))
    memory = [r for r in rows if r["section"] == "memory"]
    if memory:
        print("\n**Peak extra memory** of the forward (B = 1, H = 1, D = 128, fp16): what the call allocates, its output and lse included\n")
        table(["S", "flashext", "SDPA math"],
              ([str(r["seqlen"]), f"{r['flashext']['peak_extra_mib']:.0f} MiB",
                f"{r['sdpa_math'].get('peak_extra_mib', float('nan')):.0f} MiB"] for r in memory))
    softmax = [r for r in rows if r["section"] == "softmax"]
    if softmax:
        print("\n**online_softmax** — GB/s counting one read and one write\n")
        table(["dtype", "rows × cols", "flashext GB/s", "torch.softmax GB/s", "speedup"],
              ([r["dtype"], f"{r['rows']}×{r['cols']}", f"{r['flashext']['gbps']:.0f}", f"{r['torch']['gbps']:.0f}",
                f"{r['torch']['ms'] / r['flashext']['ms']:.2f}×"] for r in softmax))


def train_tables(payload, summary: bool = False) -> None:
    meta, rows = payload["meta"], [r for r in payload["rows"] if r["section"] == "train"]
    print(f"{meta['gpu']}, torch {meta['torch']}, commit {commit_label(meta)}, {meta['date'][:10]}. "
          "TFLOP/s: forward 4·B·H·S²·D, backward 2.5× that (halved when causal); B·S = 16384, H = 2048 / D; "
          "ratios are time(anchor) / time(flashext).\n")
    anchors = [name for name in ("sdpa_flash", "sdpa_cudnn", "sdpa_default", "triton_twin")
               if any(name in r for r in rows)]  # the ones this run measured

    # ours: the dispatch (flashext) and, where the run timed it, the portable path alone (flashext_fa2:
    # the FA2-design kernels forward and backward, what GPUs other than Hopper run)
    ours = [(name, label) for name, label in (("flashext", ""), ("flashext_fa2", " (FA2-design kernels)"))
            if any("fwd_bwd_ms" in r.get(name, {}) for r in rows)]

    def worst_median(head_dim, label, mine):
        for name in anchors:
            values = [r[name][f"{label}_ms"] / r[mine][f"{label}_ms"] for r in rows
                      if r["head_dim"] == head_dim and f"{label}_ms" in r.get(name, {}) and f"{label}_ms" in r.get(mine, {})]
            yield f"{min(values):.2f}× / {statistics.median(values):.2f}×" if values else "n/a"

    def tflops(head_dim, label, mine):
        values = [r[mine][f"{label}_tflops"] for r in rows if r["head_dim"] == head_dim and f"{label}_tflops" in r.get(mine, {})]
        return f"{min(values):.0f}-{max(values):.0f}" if values else "n/a"

    head_dims = sorted({r["head_dim"] for r in rows})
    table(["pass", "head dim", "flashext TFLOP/s"] + [f"vs {name}" for name in anchors],
          ([label_name + suffix, str(d), tflops(d, label, mine), *worst_median(d, label, mine)]
           for mine, suffix in ours
           for label, label_name in (("fwd_bwd", "forward + backward"), ("bwd", "backward alone"))
           for d in head_dims))
    print("\n(worst / median over fp16 and bf16, causal and not, S = 512 … 16384)")
    if summary:
        return
    print()
    table(["dtype", "D", "mask", "S", "flashext fwd+bwd / bwd TFLOP/s", "SDPA flash", "cuDNN", "SDPA default"],
          ([r["dtype"], str(r["head_dim"]), "causal" if r["causal"] else "full", str(r["seqlen"]),
            f"{r['flashext']['fwd_bwd_tflops']:.0f} / {r['flashext']['bwd_tflops']:.0f}",
            *(f"{r[n]['fwd_bwd_tflops']:.0f} / {r[n]['bwd_tflops']:.0f}" if "bwd_tflops" in r.get(n, {}) else "n/a"
              for n in ("sdpa_flash", "sdpa_cudnn", "sdpa_default"))] for r in rows))


def decode_tables(payload) -> None:
    meta, rows = payload["meta"], payload["rows"]
    print(f"{meta['gpu']}, torch {meta['torch']}, commit {commit_label(meta)}, {meta['date'][:10]}. One query "
          "token, 32 query / 8 KV heads, D = 128; GB/s of K and V read; ratios are time(anchor) / time(flashext); "
          "the read anchor is one pass that only reads the same bytes.\n")
    decode = [r for r in rows if r["section"] == "decode"]
    if decode:  # (a run of the paged section alone has none)
        anchors = ["sdpa_flash", "sdpa_cudnn", "sdpa_math"] + (["flashext_split1"] if any(
            "flashext_split1" in r for r in decode) else [])
        table(["dtype", "B × KV length", "flashext GB/s", "of read anchor", "vs SDPA flash", "vs cuDNN",
               "vs SDPA math"] + (["vs one split"] if "flashext_split1" in anchors else []),
              ([r["dtype"], f"{r['batch']} × {r['seqlen']}", f"{r['flashext']['gbps']:.0f}",
                f"{r['flashext']['gbps'] / r['read_anchor']['gbps']:.2f}",
                *(f"{r[n]['ms'] / r['flashext']['ms']:.2f}×" if "ms" in r.get(n, {}) else "n/a" for n in anchors)]
               for r in decode))
    paged = [r for r in rows if r["section"] == "paged"]
    if paged:
        sizes = sorted(int(n[len("flashext_page"):]) for n in paged[0] if n.startswith("flashext_page"))
        print("\n**Paged KV** (shuffled pages): GB/s, against the same cache dense\n")
        table(["dtype", "B × KV length", "dense"] + [f"page {size}" for size in sizes],
              ([r["dtype"], f"{r['batch']} × {r['seqlen']}", f"{r['flashext']['gbps']:.0f}",
                *(f"{r[f'flashext_page{size}']['gbps']:.0f}" for size in sizes)] for r in paged))


def sparse_table(payload) -> None:
    meta, rows = payload["meta"], [r for r in payload["rows"] if r["section"] == "sparse"]
    print(f"{meta['gpu']}, torch {meta['torch']}, commit {commit_label(meta)}, {meta['date'][:10]}. bf16, "
          "D = 128, 16 heads, B · S = 16384, random block masks; speed-up = time(dense flash_attention) / "
          "time(block_sparse_attention), same inputs, same run.\n")
    table(["S", "block", "density (measured)", "block-sparse ms", "dense ms", "speed-up"],
          ([f"{r['seqlen']}", f"{r['block_size'][0]}×{r['block_size'][1]}", f"{r['measured_density']:.2f}",
            f"{r['flashext']['ms']:.3f}", f"{r['dense']['ms']:.3f}", f"{r['dense']['ms'] / r['flashext']['ms']:.2f}×"]
           for r in rows))


def models_table(payload) -> None:
    meta, rows = payload["meta"], payload["rows"]
    print(f"{meta['gpu']}, torch {meta['torch']}, commit {commit_label(meta)}, {meta['date'][:10]}. A "
          "Llama-3.2-1B-shaped LlamaForCausalLM (random weights, bf16); ms, and time(\"sdpa\") / "
          "time(flashext) in the same run.\n")
    dense = [r for r in rows if r["section"] != "generate"]
    names = [n for n in ("flashext", "flashext_padding_free", "sdpa", "eager", "direct") if any(n in r for r in dense)]
    ours = [n for n in ("flashext", "flashext_padding_free") if n in names]
    label = {"flashext_padding_free": '"flashext" + padding_free'}

    def ms(row, name, what):
        return f"{row[name][f'{what}_ms']:.1f}" if f"{what}_ms" in row.get(name, {}) else "n/a"

    def ratio(row, name, what):
        key = f"{what}_ms"
        return f"{row['sdpa'][key] / row[name][key]:.2f}×" if key in row.get(name, {}) else "n/a"

    table(["batch", "what"] + [label.get(n, f'"{n}"') for n in names] + [f"sdpa / {label.get(n, n)}" for n in ours],
          ([f"{r['batch']} × {r['seqlen']}, {r['section']} ({r['real_tokens']} real tokens)", what,
            *(ms(r, n, what) for n in names), *(ratio(r, n, what) for n in ours)]
           for r in dense for what in ("forward", "train")))
    generate = [r for r in rows if r["section"] == "generate"]
    if generate:
        print("\n`generate()`, greedy, tokens/s\n")
        table(["batch", "prompt + new", '"flashext"', '"sdpa"', "ratio"],
              ([str(r["batch"]), f"{r['prompt']} + {r['new_tokens']}", f"{r['flashext']['tokens_per_s']:.0f}",
                f"{r['sdpa']['tokens_per_s']:.0f}", f"{r['flashext']['tokens_per_s'] / r['sdpa']['tokens_per_s']:.2f}×"]
               for r in generate))


def gelu_summary(payload, ceiling: float) -> None:
    """One row per pass and dtype at its largest size: of the copy ceiling, and time ratios."""
    rows = payload["rows"]
    names = {"add": "gelu(x + y)", "add_bwd": "gelu(x + y) backward", "bias": "gelu(x + bias)",
             "bias_bwd": "gelu(x + bias) backward"}

    def cell(row, name):
        return f"{row[name]['ms'] / row['flashext']['ms']:.2f}×" if name in row else "n/a"

    def lines():
        for section, label in names.items():
            for dtype in ("fp32", "fp16", "bf16"):
                group = [r for r in rows if r["section"] == section and r["dtype"] == dtype]
                for row in sorted(group, key=lambda r: -r["bytes"])[:1] + sorted(group, key=lambda r: r["bytes"])[:1]:
                    shape = f"2^{row['n'].bit_length() - 1}" if "n" in row else f"{row['rows']}×{row['cols']}"
                    yield [label, dtype, shape, f"{row['flashext']['gbps'] / ceiling:.2f}",
                           f"{row['flashext']['gbps'] / row['copy']['gbps']:.2f}",
                           *(cell(row, a) for a in ("eager", "torch_compile", "triton_twin"))]

    table(["op", "dtype", "size", "of copy ceiling", "of same-bytes copy", "vs eager", "vs torch.compile",
           "vs Triton twin"], lines())
    print("\n(the largest and the smallest size of each; every size is in docs/performance.md)")


ANCHOR_NAMES = {"sdpa_cudnn": "cuDNN", "sdpa_flash": "SDPA flash"}


def runs_tables(path: Path, summary: bool = False) -> None:
    """A *_runs.json (attention_runs.py): per point, flashext's ratio to the file's anchor in each run
    and the median of the runs, and flashext's median rate; the anchors of sibling files of the same
    section (`<stem>_<anchor>.json`, e.g. attention_runs_sdpa_flash.json) as further median columns.
    With `summary`, per head dim the worst / median of the medians at S >= 1024 and under it
    (attention), or per shape the fp16 / bf16 medians (decode)."""
    payload = json.loads(path.read_text())
    section, anchor, points, runs = payload["section"], payload["anchor"], payload["points"], payload["runs"]
    others = {}
    for sibling in sorted(path.parent.glob(f"{path.stem}_*.json")):
        other = json.loads(sibling.read_text())
        if other.get("section") == section and "points" in other and other.get("anchor") != anchor:
            others[other["anchor"]] = {key(p): p for p in other["points"]}
    commits = sorted({commit_label(r) for r in runs})
    dates = sorted({r["date"][:10] for r in runs})
    print(f"{runs[0]['gpu']}, torch {runs[0]['torch']}, commit {', '.join(commits)}, "
          f"{', '.join(dates)}: {len(runs)} runs; ratios are time(anchor) / time(flashext), per point the "
          f"median of the runs.\n")
    metric = {"fwd": "ms", "train": "fwd_bwd_ms", "decode": "ms"}[section]
    rate, rate_unit = {"fwd": ("tflops", "TFLOP/s"), "train": ("fwd_bwd_tflops", "fwd+bwd TFLOP/s"),
                       "decode": ("gbps", "GB/s")}[section]
    names = [anchor] + list(others)
    label = {n: ANCHOR_NAMES.get(n, n) for n in names}

    def median(point, name):  # the point's median ratio to `name`, None where that file lacks it
        found = point if name == anchor else others[name].get(key(point))
        return found[metric]["median"] if found else None

    def ratio(value, digits):
        return "n/a" if value is None else f"{value:.{digits}f}×"

    # flashext's own rate, a column only where the runs kept it (runs gathered before they did: none)
    def ours(point):
        return point.get("flashext", {}).get(rate)

    rate_column = [f"flashext {rate_unit}"] if any(ours(p) is not None for p in points) else []

    def rate_cell(group):
        return [rate_range(ours(p) for p in group)] if rate_column else []

    def runs_cell(point):
        return " / ".join(f"{v:.3f}" for v in point[metric]["runs"])

    if section == "decode":
        if summary:
            def shape_cells(b, s):
                group = [p for p in points if (p["batch"], p["seqlen"]) == (b, s)]
                by_dtype = {p["dtype"]: p for p in group}
                return ([f"{b} × {s}"] + rate_cell(group)
                        + [" / ".join(ratio(median(by_dtype[d], n), 3) if d in by_dtype else "n/a"
                                      for d in ("fp16", "bf16")) for n in names])

            table(["B × KV length"] + rate_column + [f"vs {label[n]}, fp16 / bf16" for n in names],
                  (shape_cells(b, s) for b, s in sorted({(p["batch"], p["seqlen"]) for p in points})))
        else:
            table(["dtype", "B × KV length"] + rate_column + [f"vs {label[anchor]} (runs)"]
                  + [f"vs {label[n]}" for n in names],
                  ([p["dtype"], f"{p['batch']} × {p['seqlen']}"] + rate_cell([p]) + [runs_cell(p)]
                   + [ratio(median(p, n), 3) for n in names] for p in points))
        return
    if summary:
        def cell(values):
            values = [v for v in values if v is not None]
            return f"{min(values):.2f}× / {statistics.median(values):.2f}×" if values else "n/a"

        def head_dim_cells(d):
            group = [p for p in points if p["head_dim"] == d]
            return ([str(d)] + rate_cell(group)
                    + [cell(median(p, n) for p in group if (p["seqlen"] >= 1024) == long)
                       for n in names for long in (True, False)])

        table(["head dim"] + rate_column
              + [f"vs {label[n]}, S {where}" for n in names for where in ("≥ 1024", "< 1024")],
              (head_dim_cells(d) for d in sorted({p["head_dim"] for p in points})))
        bar = payload["bar"][metric]
        worst = bar["worst_point"]
        print(f"\n(worst / median of the per-point medians over fp16 and bf16, causal and not; over the "
              f"{bar['points']} points with S ≥ {bar['min_seqlen']} at D = {', '.join(map(str, bar['head_dims']))}: "
              f"median {bar['median']:.3f}×, worst {bar['worst']:.3f}× {label[anchor]}, "
              f"{worst['dtype']} D = {worst['head_dim']} {'causal' if worst['causal'] else 'full'} S = {worst['seqlen']})")
        return
    table(["dtype", "D", "mask", "S"] + rate_column + [f"vs {label[anchor]} (runs)"] + [f"vs {label[n]}" for n in names],
          ([p["dtype"], str(p["head_dim"]), "causal" if p["causal"] else "full", str(p["seqlen"])] + rate_cell([p])
           + [runs_cell(p)] + [ratio(median(p, n), 3) for n in names] for p in points))


def rate_range(values) -> str:
    """min-max of the rates a runs file kept ("n/a" where its runs predate them)."""
    values = [f"{v:.0f}" for v in sorted(v for v in values if v is not None)]
    return "n/a" if not values else values[0] if values[0] == values[-1] else f"{values[0]}-{values[-1]}"


def main(path: str, summary: bool = False) -> None:
    payload = json.loads(Path(path).read_text())
    if "points" in payload and "runs" in payload:
        runs_tables(Path(path), summary)
        return
    if "rows" not in payload:
        sys.exit(f"{path}: not a benchmark results file (rows) nor attention_runs.py's runs file (points, runs)")
    sections = {r["section"] for r in payload["rows"]}
    if sections & {"fwd", "memory", "softmax"}:
        attention_tables(payload, summary)
        return
    if "train" in sections:
        train_tables(payload, summary)
        return
    if sections & {"decode", "paged"}:
        decode_tables(payload)
        return
    if sections == {"sparse"}:
        sparse_table(payload)
        return
    if sections & {"padded", "unpadded", "generate"}:
        models_table(payload)
        return
    meta = payload["meta"]
    ceiling = max(payload["ceiling_copy_gbps"], payload.get("ceiling_copy_gbps_end", 0))
    rows = payload["rows"]
    print(f"{meta['gpu']}, torch {meta['torch']}, Triton {meta['triton']}, commit {commit_label(meta)}, "
          f"{meta['date'][:10]}; copy ceiling {ceiling:.0f} GB/s (2 GiB device-to-device copy).\n")
    if summary:
        gelu_summary(payload, ceiling)
        return

    def speedup(row, name):
        return f"{row[name]['ms'] / row['flashext']['ms']:.2f}×" if name in row else ""

    def bandwidth(row):  # flashext GB/s, of the ceiling, of a same-bytes copy
        ours = row["flashext"]["gbps"]
        return [f"{ours:.0f}", f"{ours / ceiling:.2f}", f"{ours / row['copy']['gbps']:.2f}"]

    def size(row):
        return f"2^{row['n'].bit_length() - 1}"

    print("**gelu(x + y)** — GB/s counting x, y and the output; ratios are time(anchor) / time(flashext)\n")
    table(["dtype", "n", "flashext GB/s", "of ceiling", "of same-bytes copy", "vs Triton twin", "vs seed Triton",
           "vs eager", "vs torch.compile"],
          ([row["dtype"], size(row), *bandwidth(row),
            *(speedup(row, a) for a in ("triton_twin", "seed_triton", "eager", "torch_compile"))]
           for row in rows if row["section"] == "add"))

    print("\n**backward, grad · gelu′(x + y)** — flashext and the twin read grad, x, y and write one tensor (4 tensors); "
          "eager `aten.gelu_backward` reads grad and the z = x + y that autograd saved (3 tensors)\n")
    table(["dtype", "n", "flashext GB/s", "of ceiling", "of same-bytes copy", "vs Triton twin", "vs eager (time)"],
          ([row["dtype"], size(row), *bandwidth(row), speedup(row, "triton_twin"), speedup(row, "eager")]
           for row in rows if row["section"] == "add_bwd"))

    def of_same_mix(row):  # against a zero-math torch op with the pass's mix of reads and writes, the same bytes
        anchor = "add_2r1w" if "add_2r1w" in row else "neg_1r1w" if "neg_1r1w" in row else None
        return f"{row['flashext']['gbps'] / row[anchor]['gbps']:.2f}" if anchor else ""

    print("\n**gelu(x + bias)** (tokens × hidden) — forward: x and the output; backward: grad, x, grad_x "
          "(eager backward: `gelu_backward` from the saved x + b, then `.sum(0)`); \"of same-mix torch op\": against "
          "a torch kernel without math that reads and writes as the pass does, the same bytes: `torch.neg(x)` "
          "(one read per write) for the forward, `torch.add(grad, x)` (two) for the backward\n")
    table(["pass", "dtype", "shape", "flashext GB/s", "of ceiling", "of same-bytes copy", "of same-mix torch op",
           "vs Triton twin", "vs eager", "vs torch.compile"],
          (["fwd" if row["section"] == "bias" else "bwd", row["dtype"], f"{row['rows']}×{row['cols']}", *bandwidth(row),
            of_same_mix(row), *(speedup(row, a) for a in ("triton_twin", "eager", "torch_compile"))]
           for row in rows if row["section"] in ("bias", "bias_bwd")))

    for row in rows:
        if row["section"] == "graph":
            print(f"\n**Launch overhead**: {row['layers']} × (Linear {row['width']}→{row['width']} + GeLU) on a "
                  f"{row['batch']}×{row['width']} fp16 input\n")
            table(["", "eager", "CUDA graph replay", "speedup"],
                  ([label, f"{row[name]['eager_us']:.0f} µs", f"{row[name]['graph_us']:.0f} µs",
                    f"{row[name]['speedup']:.1f}×"]
                   for name, label in (("torch", "`F.gelu(F.linear(h, W, b))`"),
                                       ("flashext", "`flashext.bias_gelu(h @ W.T, b)`"))))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--summary"]
    main(args[0] if args else str(Path(__file__).parent / "results" / "gelu.json"), "--summary" in sys.argv[1:])
