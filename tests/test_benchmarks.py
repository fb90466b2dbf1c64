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
