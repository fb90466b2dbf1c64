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
