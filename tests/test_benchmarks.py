"""Benchmark helpers that decide what gets reported (CPU only)."""

from collections import Counter

import pytest

from benchmarks.common import balanced_orders


@pytest.mark.parametrize("n", range(1, 9))
def test_balanced_orders(n):
    """Each round times every implementation once; each implementation directly follows every other
    one equally often, and opens a round equally often."""
    orders = balanced_orders(n)
    assert all(sorted(order) == list(range(n)) for order in orders)
    follows = Counter((order[i - 1], order[i]) for order in orders for i in range(1, n))
    assert len(follows) == n * (n - 1) and len(set(follows.values())) <= 1
    assert len(set(Counter(order[0] for order in orders).values())) == 1


def test_ncu_source_opcode_mix():
    """The per-opcode mix of an Nsight Compute SASS export: predicates dropped, the first modifier
    kept, executed counts and samples summed per opcode, most executed first."""
    from benchmarks.ncu_source import kernels, opcode, opcode_mix

    assert opcode("@!P0 MUFU.EX2 R1, R2 ;") == "MUFU.EX2"
    assert opcode("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;") == "HGMMA.64x128x16"
    assert opcode("EXIT ;") == "EXIT" and opcode("") == ""
    export = ('"Kernel Name","k1"\n'
              '"Address","Source","Instructions Executed","Warp Stall Sampling (All Samples)"\n'
              '"0","FFMA R1, R2, R3, R4 ;","100","5"\n'
              '"10","@P1 FFMA R1, R2, R3, R4 ;","50","1"\n'
              '"20","MUFU.EX2 R5, R1 ;","120","30"\n'
              '"30","BRA 0x0 ;","0","0"\n')
    (name, rows), = kernels(export)
    assert name == "k1" and len(rows) == 4
    assert opcode_mix(rows) == [("FFMA", 150.0, 6.0), ("MUFU.EX2", 120.0, 30.0)]


def test_train_table_reports_the_portable_path(capsys):
    """The training table gives the dispatch's rows and, where the run timed the FA2-design kernels
    alone (flashext_fa2), the portable path's rows, each as worst / median time(anchor) / time(ours)."""
    from benchmarks.readme_tables import train_tables

    def cell(ms):
        return {"fwd_bwd_ms": ms, "fwd_bwd_tflops": 100.0 / ms, "bwd_ms": ms / 2, "bwd_tflops": 50.0 / ms}

    rows = [{"section": "train", "dtype": "bf16", "head_dim": 64, "causal": causal, "seqlen": s,
             "flashext": cell(1.0), "flashext_fa2": cell(2.0), "sdpa_cudnn": cell(c)}
            for causal, s, c in ((False, 1024, 0.9), (True, 1024, 1.1), (False, 2048, 1.0))]
    meta = {"gpu": "G", "torch": "t", "commit": "abc", "date": "2026-12-04T00:00"}
    train_tables({"meta": meta, "rows": rows}, summary=True)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert lines[0] == "| pass | head dim | flashext TFLOP/s | vs sdpa_cudnn |"
    assert lines[1:] == ["| forward + backward | 64 | 100-100 | 0.90× / 1.00× |",
                         "| backward alone | 64 | 50-50 | 0.90× / 1.00× |",
                         "| forward + backward (FA2-design kernels) | 64 | 50-50 | 0.45× / 0.50× |",
                         "| backward alone (FA2-design kernels) | 64 | 25-25 | 0.45× / 0.50× |"]
    rows = [{k: v for k, v in r.items() if k != "flashext_fa2"} for r in rows]  # a run without it: no rows
    train_tables({"meta": meta, "rows": rows}, summary=True)
    assert "FA2-design" not in capsys.readouterr().out


