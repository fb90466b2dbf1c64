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
