"""Past the contiguous bound: one item may be split into parts placed in consecutive stages.

A contiguous K-way split can never beat ``max(total / K, largest item)``: when one item is larger than
``total / K`` it sets the bottleneck alone.  Some items can be cut into independent parts (a MatMul by
its weight's output columns, a Conv by its output channels), each part an item of its own, joined at the
end (a Concat, or a Sum for a split reduction).  This module decides, on plain numbers, whether to cut
one such item, which one, into how many parts, and where the stages go, by the very objective of
:func:`~onnxpipe.partition.solve` (the slowest stage, compute plus the bytes received over the link).

The model of a split item ``j`` (a run of ``length`` items starting at ``start``: the node and the nodes
carried along with it) into ``p`` parts: the run is replaced by the ``p`` parts and the join, in that
order, so the expanded sequence is again contiguous and the exact solver applies unchanged.  Cut
positions inside the run receive what a stage starting at the run receives (``cut_bytes[start]``: the
run's input, forwarded to the next part's stage, is among it) plus what the earlier parts made and the
join still needs (``carried[t]``); no cut falls between the last part and the join.  Two parts may end
up in one stage: that is a valid split too, never better than fewer parts (which are also tried).

Exactness: the planner (:mod:`onnxpipe.planning.nodesplit.plan`) solves every candidate item and every
part count it offers exactly, the contiguous split too, and the best wins; a split is kept only when it
lowers the bottleneck by more than :data:`~onnxpipe.partition.result.TIE_RTOL`.  So the result is the
optimum over "no split" and "split one offered item into one offered shape"
(``tests/unit/test_splitting.py`` checks that search against brute force).  Cost: one exact solve per
(candidate, shape).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from onnxpipe.core.errors import PartitionError


@dataclass(frozen=True)
class SplitShape:
    """One way to cut a run into parts: their costs, the join's cost, and the bytes carried forward.

    ``carried[t]`` (``t = 0 .. parts - 2``) is what the stage of part ``t + 1`` receives on top of the
    run's own input: the outputs of parts ``0..t`` that the join still needs.  ``label`` is the caller's
    name for the shape (``"columns"``, ``"reduction"``).
    """

    part_costs: tuple[float, ...]
    join_cost: float
    carried: tuple[float, ...]
    label: str = ""

    @property
    def parts(self) -> int:
        return len(self.part_costs)

    def __post_init__(self) -> None:
        if self.parts < 2:
            raise PartitionError(f"a split shape needs 2 or more parts, got {self.parts}")
        if len(self.carried) != self.parts - 1:
            raise PartitionError(
                f"carried needs {self.parts - 1} entries (one per inner link), got {len(self.carried)}"
            )
        values = (*self.part_costs, self.join_cost, *self.carried)
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise PartitionError("part costs, join cost and carried bytes must be finite and non-negative")


@dataclass(frozen=True)
class SplitCandidate:
    """A run of items ``start .. start + length - 1`` that may be replaced by one of ``shapes``."""

    start: int
    length: int
    shapes: tuple[SplitShape, ...]


@dataclass(frozen=True)
class Expanded:
    """A sequence with one run replaced by parts and a join, in :func:`solve`'s terms."""

    costs: tuple[float, ...]
    cut_bytes: tuple[float, ...]
    allowed: tuple[bool, ...]


def expand(
    costs: Sequence[float],
    cut_bytes: Sequence[float],
    allowed: Sequence[bool],
    candidate: SplitCandidate,
    shape: SplitShape,
) -> Expanded:
    """The sequence with ``candidate``'s run replaced by ``shape``'s parts then its join.

    Positions before the run keep their numbers; cut ``start + t`` (``t = 1..parts-1``) receives
    ``cut_bytes[start] + carried[t - 1]``; the cut between the last part and the join is forbidden; the
    positions after the join are the ones after the run, shifted by ``parts + 1 - length``.
    """
    a, m, p = candidate.start, candidate.length, shape.parts
    n = len(costs)
    if not (a >= 0 and m >= 1 and a + m <= n):
        raise PartitionError(f"split run {a}..{a + m - 1} is outside the items 0..{n - 1}")
    new_costs = (*costs[:a], *shape.part_costs, shape.join_cost, *costs[a + m :])
    inner = tuple(float(cut_bytes[a]) + c for c in shape.carried)
    new_cut = (*cut_bytes[: a + 1], *inner, float(cut_bytes[a]), *cut_bytes[a + m :])
    new_allowed = (*allowed[: a + 1], *([True] * (p - 1)), False, *allowed[a + m :])
    return Expanded(tuple(float(c) for c in new_costs), tuple(float(c) for c in new_cut), new_allowed)