def test_attention_runs_medians_per_point():
    """Several runs' ratios are gathered per point; the bar's worst and median are over the
    per-point medians of D = 64 and 128 at S >= 1024 only; a point some run lacks, or timed
    invalidly, is left out."""
    from benchmarks.attention_runs import gather

    def run(times, invalid=()):
        rows = [{"section": "train", "dtype": "bf16", "head_dim": d, "causal": False, "seqlen": s,
                 "flashext": {"fwd_bwd_ms": 1.0, "bwd_ms": 1.0, "fwd_bwd_tflops": 100 * t, "bwd_tflops": 50 * t,
                              "valid": (d, s) not in invalid},
                 "sdpa_cudnn": {"fwd_bwd_ms": t, "bwd_ms": 2 * t}}
                for (d, s), t in times.items()]
        return {"meta": {"commit": "abc"}, "rows": rows}

    runs = [run({(64, 1024): 0.9, (128, 4096): 1.2, (128, 1024): 2.0, (64, 512): 0.5, (256, 2048): 0.1}),
            run({(64, 1024): 1.0, (128, 4096): 1.3, (128, 1024): 2.0, (64, 512): 0.5, (256, 2048): 0.1, (128, 2048): 0.1}),
            run({(64, 1024): 1.4, (128, 4096): 0.5, (128, 1024): 2.0, (64, 512): 0.5, (256, 2048): 0.1}, invalid=[(256, 2048)])]
    out = gather(runs, "sdpa_cudnn")
    assert out["section"] == "train" and [r["commit"] for r in out["runs"]] == ["abc"] * 3
    assert [(p["head_dim"], p["seqlen"]) for p in out["points"]] == [(64, 512), (64, 1024), (128, 1024), (128, 4096)]
    assert out["points"][1]["fwd_bwd_ms"] == {"runs": [0.9, 1.0, 1.4], "median": 1.0}
    # flashext's own rates: the median over the runs (here 100 and 50 times the anchor's time)
    assert out["points"][1]["flashext"] == {"fwd_bwd_tflops": 100.0, "bwd_tflops": 50.0}
    assert "matmul_tflops" not in out
    bar = out["bar"]["fwd_bwd_ms"]
    assert bar["points"] == 3 and bar["worst"] == 1.0 and bar["median"] == 1.2
    assert bar["worst_point"]["seqlen"] == 1024 and bar["worst_point"]["head_dim"] == 64
    assert out["bar"]["bwd_ms"]["median"] == 2.4
    with pytest.raises(ValueError, match="exactly one of the sections"):
        gather([{"meta": {}, "rows": []}], "sdpa_cudnn")
    # a cell of an implementation that failed holds its error, not a time: the point is left out
    runs[1]["rows"][0]["sdpa_cudnn"] = {"error_message": "boom"}
    assert (64, 1024) not in [(p["head_dim"], p["seqlen"]) for p in gather(runs, "sdpa_cudnn", "train")["points"]]


