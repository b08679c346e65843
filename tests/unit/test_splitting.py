"""Tests for :mod:`onnxpipe.partition.splitting`: one item cut into parts over consecutive stages.

The oracle is a brute force written from the problem statement: every way to place ``p`` parts of the
dominating item in stages (two parts never share a stage... or do: every cut set is tried), every part
count, every candidate, every contiguous cut of the rest, with ``math.fsum`` of the stage costs and the
bytes received over the link.  The planner's bottleneck must equal its optimum.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnxpipe.core.errors import PartitionError
from onnxpipe.partition import Partition, solve
from onnxpipe.partition.result import TIE_RTOL
from onnxpipe.partition.splitting import SplitCandidate, SplitShape, expand

REL = 2 * TIE_RTOL  # the planner keeps the contiguous split unless a split beats it by TIE_RTOL


@dataclass(frozen=True)
class SplitResult:
    """The best partition with at most one item split (over the expanded sequence when ``split`` is
    set), the contiguous one, and the split: ``(candidate, shape, the stage of each part)``."""

    partition: Partition
    contiguous: Partition
    split: tuple[int, int, tuple[int, ...]] | None


def solve_with_split(
    costs: list[float],
    k: int,
    candidates: list[SplitCandidate],
    *,
    cut_bytes: list[float] | None = None,
    bandwidth: float = math.inf,
) -> SplitResult:
    """The planner's search (:mod:`onnxpipe.planning.nodesplit.plan`) on plain numbers: every candidate
    and shape expanded (:func:`expand`) and solved exactly, kept when it beats the best by ``TIE_RTOL``;
    ties go to the contiguous split, then the earlier candidate, then the earlier shape."""
    n = len(costs)
    cut = [0.0] * (n + 1) if cut_bytes is None else [float(c) for c in cut_bytes]
    allowed = [True] * (n + 1)
    contiguous = solve(costs, k, cut_bytes=cut, bandwidth=bandwidth)
    best, chosen = contiguous, None
    for ci, cand in enumerate(candidates):
        for si, shape in enumerate(cand.shapes):
            ex = expand(costs, cut, allowed, cand, shape)
            try:
                part = solve(
                    ex.costs, k, cut_bytes=ex.cut_bytes, bandwidth=bandwidth, allowed_cuts=ex.allowed
                )
            except PartitionError:
                continue  # too few allowed cuts for k stages with this shape
            if part.bottleneck < best.bottleneck * (1.0 - TIE_RTOL):
                best, chosen = (
                    part,
                    (ci, si, tuple(part.stage_of(cand.start + t) for t in range(shape.parts))),
                )
    return SplitResult(partition=best, contiguous=contiguous, split=chosen)


def brute(costs: list[float], cut: list[float], allowed: list[bool], k: int, bw: float) -> float:
    """Smallest bottleneck over every contiguous split (stage cost: fsum of its items + bytes in / bw)."""
    n = len(costs)
    best = math.inf
    for inner in itertools.combinations(range(1, n), k - 1):
        if not all(allowed[p] for p in inner):
            continue
        bounds = (0, *inner, n)
        worst = 0.0
        for s, (a, b) in enumerate(itertools.pairwise(bounds)):
            worst = max(worst, math.fsum(costs[a:b]) + (cut[a] / bw if s > 0 else 0.0))
        best = min(best, worst)
    return best


def brute_split(
    costs: list[float], cut: list[float], k: int, bw: float, cands: list[SplitCandidate]
) -> float:
    """The best over no split and every candidate shape, each placed every possible way."""
    allowed = [True] * (len(costs) + 1)
    best = brute(costs, cut, allowed, k, bw)
    for cand in cands:
        for shape in cand.shapes:
            a, m = cand.start, cand.length
            new_costs = [*costs[:a], *shape.part_costs, shape.join_cost, *costs[a + m :]]
            new_cut = [*cut[: a + 1], *(cut[a] + c for c in shape.carried), cut[a], *cut[a + m :]]
            new_allowed = [True] * (len(new_costs) + 1)
            new_allowed[a + shape.parts] = False  # the join stays with the last part
            if len(new_costs) >= k:
                best = min(best, brute(new_costs, new_cut, new_allowed, k, bw))
    return best


def even_shape(cost: float, parts: int, overhead: float, out_bytes: float) -> SplitShape:
    """A node cut into equal parts, each ``overhead`` slower than its share, joined for free-ish."""
    share = cost / parts * (1.0 + overhead)
    return SplitShape(
        part_costs=(share,) * parts,
        join_cost=cost * 0.01,
        carried=tuple(out_bytes * (t + 1) / parts for t in range(parts - 1)),
        label="columns",
    )


@st.composite
def dominated(draw: st.DrawFn) -> tuple[list[float], list[float], int, float, list[SplitCandidate]]:
    n = draw(st.integers(2, 7))
    costs = draw(st.lists(st.floats(0.0, 10.0, allow_nan=False), min_size=n, max_size=n))
    big = draw(st.integers(0, n - 1))
    costs[big] = draw(st.floats(10.0, 100.0))
    cut = draw(st.lists(st.floats(0.0, 50.0, allow_nan=False), min_size=n + 1, max_size=n + 1))
    k = draw(st.integers(1, min(n + 2, 6)))
    bw = draw(st.sampled_from([math.inf, 10.0, 100.0]))
    overhead = draw(st.floats(0.0, 0.5))
    out_bytes = draw(st.floats(0.0, 100.0))
    length = draw(st.integers(1, min(2, n - big)))
    shapes = tuple(
        even_shape(math.fsum(costs[big : big + length]), p, overhead, out_bytes) for p in range(2, 5)
    )
    cands = [SplitCandidate(big, length, shapes)]
    if draw(st.booleans()):  # a second, smaller candidate
        other = draw(st.integers(0, n - 1))
        cands.append(SplitCandidate(other, 1, (even_shape(costs[other], 2, overhead, out_bytes),)))
    return costs, cut, k, bw, cands


@settings(max_examples=150)
@given(dominated())
def test_split_planner_equals_brute_force(
    case: tuple[list[float], list[float], int, float, list[SplitCandidate]],
) -> None:
    costs, cut, k, bw, cands = case
    if k > len(costs) + 3:
        return
    try:
        result = solve_with_split(costs, k, cands, cut_bytes=cut, bandwidth=bw)
    except PartitionError:
        assert k > len(costs)  # no contiguous split into k stages: nothing to compare
        return
    expected = brute_split(costs, cut, k, bw, cands)
    assert result.partition.bottleneck == pytest.approx(expected, rel=REL, abs=1e-12)
    assert result.partition.bottleneck <= result.contiguous.bottleneck
    if result.split is not None:  # split only when it lowers the bottleneck
        assert result.partition.bottleneck < result.contiguous.bottleneck
        stages = result.split[2]
        assert list(stages) == sorted(stages)


def test_one_dominating_item_is_split_past_the_contiguous_bound() -> None:
    costs = [1.0, 1.0, 12.0, 1.0, 1.0]  # total 16; K=4: contiguous >= 12, total / K = 4
    shapes = tuple(even_shape(12.0, p, 0.0, 0.0) for p in range(2, 5))
    result = solve_with_split(costs, 4, [SplitCandidate(2, 1, shapes)])
    assert result.contiguous.bottleneck == 12.0
    assert result.contiguous.lower_bound == 12.0  # max(total / K, largest item)
    assert result.split is not None
    assert result.partition.bottleneck < 12.0
    # three parts of 4 with the join (0.12) on the last part: 1+1+4, 4, 4.12+1+1 -> 6.12; four parts: 1+1+3...
    assert result.partition.bottleneck == pytest.approx(
        brute_split(costs, [0.0] * 6, 4, math.inf, [SplitCandidate(2, 1, shapes)])
    )


def test_no_split_when_it_does_not_help() -> None:
    costs = [4.0, 4.0, 4.0, 4.0]
    shapes = (even_shape(4.0, 2, 0.0, 0.0),)
    result = solve_with_split(costs, 4, [SplitCandidate(1, 1, shapes)])
    assert result.split is None
    assert result.partition == result.contiguous


def test_forwarded_bytes_can_make_a_split_lose() -> None:
    costs = [1.0, 10.0, 1.0]
    shapes = (SplitShape((5.0, 5.0), 0.0, (1000.0,)),)
    cand = [SplitCandidate(1, 1, shapes)]
    assert solve_with_split(costs, 2, cand).split is not None
    slow = solve_with_split(costs, 2, cand, cut_bytes=[0.0, 0.0, 0.0, 0.0], bandwidth=10.0)
    assert slow.split is None  # 100 s to send the carried part: the contiguous split is better


def test_expand_places_parts_join_and_cuts() -> None:
    shape = SplitShape((2.0, 3.0, 4.0), 0.5, (10.0, 20.0))
    ex = expand(
        [1.0, 9.0, 1.0], [0.0, 7.0, 8.0, 0.0], [True] * 4, SplitCandidate(1, 1, shape and (shape,)), shape
    )
    assert ex.costs == (1.0, 2.0, 3.0, 4.0, 0.5, 1.0)
    assert ex.cut_bytes == (0.0, 7.0, 17.0, 27.0, 7.0, 8.0, 0.0)
    assert ex.allowed == (True, True, True, True, False, True, True)
    assert solve(ex.costs, 3, cut_bytes=ex.cut_bytes, allowed_cuts=ex.allowed).bounds[1:-1] != (4,)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"part_costs": (1.0,), "join_cost": 0.0, "carried": ()}, "2 or more parts"),
        ({"part_costs": (1.0, 1.0), "join_cost": 0.0, "carried": ()}, "carried needs 1"),
        ({"part_costs": (1.0, -1.0), "join_cost": 0.0, "carried": (0.0,)}, "non-negative"),
    ],
)
def test_bad_shapes_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(PartitionError, match=message):
        SplitShape(**kwargs)  # type: ignore[arg-type]
