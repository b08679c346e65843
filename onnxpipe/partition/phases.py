"""Contiguous K-way partitioning with two costs per item, for two phases of one workload.

A decoder runs at two shapes (a prompt, then one token at a time) whose costs are spread differently over
its layers, so a split balanced for one phase is not for the other.  Each item ``i`` has a cost in phase
A and one in phase B; a stage's cost in a phase is the sum over its items plus what it receives over its
link in that phase (``cut[p] / bandwidth``).  With weights ``wa, wb`` the objective is::

    minimise   max_s  max(wa * A_s, wb * B_s)

which is still a contiguous min-max: a stage's cost only grows as it grows, so an exact dynamic
programme over the items finds the optimum.  With ``wa = 1 / opt_A`` and ``wb = 1 / opt_B`` (each phase's
own best bottleneck) it is the split whose worse phase is the least slower than that phase could be on
its own (:func:`solve_two_phases`).  The items are a decoder's layers (tens, not thousands), so the
``O(K n^2)`` programme is cheap.

Plain numbers, no onnx, like the rest of :mod:`onnxpipe.partition`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from onnxpipe.partition.inputs import _allowed, _check_k, _costs, _vector


@dataclass(frozen=True)
class TwoPhaseSplit:
    """A split for two phases: ``bounds`` as in :class:`onnxpipe.partition.Partition`, each stage's cost
    in phase A and B (compute + transfer in), and the weighted objective's value."""

    bounds: tuple[int, ...]
    stage_a: tuple[float, ...]
    stage_b: tuple[float, ...]
    objective: float


def _stage(prefix: Sequence[float], cut: Sequence[float], bandwidth: float, a: int, b: int) -> float:
    transfer = cut[a] / bandwidth if a > 0 and bandwidth != math.inf else 0.0
    return prefix[b] - prefix[a] + transfer


def solve_weighted(
    costs_a: Sequence[float],
    costs_b: Sequence[float],
    k: int,
    *,
    weights: tuple[float, float] = (1.0, 1.0),
    cut_a: Sequence[float] | None = None,
    cut_b: Sequence[float] | None = None,
    bandwidth: float = math.inf,
    allowed_cuts: Sequence[bool] | None = None,
) -> TwoPhaseSplit:
    """The split into ``k`` contiguous stages minimising ``max_s max(wa * A_s, wb * B_s)``, exactly.

    Among optimal splits the one with the smallest ``sum_s (wa * A_s + wb * B_s)`` is not sought: ties
    go to the earliest cut positions.  ``allowed_cuts[p] = False`` forbids a stage starting at ``p``.
    """
    items_a = _costs(costs_a)
    n = items_a.size
    items_b = _vector("costs_b", costs_b, n, 0.0, hint=" (one per item, as costs_a)")
    _check_k(k, n)
    hint = " (n+1: one per cut position 0..n)"
    ca = _vector("cut_a", cut_a, n + 1, 0.0, hint=hint).tolist()
    cb = _vector("cut_b", cut_b, n + 1, 0.0, hint=hint).tolist()
    allowed = _allowed(allowed_cuts, n, k).tolist()
    pa = [0.0, *np.cumsum(items_a).tolist()]
    pb = [0.0, *np.cumsum(items_b).tolist()]
    wa, wb = weights

    def cost(a: int, b: int) -> float:
        return max(wa * _stage(pa, ca, bandwidth, a, b), wb * _stage(pb, cb, bandwidth, a, b))

    inf = math.inf
    # best[s][j]: the best bottleneck of s stages covering items [0, j); arg[s][j]: where the last starts
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    arg = [[-1] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for s in range(1, k + 1):
        for j in range(s, n + 1):
            for i in range(s - 1, j):
                if best[s - 1][i] == inf or (i > 0 and not allowed[i]):
                    continue
                v = max(best[s - 1][i], cost(i, j))
                if v < best[s][j]:
                    best[s][j], arg[s][j] = v, i
    assert best[k][n] < inf, "_allowed leaves k - 1 cuts, so a split exists"
    bounds = [n]
    for s in range(k, 0, -1):
        bounds.append(arg[s][bounds[-1]])
    bounds.reverse()
    stage_a = tuple(_stage(pa, ca, bandwidth, a, b) for a, b in itertools.pairwise(bounds))
    stage_b = tuple(_stage(pb, cb, bandwidth, a, b) for a, b in itertools.pairwise(bounds))
    return TwoPhaseSplit(tuple(bounds), stage_a, stage_b, best[k][n])


def solve_two_phases(
    costs_a: Sequence[float],
    costs_b: Sequence[float],
    k: int,
    *,
    cut_a: Sequence[float] | None = None,
    cut_b: Sequence[float] | None = None,
    bandwidth: float = math.inf,
    allowed_cuts: Sequence[bool] | None = None,
) -> TwoPhaseSplit:
    """The split whose worse phase is the least slower than that phase's own best split, exactly:
    :func:`solve_weighted` with each phase weighted by one over its own optimal bottleneck."""

    def solve(a: Sequence[float], b: Sequence[float], weights: tuple[float, float]) -> TwoPhaseSplit:
        return solve_weighted(
            a, b, k, weights=weights, cut_a=cut_a, cut_b=cut_b, bandwidth=bandwidth, allowed_cuts=allowed_cuts
        )

    zeros = [0.0] * len(costs_a)
    best_a = solve(costs_a, zeros, (1.0, 0.0)).objective
    best_b = solve(zeros, costs_b, (0.0, 1.0)).objective
    return solve(costs_a, costs_b, (1.0 / best_a if best_a > 0 else 1.0, 1.0 / best_b if best_b > 0 else 1.0))
