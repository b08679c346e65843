"""What a solve returns, and the rules that turn a solved model into it, shared by both solvers.

The engine and the reference DP differ only in how they find the optimum and the fewest-bytes splits;
the tie-break rule (:func:`_choose`), the packaging (:func:`_partition_of`) and the memory error live
here once so that both produce the very same :class:`Partition` for the same request.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from onnxpipe.core.errors import MemoryFitError, PartitionError
from onnxpipe.partition.costmodel import TIE_RTOL as TIE_RTOL
from onnxpipe.partition.costmodel import _Model


@dataclass(frozen=True)
class Partition:
    """A K-stage split of the item sequence, with the numbers the objective saw.

    Every cost is reported exactly as the solver evaluated it, so ``bottleneck == max(stage_costs)``
    holds bit for bit and a caller can re-derive any decision.  ``lower_bound`` is a cheap certificate:
    ``ratio`` close to 1 proves the split is near-perfect without re-running the solver.
    """

    bounds: tuple[int, ...]
    """``K + 1`` positions ``0 = b_0 < ... < b_K = n``; stage ``s`` holds items ``[b_s, b_{s+1})``."""
    compute: tuple[float, ...]
    """Per-stage compute time (after speed scaling; or the sum of the stage's ``device_costs`` row)."""
    transfer: tuple[float, ...]
    """Per-stage transfer-in time (bytes / bandwidth + latency); 0 for stage 0."""
    stage_costs: tuple[float, ...]
    """Per-stage cost as the objective sees it (compute + transfer, or their max when they overlap)."""
    bottleneck: float
    """``max(stage_costs)``: the pipeline's steady-state time per micro-batch."""
    lower_bound: float
    """A bound no partition can beat (work spread over the devices, largest item, largest latency),
    clamped to ``bottleneck`` so that float rounding of the prefix sums can never make it exceed the
    optimum.  The work bound is the total over the total speed, or, with ``device_costs``, a bound of
    the fractional-assignment LP (see :func:`solve_heterogeneous`)."""
    cut_bytes_total: int
    """Sum of ``cut_bytes[b_s]`` over the K-1 internal cuts."""

    @property
    def k(self) -> int:
        """Number of stages."""
        return len(self.bounds) - 1

    @property
    def latency(self) -> float:
        """One micro-batch through every stage and link in turn, alone: the sum of the computes and
        transfers (what the ``latency`` objective minimises)."""
        return math.fsum((*self.compute, *self.transfer))

    @property
    def ratio(self) -> float:
        """``bottleneck / lower_bound`` (>= 1; 1.0 when the lower bound is 0): how far from perfect."""
        if self.lower_bound == 0:
            return 1.0
        return self.bottleneck / self.lower_bound

    def recosted(
        self,
        compute: Sequence[float],
        transfer: Sequence[float],
        *,
        overlap: bool = False,
        cut_bytes: int = -1,
    ) -> Partition:
        """This split with each stage's ``compute`` and ``transfer`` changed (what a stage's copies add,
        what no longer crosses a cut), its costs summed (the larger when links ``overlap`` compute), its
        bottleneck and bound following; ``cut_bytes`` (``>= 0``) replaces :attr:`cut_bytes_total`."""
        costs = tuple(max(c, t) if overlap else c + t for c, t in zip(compute, transfer, strict=True))
        return dataclasses.replace(
            self,
            compute=tuple(compute),
            transfer=tuple(transfer),
            stage_costs=costs,
            bottleneck=max(costs),
            lower_bound=min(self.lower_bound, max(costs)),
            cut_bytes_total=self.cut_bytes_total if cut_bytes < 0 else cut_bytes,
        )

    def stage_of(self, item: int) -> int:
        """The stage that runs ``item``."""
        if not 0 <= item < self.bounds[-1]:
            raise IndexError(f"item {item} is outside 0..{self.bounds[-1] - 1}")
        return bisect.bisect_right(self.bounds, item) - 1


def _choose(
    model: _Model, opt: float, min_bytes: Callable[[float], tuple[float, tuple[int, ...]]]
) -> tuple[int, ...]:
    """The tie-break rule, shared by the engine and the reference so both pick the very same split.

    Fewest cut bytes among splits within ``model.tie_rtol`` (default :data:`TIE_RTOL`) of ``opt``; if
    that split is not exactly optimal, an exactly optimal split with as few bytes is preferred.  With no
    bytes on any inner cut there is nothing to trade: the exact pass decides.
    """
    loose = opt * (1.0 + model.tie_rtol)
    if loose == opt or not model.cut[1 : model.n].any():
        return min_bytes(opt)[1]
    loose_bytes, loose_bounds = min_bytes(loose)
    if model.bottleneck(loose_bounds) <= opt:
        return loose_bounds
    exact_bytes, exact_bounds = min_bytes(opt)
    return exact_bounds if exact_bytes <= loose_bytes else loose_bounds


def _balanced(
    model: _Model, bounds: tuple[int, ...], solve: Callable[[_Model], tuple[int, ...]]
) -> tuple[int, ...]:
    """``bounds`` with the stages below the bottleneck balanced among themselves (the second level).

    The min-max optimum says nothing about the stages that do not set it: when one item dominates, every
    split that leaves it alone is optimal, and the fewest-bytes tie-break then picks stages of a few
    cheap nodes, idle while others hold far more than the average (GPT-2's LM head at K = 8).  So the
    stages within :data:`TIE_RTOL` of the bottleneck stay as they are ("pinned") and every run of two or
    more consecutive stages between them is solved again, exactly, over the items it holds, its ends fixed
    (:meth:`_Model.window`).  One level: a run's own stages below its slowest are not balanced again
    (each level costs a solve per run, and the second already leaves no stage idle beside a dominating
    one).  A run's new
    split is kept only when the whole model scores it lexicographically better (its stage costs sorted
    largest first); runs share no stage, so the whole split improves the same way, and each run's slowest
    stage ends at the least its items allow.
    """
    costs = model.evaluate(bounds)[2]
    top = float(costs.max())
    pinned = [bool(c >= top * (1.0 - TIE_RTOL)) for c in costs]
    new = list(bounds)
    for s, e in _runs(pinned):
        a, b = bounds[s], bounds[e]
        try:
            sub = solve(model.window(a, b, s, e))
        except PartitionError:  # cannot happen (the run's own split fits); keep it if it does
            continue
        trial = [*new[:s], *(a + x for x in sub), *new[e + 1 :]]
        after = model.evaluate(trial)[2][s:e]
        if sorted(after.tolist(), reverse=True) < sorted(costs[s:e].tolist(), reverse=True):
            new = trial
    return tuple(new)


def _runs(pinned: Sequence[bool]) -> list[tuple[int, int]]:
    """``(first, end)`` of every run of two or more consecutive stages that are not pinned."""
    out: list[tuple[int, int]] = []
    s = 0
    for held, run in itertools.groupby(pinned):
        e = s + len(list(run))
        if not held and e - s > 1:
            out.append((s, e))
        s = e
    return out


def _memory_error(model: _Model, need: float) -> PartitionError:
    """The error when no split fits the caps, naming ``need``: the smallest uniform cap that would fit
    (the optimum of :meth:`_Model.memory_model`, found by the solver that failed), so the caller learns
    how far off the caps are, not merely that they are."""
    assert model.mem_cap is not None
    return MemoryFitError(
        f"no split into {model.k} stages fits the memory caps (tightest {float(model.mem_cap.min()):.6g} "
        f"bytes); the smallest uniform cap that fits is {need:.17g} bytes: raise mem_caps or change k",
        need,
    )


def _partition_of(model: _Model, lower: float, bounds: Sequence[int]) -> Partition:
    """Score ``bounds`` with the canonical formula: the solvers and the ``evaluate`` functions all
    report through here, so the same split always carries the same numbers."""
    comp, tr, cost = model.evaluate(bounds)
    bottleneck = float(cost.max())
    cut_total = math.fsum(float(model.cut[b]) for b in bounds[1:-1])
    return Partition(
        bounds=tuple(int(b) for b in bounds),
        compute=tuple(float(x) for x in comp),
        transfer=tuple(float(x) for x in tr),
        stage_costs=tuple(float(x) for x in cost),
        bottleneck=bottleneck,
        lower_bound=min(lower, bottleneck),
        cut_bytes_total=round(cut_total),
    )
