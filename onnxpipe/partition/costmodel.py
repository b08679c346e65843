"""The validated problem and its one cost formula, shared by the solver, the reference and the report.

Every number that judges, compares or reports a stage goes through :meth:`_Model.cost` (and
:meth:`_Model.memory`): the engine, the reference DP and :class:`~onnxpipe.partition.Partition` therefore
agree bit for bit, and the solver's exactness argument needs only this formula's monotonicity.  The
model holds numbers only; building one from a caller's request (and refusing bad input) is
:mod:`onnxpipe.partition.inputs`'s job.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from onnxpipe.partition.numeric import BoolArr, FloatArr, IntArr, _dual_weights, _prefix

TIE_RTOL = 1e-9
"""Partitions whose bottleneck is within this relative distance of the optimum count as optimal when the
tie-break on cut bytes is applied (the default of :attr:`_Model.tie_rtol`)."""


@dataclass(frozen=True, eq=False)
class _Work:
    """Per-item amounts of every stage (compute time, or memory), each distinct row stored once.

    Stage ``s`` uses row ``of[s]``; stages whose rows are equal share one row (and one prefix array), which
    is what lets the engine share its ``r`` arrays between identical stages.
    """

    rows: FloatArr  # (r, n): the distinct rows
    prefix: tuple[FloatArr, ...]  # r correctly rounded prefix sums, len n+1 each
    of: tuple[int, ...]  # len k: the row of each stage

    @staticmethod
    def single(row: FloatArr, prefix: FloatArr, k: int) -> _Work:
        """Every stage reads the same row."""
        return _Work(rows=row[None, :], prefix=(prefix,), of=(0,) * k)

    def window(self, a: int, b: int, stages: range) -> _Work:
        """The rows of ``stages`` over items ``a .. b - 1``, prefix sums taken from this one's (less
        their value at ``a``: no sum is made again, which costs a Python loop over the items)."""
        distinct = sorted({self.of[s] for s in stages})
        index = {r: i for i, r in enumerate(distinct)}
        return _Work(
            rows=self.rows[distinct][:, a:b],
            prefix=tuple(self.prefix[r][a : b + 1] - self.prefix[r][a] for r in distinct),
            of=tuple(index[self.of[s]] for s in stages),
        )

    @staticmethod
    def table(name: str, rows: Sequence[FloatArr]) -> _Work:
        """One row per stage (``name.format(s=s)`` in messages); equal rows are detected and stored once."""
        index: dict[bytes, int] = {}
        distinct: list[FloatArr] = []
        prefix: list[FloatArr] = []
        of: list[int] = []
        by_id: dict[int, int] = {}
        for s, row in enumerate(rows):
            if id(row) in by_id:  # the very same array: no need to compare
                of.append(by_id[id(row)])
                continue
            key = (row + 0.0).tobytes()  # -0.0 -> 0.0: equal values, equal bytes
            if key not in index:
                index[key] = len(distinct)
                distinct.append(row)
                prefix.append(_prefix(name.format(s=s), row))
            by_id[id(row)] = index[key]
            of.append(index[key])
        return _Work(rows=np.array(distinct, dtype=np.float64), prefix=tuple(prefix), of=tuple(of))


@dataclass(frozen=True, eq=False)
class _Model:
    """Validated numbers of one request.

    ``transfer = (cut * tr_mul) / tr_div + tr_add`` covers both the time model (``1, bandwidth, latency``)
    and the memory model (``factor, 1, 0``) with the same floating-point operations, so the memory
    problem can be solved by the same engine and its optimum is exactly the smallest uniform cap.
    """

    n: int
    k: int
    work: _Work  # per-stage item costs: the costs row (and speeds), or the device_costs rows
    cut: FloatArr  # len n+1
    speed: FloatArr  # len k
    tr_mul: FloatArr  # len k (index 0 unused)
    tr_div: FloatArr  # len k (index 0 unused)
    tr_add: FloatArr  # len k (index 0 unused)
    overlap: bool
    allowed: BoolArr  # len n+1; 0 and n always True
    mem: _Work | None = None  # per-stage item memory: item_mem (+ act_factor[s] * item_act)
    mem_cap: FloatArr | None = None  # len k
    mem_fac: FloatArr | None = None  # len k
    first_receives: bool = False
    """Stage 0 receives too (a window of a larger problem that starts after its stage 0: :meth:`window`)."""
    tie_rtol: float = TIE_RTOL
    """Splits this close to the optimum (relative) tie; the fewest bytes among them win (``_choose``)."""
    start: FloatArr | None = None
    """len n+1: seconds a stage starting at each position adds, if it receives (what it makes again of
    values it would otherwise receive); counted with the transfer."""

    def receives(self, s: int) -> bool:
        """Whether stage ``s`` pays for what it receives (every stage but the first of the problem)."""
        return s > 0 or self.first_receives

    def prefix(self, s: int) -> FloatArr:
        """Prefix sums of stage ``s``'s item costs (before speed scaling)."""
        return self.work.prefix[self.work.of[s]]

    def transfer(self, s: int, a: IntArr) -> FloatArr:
        """Transfer-in time of stage ``s`` for starts ``a`` (0 for the first stage)."""
        if not self.receives(s):
            return np.zeros(a.shape, dtype=np.float64)
        out: FloatArr = (self.cut[a] * self.tr_mul[s]) / self.tr_div[s] + self.tr_add[s]
        if self.start is not None:
            out = out + self.start[a]
        return out

    def compute(self, s: int, a: IntArr, b: IntArr | int) -> FloatArr:
        """Compute time of stage ``s`` over ``[a, b)``."""
        p = self.prefix(s)
        out: FloatArr = (p[b] - p[a]) / self.speed[s]
        return out

    def cost(self, s: int, a: IntArr, b: IntArr | int) -> FloatArr:
        """The canonical stage cost: the only formula used to judge, compare and report stages."""
        return self.combine(s, self.compute(s, a, b), self.transfer(s, a))

    def combine(self, s: int, comp: FloatArr, tr: FloatArr) -> FloatArr:
        """Stage cost from its compute and transfer times (``compute`` / ``transfer`` outputs)."""
        if not self.receives(s):
            return comp
        out: FloatArr = np.maximum(comp, tr) if self.overlap else comp + tr
        return out

    def memory(self, s: int, a: IntArr, b: IntArr | int) -> FloatArr:
        """Memory of stage ``s`` over ``[a, b)`` (same operations as the memory model's ``cost``)."""
        assert self.mem is not None and self.mem_fac is not None
        p = self.mem.prefix[self.mem.of[s]]
        held: FloatArr = p[b] - p[a]
        if not self.receives(s):
            return held
        out: FloatArr = held + self.cut[a] * self.mem_fac[s]
        return out

    def memory_ok(self, s: int, a: IntArr, b: IntArr | int) -> BoolArr:
        """Whether stage ``s`` over ``[a, b)`` fits its cap (all true without caps)."""
        if self.mem_cap is None:
            return np.ones(np.broadcast(a, b).shape, dtype=bool)
        out: BoolArr = self.memory(s, a, b) <= self.mem_cap[s]
        return out

    def memory_model(self) -> _Model:
        """The problem "minimise the largest stage memory": its optimum is the smallest uniform cap."""
        assert self.mem is not None and self.mem_fac is not None
        ones = np.ones(self.k)
        return _Model(
            n=self.n,
            k=self.k,
            work=self.mem,
            cut=self.cut,
            speed=ones,
            tr_mul=self.mem_fac,
            tr_div=ones,
            tr_add=np.zeros(self.k),
            overlap=False,
            allowed=self.allowed,
        )

    def window(self, a: int, b: int, s0: int, s1: int) -> _Model:
        """The problem of stages ``s0 .. s1 - 1`` alone over items ``a .. b - 1`` (their start ``a`` and end
        ``b`` fixed): what :func:`~onnxpipe.partition.result._balanced` re-solves between pinned stages.
        Its prefix sums are this model's less their value at ``a`` (monotone, but rounded once more), so a
        caller re-scores its answer with this model's :meth:`evaluate` before trusting it."""
        stages = range(s0, s1)
        mem = None if self.mem is None else self.mem.window(a, b, stages)
        allowed = self.allowed[a : b + 1].copy()
        allowed[0] = allowed[-1] = True
        return _Model(
            n=b - a,
            k=s1 - s0,
            work=self.work.window(a, b, stages),
            cut=self.cut[a : b + 1],
            speed=self.speed[s0:s1],
            tr_mul=self.tr_mul[s0:s1],
            tr_div=self.tr_div[s0:s1],
            tr_add=self.tr_add[s0:s1],
            overlap=self.overlap,
            allowed=allowed,
            mem=mem,
            mem_cap=None if self.mem_cap is None else self.mem_cap[s0:s1],
            mem_fac=None if self.mem_fac is None else self.mem_fac[s0:s1],
            first_receives=self.receives(s0),
            tie_rtol=self.tie_rtol,
            start=None if self.start is None else self.start[a : b + 1],
        )

    def evaluate(self, bounds: Sequence[int]) -> tuple[FloatArr, FloatArr, FloatArr]:
        """Per-stage (compute, transfer, cost) of a partition, bit-identical to the probe's values."""
        comp = np.empty(self.k)
        tr = np.zeros(self.k)
        cost = np.empty(self.k)
        for s in range(self.k):
            a = np.array([bounds[s]], dtype=np.intp)
            comp[s] = self.compute(s, a, bounds[s + 1])[0]
            tr[s] = self.transfer(s, a)[0]
            cost[s] = self.cost(s, a, bounds[s + 1])[0]
        return comp, tr, cost

    def bottleneck(self, bounds: Sequence[int]) -> float:
        """The largest stage cost of a partition, as :meth:`evaluate` reports it."""
        return float(self.evaluate(bounds)[2].max())

    @functools.cached_property
    def relaxation(self) -> tuple[list[FloatArr], list[float], list[float]]:
        """Work bounds for pruning: per stage ``s``, ``(rest_s, weight_s, slack_s)`` such that a start ``a``
        from which stages ``s..k-1`` can finish with every compute ``<= B`` has
        ``rest_s[a] <= B * weight_s * (1 + 1e-12) + slack_s`` (``rest_s`` non-increasing, ``rest_s[n] = 0``).

        One cost row (``speeds``): ``rest_s = P[n] - P``, ``weight_s = sum(speed[s:])``, no slack: the
        stages' compute times, scaled back by their speeds, add up to the work left.

        Several rows (``device_costs``; speeds are 1): a weighted sum of the stage loads.  For any weights
        ``w_t >= 0``, ``sum_t w_t * load_t >= sum_i min_t w_t * d[t][i]`` (each item is paid by the stage
        that runs it), and the left side is at most ``B * sum_t w_t``.  This is weak duality of the
        fractional-assignment linear programme; :func:`_dual_weights` picks weights that nearly maximise the
        bound.  ``slack_s`` covers every rounding (correctly rounded prefix sums, a cumulative sum of ``n``
        terms), generously: ``4 (n + 4) u (rest_s[0] + sum_{t >= s} w_t total_t)``.

        Both add :func:`_underflow_slack`: relative slack cannot cover a stage time that underflows
        (``5e-324 / 2`` rounds to ``0``), whose error is absolute.
        """
        n, k, work = self.n, self.k, self.work
        if len(work.prefix) == 1:
            p = work.prefix[0]
            rest = p[n] - p
            suffix_speed = np.cumsum(self.speed[::-1])[::-1]
            speed_left = [float(w) for w in suffix_speed]
            return [rest] * k, speed_left, [_underflow_slack(n, w) for w in speed_left]
        assert bool(np.all(self.speed == 1.0)), "several cost rows come with unit speeds"
        mult = np.bincount(np.array(work.of), minlength=len(work.prefix)).astype(np.float64)
        y = _dual_weights(work.rows, mult)
        cheapest = np.full(n, np.inf)
        weight = paid = 0.0
        rests: list[FloatArr] = []
        weights: list[float] = []
        slacks: list[float] = []
        for t in range(k - 1, -1, -1):
            row = work.of[t]
            w = float(y[row])
            cheapest = np.minimum(cheapest, w * work.rows[row])
            weight += w
            paid += w * float(work.prefix[row][n])
            rest = np.zeros(n + 1)
            rest[:n] = np.cumsum(cheapest[::-1])[::-1]
            rests.append(rest)
            weights.append(weight)
            slacks.append(4.0 * (n + 4) * 2.0**-53 * (float(rest[0]) + paid) + _underflow_slack(n, weight))
        return rests[::-1], weights[::-1], slacks[::-1]

    def spread_bound(self) -> float:
        """The work bound of the whole problem: no split has a bottleneck below it (up to rounding)."""
        rests, weights, _ = self.relaxation
        return float(rests[0][0]) / weights[0] if weights[0] > 0 else 0.0


def _underflow_slack(n: int, weight: float) -> float:
    """Absolute slack for the work bound of :attr:`_Model.relaxation`, against underflow.

    A stage time or a weighted item below the smallest normal float is rounded to a multiple of
    ``math.ulp(0.0)``, an error no relative margin covers: one item of work ``5e-324`` on a device of speed
    2 takes ``0.0``, so a bound of ``0`` is feasible, yet the work left (``5e-324``) exceeds ``0 * weight``.
    Each of at most ``n + k`` roundings loses less than one such ulp per unit of weight; ``4 (n + 4)`` of
    them, at weight at least 1, bound that generously and are far below any normal cost.
    """
    return 4.0 * (n + 4) * math.ulp(0.0) * max(1.0, weight)