def test_runs_tables_from_gathered_runs(tmp_path, capsys):
    """readme_tables renders a runs file (attention_runs.gather's output) and its sibling of another
    anchor: per point each run's ratio and the medians (n/a where the sibling lacks the point); with
    --summary per head dim the worst / median at S >= 1024 and under it, and the bar's line; decode
    per shape, its rate column left out where the runs kept no rates."""
    import json

    from benchmarks.attention_runs import gather
    from benchmarks.readme_tables import main

    def run(scale, flash=True):
        rows = [{"section": "fwd", "dtype": "bf16", "head_dim": d, "causal": False, "seqlen": s,
                 "flashext": {"ms": 1.0, "tflops": 300.0 + s / 512},
                 "sdpa_cudnn": {"ms": t * scale}, **({"sdpa_flash": {"ms": 2 * t}} if flash or s < 2048 else {})}
                for d, s, t in ((64, 512, 0.9), (64, 1024, 0.95), (64, 2048, 1.1), (128, 1024, 1.05))]
        return {"meta": {"commit": "abc1234", "date": "2026-12-06T00:00", "gpu": "G", "torch": "t"}, "rows": rows}

    runs = [run(1.0), run(1.02), run(0.98)]
    (tmp_path / "attention_runs.json").write_text(json.dumps(gather(runs, "sdpa_cudnn", "fwd", head_dims=(64, 128))))
    flash_runs = [run(1.0, flash=False)] * 3  # no SDPA flash time at S = 2048: that point is missing there
    (tmp_path / "attention_runs_sdpa_flash.json").write_text(
        json.dumps(gather(flash_runs, "sdpa_flash", "fwd", head_dims=(64, 128))))
    (tmp_path / "attention_runs_notes.json").write_text("{}")  # not a runs file: ignored
    main(str(tmp_path / "attention_runs.json"), summary=True)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    assert lines[0] == ("| head dim | flashext TFLOP/s | vs cuDNN, S ≥ 1024 | vs cuDNN, S < 1024 | "
                        "vs SDPA flash, S ≥ 1024 | vs SDPA flash, S < 1024 |")
    assert lines[1:] == ["| 64 | 301-304 | 0.95× / 1.02× | 0.90× / 0.90× | 1.90× / 1.90× | 1.80× / 1.80× |",
                         "| 128 | 302 | 1.05× / 1.05× | n/a | 2.10× / 2.10× | n/a |"]
    assert "over the 3 points with S ≥ 1024 at D = 64, 128: median 1.050×, worst 0.950× cuDNN" in out
    main(str(tmp_path / "attention_runs.json"))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert lines[1] == "| bf16 | 64 | full | 512 | 301 | 0.900 / 0.918 / 0.882 | 0.900× | 1.800× |"
    assert lines[3] == "| bf16 | 64 | full | 2048 | 304 | 1.100 / 1.122 / 1.078 | 1.100× | n/a |"

    def decode_run(t):
        return {"meta": {"commit": "def5678", "date": "2026-12-06T00:00", "gpu": "G", "torch": "t"},
                "rows": [{"section": "decode", "dtype": dtype, "batch": 32, "seqlen": 4096, "flashext": {"ms": 1.0},
                          "sdpa_cudnn": {"ms": t + (dtype == "bf16") * 0.01}} for dtype in ("fp16", "bf16")]}

    (tmp_path / "decode_runs.json").write_text(json.dumps(gather([decode_run(0.99), decode_run(1.0)], "sdpa_cudnn",
                                                                 "decode")))
    main(str(tmp_path / "decode_runs.json"), summary=True)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert lines == ["| B × KV length | vs cuDNN, fp16 / bf16 |", "| 32 × 4096 | 0.995× / 1.005× |"]


def test_attention_runs_decode_points():
    """bench_decode runs: points by (dtype, batch, seqlen), every point in the bar, only the named
    section's rows (the paged rows beside them are not decode points)."""
    from benchmarks.attention_runs import gather

    def run(t32, t1):
        rows = [{"section": "decode", "dtype": "bf16", "batch": b, "seqlen": s,
                 "flashext": {"ms": 1.0}, "sdpa_cudnn": {"ms": t}} for b, s, t in ((32, 4096, t32), (1, 32768, t1))]
        rows.append({"section": "paged", "dtype": "bf16", "batch": 32, "seqlen": 4096, "flashext": {"ms": 9.0}})
        return {"meta": {}, "rows": rows}

    runs = [run(0.9, 2.0), run(1.0, 1.0), run(0.95, 3.0)]
    for i, r in enumerate(runs):  # a forward run's dense matmul rows are gathered, whatever the section
        r["rows"].append({"section": "matmul", "dtype": "bf16", "tflops": 600.0 + 10 * i})
    out = gather(runs, "sdpa_cudnn", "decode")
    assert out["matmul_tflops"] == {"bf16": 610.0}
    assert [(p["batch"], p["ms"]["median"]) for p in out["points"]] == [(1, 2.0), (32, 0.95)]
    assert out["bar"]["ms"]["points"] == 2 and out["bar"]["ms"]["worst"] == 0.95
    assert out["bar"]["ms"]["worst_point"] == {"dtype": "bf16", "batch": 32, "seqlen": 4096}
