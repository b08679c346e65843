"""The contiguous lower bound of a chain on devices in order: tight where it should be, never above a
split."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from onnxpipe.partition.numeric import chain_bound


def _best_split(rows: list[list[float]]) -> float:
    """The smallest bottleneck over every contiguous split into ``len(rows)`` non-empty stages."""
    k, n = len(rows), len(rows[0])
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(rows[s][bounds[s] : bounds[s + 1]]) for s in range(k)))
    return best


def test_identical_devices_split_the_work_evenly() -> None:
    assert chain_bound([[1.0] * 10] * 2, 5.0) == pytest.approx(5.0, rel=1e-6)


def test_devices_that_disagree_item_by_item() -> None:
    """Each item is free on one device: the cheapest-device bound is 0, the chain's is 1."""
    rows = [[1.0, 0.0], [0.0, 1.0]]
    assert chain_bound(rows, _best_split(rows)) == pytest.approx(1.0, rel=1e-6)


def test_never_above_a_split() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        k, n = int(rng.integers(1, 4)), int(rng.integers(3, 8))
        rows = rng.exponential(size=(k, n)) * (rng.random((k, n)) > 0.3)
        best = _best_split(rows.tolist())
        bound = chain_bound(rows.tolist(), best)
        assert bound <= best
        # at least the cheapest-device bound: every item paid at its cheapest, spread over k devices
        assert bound >= rows.min(axis=0).sum() / k * (1 - 1e-6) - 1e-12
