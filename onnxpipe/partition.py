"""Exact contiguous K-way partitioning of a cost sequence (the pipeline-stage balancer).

Items ``0..n-1`` (nodes in a fixed topological order) carry non-negative compute costs.  A partition into
exactly ``K`` contiguous, non-empty stages is a tuple ``bounds = (0 = b_0 < b_1 < ... < b_K = n)``; stage
``s`` holds items ``[b_s, b_{s+1})``.  ``cut_bytes[p]`` is what a stage *starting* at position ``p`` must
receive; stage 0 receives nothing (``cut_bytes[0]`` is ignored).  This module knows nothing about ONNX: it
balances plain numbers, so it can be tested exhaustively and reused for any sequential workload.

Objective
---------
Stage ``s`` running on a device of speed ``speed[s]`` fed by a link of ``bandwidth[s]`` and ``latency[s]``::

    compute_s  = (P_s[b_{s+1}] - P_s[b_s]) / speed[s]       P_s = prefix sums of stage s's item costs
    transfer_s = cut_bytes[b_s] / bandwidth[s] + latency[s]  (0 for s = 0)
    cost_s     = compute_s + transfer_s        when transfers do not overlap compute
               = max(compute_s, transfer_s)    when they do (the link is its own pipeline resource)

and the bottleneck ``max_s cost_s`` is minimised *exactly*.  The item costs are one row shared by every
stage (``costs``, with ``speeds``), or one row per stage (``device_costs``: item ``i``'s time on the device
of stage ``s``; speeds are then 1).  The homogeneous issue (:func:`solve`) is the special case of one row,
``speed = 1``, one bandwidth, no latency, no overlap.  Optional memory limits require
``sum(item_mem in stage) + act_factor[s] * sum(item_act in stage) + cut_mem_factor[s] * cut_bytes[b_s]
<= mem_cap[s]`` (the first two summed per item, as prefix sums of ``item_mem + act_factor[s] * item_act``).

Tie-break: among splits whose bottleneck is within ``TIE_RTOL`` (relative 1e-9) of the optimum, the one
with the fewest bytes crossing cuts wins; when the tolerance saves no byte, an exactly optimal split is
returned.  Equal byte counts are settled deterministically: going from the last stage backwards, each
stage starts at the earliest position that keeps the choice optimal.

Why this algorithm
------------------
It is the bisection-with-exact-probe method for 1-D partitioning (Nicol, "Rectilinear partitioning of
irregular data parallel computations", JPDC 1994; Pinar & Aykanat, "Fast optimal load balancing algorithms
for 1D partitioning", JPDC 2004), adapted to stage costs that depend on where a stage *starts*:

* **Probe** ("is there a split with every stage ``<= B``?").  Stage ``s`` may run from ``a`` to ``b`` iff
  ``cost(s, a, b) <= B`` and its memory fits.  Costs are non-negative, so ``cost`` is non-decreasing in
  ``b`` and the feasible ends of a start form an interval ``(a, r_s(a)]``; ``r_s`` comes for all starts at
  once from ``numpy.searchsorted`` on the prefix sums.  The classic greedy probe (make every stage as long
  as possible) is **not** exact here: a shorter stage may end where the cut is far cheaper.  So the probe
  carries the whole *set* of positions reachable after ``s`` stages, layer by layer (a running maximum of
  ``r`` over the reachable starts marks the union of their intervals), and ``B`` is feasible iff ``n`` is
  reachable after ``K`` layers.  That is exact by induction over the layers.
* **Exactness in floating point.**  ``searchsorted`` only *proposes* ``r``: every proposal is checked
  with the one canonical cost formula (the one used to report stage costs) and repaired by a vectorised
  binary search where rounding made it wrong.  Prefix sums are correctly rounded (summed as integers),
  so ``cost`` is monotone in ``b`` and accurate to an ulp of the prefix sums.
* **Search.**  The optimum ``opt`` is always a realised stage cost.  After a feasible probe ``hi`` snaps
  down to the bottleneck of the split found (``<= B``).  After an infeasible probe ``lo`` snaps up to the
  smallest cost that would let some reachable start end one item later: below that value every
  reachable set, hence the verdict, is unchanged, so ``opt`` cannot lie there.  Hence ``lo <= opt <= hi``
  always, every probe moves ``lo`` above ``B`` or ``hi`` to at most ``B``, and the loop stops only at
  ``lo == hi``, which *is* the optimum: no tolerance is involved.  The first probes gallop upward from
  the lower bound; then ``B`` bisects ``[lo, hi]``, except that once the interval spans only a few snap
  distances the next probe asks directly "anything below ``hi``?", which usually ends the search.
* **Pruning.**  A start ``a`` of stage ``s`` is dropped when even perfect balancing could not fit the
  rest, ``P[n] - P[a] > B * sum(speed[s:])`` (with a 1e-12 margin against rounding); with per-stage rows,
  when the weighted work bound of the fractional-assignment LP over the stages left exceeds ``B``
  (:attr:`_Model.relaxation`).  Dropped starts feed the lower-bound snap with the ``B`` at which they
  would come back, which keeps the argument above valid.  When the optimum is close to the average load
  only a narrow band of positions survives per layer; when one huge item dictates the optimum the bands
  stay wide (every split is nearly as good).
* **Tie-break.**  A second layered pass minimises total cut bytes over splits whose stages all cost
  ``<= threshold``: each layer is a "minimum over the intervals covering each position" problem, solved
  with a sparse-table decomposition over packed ``(bytes, position)`` keys, ``O(n log n)`` per layer.
* **Memory.**  Memory limits only shorten ``r`` (a stage's memory grows with its end, whatever the
  per-stage factors).  Minimising the largest stage memory is the same problem (per-stage rows
  ``item_mem + act_factor[s] * item_act``, "transfer" ``cut_mem_factor * cut_bytes``), so when no split
  fits the caps the same engine computes the smallest uniform cap that would, exactly, for the error.

Cost: ``O(K w log n)`` per probe where ``w <= n`` is the band width, and a dozen or two probes.  Stages
with identical parameters (equal cost rows included: they are detected and stored once) share their ``r``
arrays, so the homogeneous mode pays ``searchsorted`` once per probe, not ``K`` times.  A plain
``O(K n^2)`` dynamic programme with the same cost formula and tie rules (:func:`_reference_solve`,
:func:`_reference_solve_heterogeneous`) is kept as the test oracle.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from onnxpipe.errors import MemoryFitError, PartitionError

__all__ = ["TIE_RTOL", "Partition", "evaluate", "evaluate_heterogeneous", "solve", "solve_heterogeneous"]

TIE_RTOL = 1e-9
"""Partitions whose bottleneck is within this relative distance of the optimum count as optimal when the
tie-break on cut bytes is applied."""

_PRUNE_MARGIN = 1e-12  # relative slack that makes the work-based pruning immune to rounding
_BIG = np.iinfo(np.intp).max
_ENDGAME = 16.0  # try 'anything better than hi?' once [lo, hi] spans <= 16 snap gaps (tuned)
_DUAL_SAMPLE = 8192  # items the lower-bound weight search looks at (evenly spaced), at most

FloatArr = NDArray[np.float64]
IntArr = NDArray[np.intp]
BoolArr = NDArray[np.bool_]


# ----------------------------------------------------------------------------------------------------------
# Public result
# ----------------------------------------------------------------------------------------------------------
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
    def ratio(self) -> float:
        """``bottleneck / lower_bound`` (>= 1; 1.0 when the lower bound is 0): how far from perfect."""
        if self.lower_bound == 0:
            return 1.0
        return self.bottleneck / self.lower_bound

    def stage_of(self, item: int) -> int:
        """The stage that runs ``item``."""
        if not 0 <= item < self.bounds[-1]:
            raise IndexError(f"item {item} is outside 0..{self.bounds[-1] - 1}")
        return bisect.bisect_right(self.bounds, item) - 1

    def ranges(self) -> list[range]:
        """The items of each stage, in stage order."""
        return [range(a, b) for a, b in itertools.pairwise(self.bounds)]


# ----------------------------------------------------------------------------------------------------------
# Internal model: one canonical cost formula shared by the solver, the reference and the report
# ----------------------------------------------------------------------------------------------------------
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

    def prefix(self, s: int) -> FloatArr:
        """Prefix sums of stage ``s``'s item costs (before speed scaling)."""
        return self.work.prefix[self.work.of[s]]

    def transfer(self, s: int, a: IntArr) -> FloatArr:
        """Transfer-in time of stage ``s`` for starts ``a`` (0 for the first stage)."""
        if s == 0:
            return np.zeros(a.shape, dtype=np.float64)
        out: FloatArr = (self.cut[a] * self.tr_mul[s]) / self.tr_div[s] + self.tr_add[s]
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
        if s == 0:
            return comp
        out: FloatArr = np.maximum(comp, tr) if self.overlap else comp + tr
        return out

    def memory(self, s: int, a: IntArr, b: IntArr | int) -> FloatArr:
        """Memory of stage ``s`` over ``[a, b)`` (same operations as the memory model's ``cost``)."""
        assert self.mem is not None and self.mem_fac is not None
        p = self.mem.prefix[self.mem.of[s]]
        held: FloatArr = p[b] - p[a]
        if s == 0:
            return held
        out: FloatArr = held + self.cut[a] * self.mem_fac[s]
        return out

    def memory_ok(self, s: int, a: IntArr, b: IntArr | int) -> BoolArr:
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
        """
        n, k, work = self.n, self.k, self.work
        if len(work.prefix) == 1:
            p = work.prefix[0]
            rest = p[n] - p
            suffix_speed = np.cumsum(self.speed[::-1])[::-1]
            return [rest] * k, [float(w) for w in suffix_speed], [0.0] * k
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
            slacks.append(4.0 * (n + 4) * 2.0**-53 * (float(rest[0]) + paid))
        return rests[::-1], weights[::-1], slacks[::-1]

    def spread_bound(self) -> float:
        """The work bound of the whole problem: no split has a bottleneck below it (up to rounding)."""
        rests, weights, _ = self.relaxation
        return float(rests[0][0]) / weights[0] if weights[0] > 0 else 0.0


# ----------------------------------------------------------------------------------------------------------
# Numeric helpers
# ----------------------------------------------------------------------------------------------------------
def _exact_prefix(values: FloatArr) -> FloatArr:
    """Correctly rounded prefix sums ``[0, v0, v0+v1, ...]`` of non-negative finite floats.

    Every float is an integer multiple of ``2**emin``, so the sums are computed exactly with Python
    integers and rounded once (about 50 ms at n = 100,000).  Each prefix is then within half an ulp of
    the true sum, so a stage's compute is exact to an ulp of the running total whatever ``n`` is, while
    ``numpy.cumsum``'s error grows with ``n`` (measured: 1.6e-14 of the total at n = 100,000).
    """
    out = np.zeros(values.size + 1)
    if values.size == 0:
        return out
    mant, exp = np.frexp(values)
    imant = (mant * 2.0**53).astype(np.int64)
    e = exp.astype(np.int64) - 53
    nz = imant != 0
    if not nz.any():
        return out
    emin = int(e[nz].min())
    shifts = np.where(nz, e - emin, 0)
    acc = 0
    sums = [0]
    append = sums.append
    for m, sh in zip(imant.tolist(), shifts.tolist(), strict=True):
        acc += m << sh
        append(acc)
    if emin >= 0:
        scale = 1 << emin
        out[:] = [float(x * scale) for x in sums]
    else:
        den = 1 << -emin
        out[:] = [x / den for x in sums]  # int / int is correctly rounded in CPython
    return out


def _dual_weights(rows: FloatArr, mult: FloatArr) -> FloatArr:
    """Weights ``y >= 0`` with ``sum(mult * y) = 1`` making ``f(y) = sum_i min_r y_r rows[r, i]`` large.

    ``f(y)`` is, for *any* such ``y``, a lower bound on the bottleneck of every assignment of the items to
    ``mult[r]`` devices of each kind ``r`` (weak duality of the fractional-assignment LP), so the search
    only affects how tight the bound is, never its validity.  Start: ``y_r`` proportional to
    ``1 / sum(rows[r])`` (the device's speed: the exact optimum when rows are proportional).  Then
    ``f`` -- concave, piecewise linear -- is maximised exactly along lines that trade weight between two
    kinds of adjacent total work (:func:`_best_on_line`), keeping the best point: for two kinds that one
    line gives the LP optimum; for more, a sweep up and back.  Beyond ``_DUAL_SAMPLE`` items the search
    looks at evenly spaced items only.
    """
    r, n = rows.shape
    total = rows.sum(axis=1)
    if not bool((total > 0).all()):  # a free device: the bound is 0 whatever the weights
        free = (total <= 0).astype(np.float64)
        out: FloatArr = free / float((mult * free).sum())
        return out
    y: FloatArr = float(total.min()) / total  # in (0, 1]: no overflow
    y = y / float((mult * y).sum())
    if r == 1:
        return y
    order = [int(x) for x in np.argsort(total, kind="stable")]
    lines = list(itertools.pairwise(order))
    if r > 2:
        lines += [(c, a) for a, c in reversed(lines)]
    if n > _DUAL_SAMPLE:  # search on evenly spaced items; any weights stay valid on all of them
        rows = rows[:, :: -(-n // _DUAL_SAMPLE)]
    best = float((y[:, None] * rows).min(axis=0).sum())
    for a, c in lines:
        others = [x for x in range(r) if x not in (a, c)]
        floor = (y[others, None] * rows[others]).min(axis=0) if others else np.full(rows.shape[1], np.inf)
        budget = float(mult[a] * y[a] + mult[c] * y[c])
        u = _best_on_line(rows[a], rows[c], floor, budget / float(mult[c]), float(mult[a] / mult[c]))
        ya, yc = u, (budget - float(mult[a]) * u) / float(mult[c])
        val = float(np.minimum(np.minimum(ya * rows[a], yc * rows[c]), floor).sum())
        if val > best:
            best = val
            y = y.copy()
            y[a], y[c] = ya, max(yc, 0.0)
    return y


def _best_on_line(p: FloatArr, q: FloatArr, floor: FloatArr, beta: float, kappa: float) -> float:
    """``argmax`` over ``u in [0, beta / kappa]`` of ``sum_i min(u p_i, (beta - kappa u) q_i, floor_i)``.

    Each term is concave: rising with slope ``p_i`` until ``lo_i``, flat (at ``floor_i``) until
    ``hi_i``, then falling with slope ``-kappa q_i``.  The sum's right derivative
    ``sum(p[lo > u]) - kappa * sum(q[hi <= u])`` only falls, so the maximum is at the first breakpoint
    where it is no longer positive: found with two sorts and cumulative sums.
    """
    top = beta / kappa
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = beta * q / (p + kappa * q)  # rising = falling
        reach = np.where(p > 0, floor / p, np.inf)  # rising meets the floor
        leave = np.where(q > 0, (beta - floor / q) / kappa, -np.inf)  # falling leaves the floor
    dead = (p <= 0) & (q <= 0)  # the term is 0 everywhere
    lo = np.where(dead, 0.0, np.minimum(reach, cross))
    hi = np.where(dead, 0.0, np.maximum(leave, cross))
    by_lo = np.argsort(lo, kind="stable")
    lo_sorted, p_cum = lo[by_lo], np.concatenate([[0.0], np.cumsum(p[by_lo])])
    by_hi = np.argsort(hi, kind="stable")
    hi_sorted, q_cum = hi[by_hi], np.concatenate([[0.0], np.cumsum(q[by_hi])])
    cand = np.concatenate([[0.0], lo, hi])
    cand = np.unique(cand[(cand >= 0) & (cand <= top)])
    rising = p_cum[-1] - p_cum[np.searchsorted(lo_sorted, cand, side="right")]
    falling = q_cum[np.searchsorted(hi_sorted, cand, side="right")]
    stop = np.flatnonzero(rising - kappa * falling <= 0)
    return float(cand[stop[0]]) if stop.size else top


def _monotone_search(
    a: IntArr, lim: IntArr, guess: IntArr, ok: Callable[[IntArr, IntArr], BoolArr]
) -> IntArr:
    """Largest ``b`` in ``[a, lim]`` with ``b == a or ok(i, b)``, where ``ok(i, b)`` judges ``b`` as an
    end for the starts ``a[i]`` and is true-then-false in ``b``.

    ``guess`` (from searchsorted) is usually exact; it is verified and, where rounding made it wrong,
    repaired by a vectorised binary search over just those entries — so the result is exact whatever
    the quality of the guess.
    """
    g = np.minimum(np.maximum(guess, a), lim)
    bad = np.zeros(a.size, dtype=bool)
    chk = np.flatnonzero(g > a)
    if chk.size:
        bad[chk] = ~ok(chk, g[chk])
    up = np.zeros(a.size, dtype=bool)
    cand = np.flatnonzero(~bad & (g < lim))
    if cand.size:
        up[cand] = ok(cand, g[cand] + 1)
    lo = np.where(up, g + 1, np.where(bad, a, g))
    hi = np.where(up, lim, np.where(bad, g - 1, g))
    todo = np.flatnonzero(lo < hi)
    if todo.size:
        low, high = lo[todo], hi[todo]
        act = np.flatnonzero(low < high)
        while act.size:
            mid = (low[act] + high[act] + 1) // 2
            good = ok(todo[act], mid)
            low[act] = np.where(good, mid, low[act])
            high[act] = np.where(good, high[act], mid - 1)
            act = act[low[act] < high[act]]
        lo[todo] = low
    return lo


def _range_chmin(size: int, left: IntArr, right: IntArr, vals: IntArr) -> IntArr:
    """``out[i] = min(vals[j] for j with left[j] <= i <= right[j])`` (``_BIG`` where none), vectorised.

    Each interval is covered by two overlapping power-of-two blocks (sparse-table style); block minima
    are then pushed down level by level.  ``O((size + m) log size)``.
    """
    length = right - left + 1
    level = (np.frexp(length.astype(np.float64))[1] - 1).astype(np.intp)
    top = int(level.max())
    table = np.full((top + 1) * size, _BIG, dtype=np.intp)
    np.minimum.at(table, level * size + left, vals)
    np.minimum.at(table, level * size + right - (np.left_shift(1, level)) + 1, vals)
    tab = table.reshape(top + 1, size)
    for j in range(top, 0, -1):
        half = 1 << (j - 1)
        cnt = size - (1 << j) + 1
        row = tab[j, :cnt]
        np.minimum(tab[j - 1, :cnt], row, out=tab[j - 1, :cnt])
        np.minimum(tab[j - 1, half : half + cnt], row, out=tab[j - 1, half : half + cnt])
    out: IntArr = tab[0].copy()
    return out


# ----------------------------------------------------------------------------------------------------------
# The engine: exact probe, exact search, tie-break
# ----------------------------------------------------------------------------------------------------------
@dataclass
class _Probe:
    feasible: bool
    bounds: tuple[int, ...] | None
    next_lo: float  # if infeasible: no bottleneck below this value is feasible


@dataclass
class _Layer:
    """Starts of one stage: a window of positions ``lo..lo+len(mask)-1``, which of them are reachable, and
    their latest ends ``r`` under the probed bound and the hard cap ``lim`` on any end (memory, items
    left for later stages; a plain int when only the latter applies)."""

    lo: int
    mask: BoolArr
    r: IntArr
    lim: IntArr | int


class _Lazy:
    """An ``int`` array over positions ``0..n-1`` filled on demand over one contiguous computed range."""

    def __init__(self, n: int, compute: Callable[[int, int], IntArr]) -> None:
        self.values = np.empty(max(n, 1), dtype=np.intp)
        self.compute = compute  # (lo, hi) -> values for positions lo..hi
        self.lo, self.hi = 0, -1

    def get(self, lo: int, hi: int) -> IntArr:
        if self.lo > self.hi:
            self.values[lo : hi + 1] = self.compute(lo, hi)
            self.lo, self.hi = lo, hi
        else:
            if lo < self.lo:
                self.values[lo : self.lo] = self.compute(lo, self.lo - 1)
                self.lo = lo
            if hi > self.hi:
                self.values[self.hi + 1 : hi + 1] = self.compute(self.hi + 1, hi)
                self.hi = hi
        return self.values[lo : hi + 1]


class _Engine:
    """Exact probes of one :class:`_Model`.

    Sets of positions are bit masks over a moving window, so a layer costs a handful of contiguous numpy
    operations.  Stages with identical parameters (all but the first in the homogeneous mode) share one
    lazily filled array of latest ends per probe; memory limits are computed once, lazily.
    """

    def __init__(self, model: _Model) -> None:
        self.m = model
        n, k = model.n, model.k
        keys: dict[tuple[float, ...], int] = {}
        mem_keys: dict[tuple[float, ...], int] = {}
        self.group: list[int] = []
        self.mem: list[_Lazy | None] = []
        for s in range(k):
            cap = float(model.mem_cap[s]) if model.mem_cap is not None else math.inf
            fac = float(model.mem_fac[s]) if model.mem_fac is not None and s > 0 else 0.0
            row = model.work.of[s]
            mrow = model.mem.of[s] if model.mem is not None else -1
            if s == 0:
                key: tuple[float, ...] = (0.0, float(model.speed[0]), cap, row, mrow)
            else:
                key = (
                    1.0,
                    float(model.speed[s]),
                    float(model.tr_mul[s]),
                    float(model.tr_div[s]),
                    float(model.tr_add[s]),
                    cap,
                    fac,
                    row,
                    mrow,
                )
            self.group.append(keys.setdefault(key, len(keys)))
            mkey = (float(s == 0), cap, fac, mrow)
            if math.isinf(cap):
                self.mem.append(None)
            elif mkey in mem_keys:
                self.mem.append(self.mem[mem_keys[mkey]])
            else:
                mem_keys[mkey] = s
                self.mem.append(_Lazy(n, functools.partial(self._memory_ends, s)))
        counts = np.bincount(np.array(self.group), minlength=len(keys))
        self.shared = [bool(c > 1) for c in counts]
        self.win_hi = [n - (k - 1 - s) for s in range(k)]  # later stages need one item each
        rests, weights, self.slack = model.relaxation
        self.work_w = [w * (1.0 + _PRUNE_MARGIN) for w in weights]
        negs: dict[int, FloatArr] = {}  # one array when every stage shares it
        for r in rests:
            if id(r) not in negs:
                negs[id(r)] = -r
        self.neg_rest = [negs[id(r)] for r in rests]  # non-decreasing: -(work left after a)
        self.positions = np.arange(n + 1, dtype=np.intp)

    # -- ends --------------------------------------------------------------------------------------------
    def _memory_ends(self, s: int, lo: int, hi: int) -> IntArr:
        """Latest end of stage ``s`` allowed by its memory cap, for starts ``lo..hi``."""
        m = self.m
        assert m.mem_cap is not None and m.mem is not None and m.mem_fac is not None
        a = self.positions[lo : hi + 1]
        room = float(m.mem_cap[s]) - (m.cut[a] * m.mem_fac[s] if s > 0 else 0.0)
        p = m.mem.prefix[m.mem.of[s]]
        guess = (np.searchsorted(p, p[a] + room, side="right") - 1).astype(np.intp)

        def ok(i: IntArr, bb: IntArr) -> BoolArr:
            return m.memory_ok(s, a[i], bb)

        return _monotone_search(a, np.full(a.size, m.n, dtype=np.intp), guess, ok)

    def _time_ends(self, s: int, a: IntArr, bound: float, lim: IntArr) -> IntArr:
        m = self.m
        tr = m.transfer(s, a)
        p = m.prefix(s)
        pa = p[a]
        # How much prefix sum the stage may still add; only a guess, _monotone_search makes it exact.
        room = np.where(tr <= bound, bound * m.speed[s], -1.0) if m.overlap else (bound - tr) * m.speed[s]
        guess = (np.searchsorted(p, pa + room, side="right") - 1).astype(np.intp)

        def ok(i: IntArr, bb: IntArr) -> BoolArr:
            out: BoolArr = m.combine(s, (p[bb] - pa[i]) / m.speed[s], tr[i]) <= bound
            return out

        return _monotone_search(a, lim, guess, ok)

    def _unclipped_ends(self, s: int, lo: int, hi: int, bound: float) -> IntArr:
        """Latest end of stage ``s`` under ``bound`` and memory only (no window), starts ``lo..hi``."""
        mem = self.mem[s]
        lim = mem.get(lo, hi) if mem is not None else np.full(hi - lo + 1, self.m.n, dtype=np.intp)
        return self._time_ends(s, self.positions[lo : hi + 1], bound, lim)

    def ends(
        self, s: int, lo: int, hi: int, bound: float, cache: dict[int, _Lazy]
    ) -> tuple[IntArr, IntArr | int]:
        """``(r, lim)`` for starts ``lo..hi`` of stage ``s``: the latest end with cost ``<= bound``, and
        the hard cap on any end (memory, and one item left for every later stage)."""
        mem = self.mem[s]
        win = self.win_hi[s]
        lim: IntArr | int = win if mem is None else np.minimum(mem.get(lo, hi), win)
        g = self.group[s]
        if self.shared[g]:
            lazy = cache.get(g)
            if lazy is None:
                lazy = _Lazy(self.m.n, lambda x, y: self._unclipped_ends(s, x, y, bound))
                cache[g] = lazy
            return np.minimum(lazy.get(lo, hi), win), lim
        lim_arr = np.full(hi - lo + 1, win, dtype=np.intp) if isinstance(lim, int) else lim
        return self._time_ends(s, self.positions[lo : hi + 1], bound, lim_arr), lim

    def _first_alive(self, s: int, bound: float) -> int:
        """First start of stage ``s`` whose remaining work fits the remaining stages even perfectly
        balanced (:attr:`_Model.relaxation`).  Sound: a start that can finish has
        ``rest_s[a] <= bound * weight_s + slack_s`` up to a few ulps, far inside ``_PRUNE_MARGIN``."""
        return int(np.searchsorted(self.neg_rest[s], -(bound * self.work_w[s] + self.slack[s]), side="left"))

    def _comeback(self, s: int, a: int) -> float:
        """A bound below which pruned start ``a`` of stage ``s`` stays pruned (keeps snapping valid).

        The pruning test is monotone in the bound, so it suffices that the value returned is pruned."""
        rest, w, slack = float(-self.neg_rest[s][a]), self.work_w[s], self.slack[s]
        if not (w > 0 and rest > slack):  # cannot happen for a pruned start; stay safe anyway
            return 0.0
        out = ((rest - slack) / w) * (1.0 - 1e-15)
        while out > 0 and not rest > out * w + slack:
            out *= 1.0 - 2.0**-50
        return max(out, 0.0)

    # -- probe -------------------------------------------------------------------------------------------
    def probe(self, bound: float) -> _Probe:
        """Is there a partition with every stage cost ``<= bound``?  Exact (see module docstring)."""
        m = self.m
        n, k = m.n, m.k
        cache: dict[int, _Lazy] = {}
        layers: list[_Layer] = []
        comeback = math.inf
        lo, mask = 0, np.ones(1, dtype=bool)
        feasible = False
        for s in range(k):
            first = self._first_alive(s, bound)
            if first > lo:
                dropped = mask[: first - lo]
                if dropped.any():
                    last = lo + dropped.size - 1 - int(dropped[::-1].argmax())
                    comeback = min(comeback, self._comeback(s, last))
                mask = mask[first - lo :]
                lo = first
            if not mask.any():
                break
            i0 = int(mask.argmax())
            i1 = mask.size - int(mask[::-1].argmax())
            mask = mask[i0:i1]
            lo += i0
            hi = lo + mask.size - 1
            r, lim = self.ends(s, lo, hi, bound, cache)
            layers.append(_Layer(lo, mask, r, lim))
            if s == k - 1:
                feasible = bool(mask[r == n].any())
                break
            reach = np.where(mask, r, -1)
            np.maximum.accumulate(reach, out=reach)
            top = int(reach[-1])
            if top <= lo:
                break
            if top - lo > reach.size:
                reach = np.concatenate([reach, np.full(top - lo - reach.size, top, dtype=np.intp)])
            mask = (reach[: top - lo] >= self.positions[lo + 1 : top + 1]) & m.allowed[lo + 1 : top + 1]
            lo += 1
        if feasible:
            bounds = [n]
            for layer in reversed(layers):
                b = bounds[-1]
                upto = b - layer.lo
                covers = layer.mask[:upto] & (layer.r[:upto] >= b)
                idx = int(np.argmax(covers))  # the earliest reachable start that can end at b
                assert covers[idx]
                bounds.append(layer.lo + idx)
            return _Probe(True, tuple(reversed(bounds)), math.nan)
        return _Probe(False, None, min(comeback, self._next_bound(layers, cache)))

    def _next_bound(self, layers: list[_Layer], cache: dict[int, _Lazy]) -> float:
        """Smallest cost at which some reachable start could end one item later than it can now."""
        m = self.m
        nxt = math.inf
        union: dict[int, BoolArr] = {}
        for s, layer in enumerate(layers):
            grow = layer.mask & (layer.r < layer.lim)
            g = self.group[s]
            if self.shared[g]:  # same r for every stage of the group: evaluate each start once
                if g not in union:
                    union[g] = np.zeros(m.n, dtype=bool)
                union[g][layer.lo : layer.lo + grow.size] |= grow
                continue
            idx = np.flatnonzero(grow)
            if idx.size:
                nxt = min(nxt, float(m.cost(s, layer.lo + idx, layer.r[idx] + 1).min()))
        for g, grown in union.items():
            a = np.flatnonzero(grown)
            if a.size:
                r = cache[g].values[a]
                nxt = min(nxt, float(m.cost(self.group.index(g), a, r + 1).min()))
        return nxt

    # -- exact minimum bottleneck ------------------------------------------------------------------------
    def min_bottleneck(self, guess: float) -> tuple[float, tuple[int, ...]] | None:
        """The exact optimum and a partition achieving it, or ``None`` if no bound is feasible.

        Invariant: ``lo <= opt <= hi``.  Until a first feasible probe, ``mid`` gallops upward from the
        lower-bound guess; afterwards it bisects.  Every probe moves ``lo`` above ``mid`` or ``hi`` to at
        most ``mid``, so the loop ends, and it ends only when ``lo == hi == opt``.
        """
        lo, hi = 0.0, math.inf
        best: tuple[int, ...] | None = None
        mid = guess * (1.0 - _PRUNE_MARGIN) if guess > 0 and math.isfinite(guess) else 0.0
        step = 0.0
        while lo < hi:
            if not lo <= mid < hi:
                if math.isinf(hi):
                    step = lo * 2.0**-16 if step == 0.0 else step * 8.0
                    mid = lo + step
                else:
                    mid = lo + (hi - lo) * 0.5
                if not lo <= mid < hi:
                    mid = lo
            res = self.probe(mid)
            if res.feasible:
                assert res.bounds is not None
                best = res.bounds
                hi = self.m.bottleneck(best)
                assert hi <= mid, (hi, mid)
                gap = mid - hi
            else:
                if math.isinf(res.next_lo):
                    return None
                lo = max(math.nextafter(mid, math.inf), res.next_lo)
                gap = lo - mid
            # Endgame: the snap distances estimate how far apart realised costs lie here.  When the
            # interval is only a few of those apart, ask directly whether anything beats ``hi``: if not,
            # that single probe proves optimality instead of a long creep of tiny ``lo`` steps.
            mid = math.nan
            if math.isfinite(hi) and hi - lo <= _ENDGAME * gap:
                mid = math.nextafter(hi, -math.inf)
        assert best is not None and lo == hi, (lo, hi)
        return hi, best

    # -- tie-break ---------------------------------------------------------------------------------------
    def min_bytes(self, bound: float) -> tuple[float, tuple[int, ...]]:
        """Fewest total cut bytes over partitions with every stage cost ``<= bound`` (must be feasible).

        Layered DP: value(b) = cut[b] + min over starts a covering b of value(a).  Candidates are ordered
        by ``(value, position)`` so the minimum is unique and the choice deterministic (earliest start).
        When values are integers (bytes) the pair is packed into one int64 key; otherwise it is ranked.
        """
        m = self.m
        n, k = m.n, m.k
        if not m.cut[1:n].any():  # all values 0: the probe's reconstruction makes the same choice, cheaper
            res = self.probe(bound)
            assert res.bounds is not None
            return 0.0, res.bounds
        cache: dict[int, _Lazy] = {}
        lo, vals = 0, np.zeros(1)
        preds: list[tuple[int, IntArr]] = []
        for s in range(k):
            first = self._first_alive(s, bound)
            if first > lo:
                vals = vals[first - lo :]
                lo = first
            live = np.isfinite(vals)
            i0 = int(live.argmax())
            i1 = live.size - int(live[::-1].argmax())
            vals = vals[i0:i1]
            lo += i0
            hi = lo + vals.size - 1
            r, _ = self.ends(s, lo, hi, bound, cache)
            if s == k - 1:
                hit = np.flatnonzero((r == n) & np.isfinite(vals))
                j = int(hit[np.argmin(vals[hit])])  # argmin: first (earliest) among equal values
                total = float(vals[j])
                bounds = [n, lo + j]
                for plo, parr in reversed(preds):
                    bounds.append(int(parr[bounds[-1] - plo]))
                return total, tuple(reversed(bounds))
            idx = np.flatnonzero(np.isfinite(vals) & (r > self.positions[lo : hi + 1]))
            r2, v2 = r[idx], vals[idx]
            base = lo + int(idx[0])
            offset = idx - (base - lo)  # position - base, ascending
            size = int(r2.max()) - base
            shift = max(size, 1).bit_length()
            if v2.max() < 2.0 ** (62 - shift) and bool(np.all(v2 == np.floor(v2))):
                keys = (v2.astype(np.intp) << shift) | offset  # (value, position) in one integer
                best = _range_chmin(size, offset, r2 - base - 1, keys)
                ok = (best < _BIG) & m.allowed[base + 1 : base + 1 + size]
                pred = np.where(ok, base + (best & ((1 << shift) - 1)), -1)
            else:
                order = np.argsort(v2, kind="stable").astype(np.intp)  # ties: earlier position first
                rank = np.empty(order.size, dtype=np.intp)
                rank[order] = np.arange(order.size, dtype=np.intp)
                best = _range_chmin(size, offset, r2 - base - 1, rank)
                ok = (best < _BIG) & m.allowed[base + 1 : base + 1 + size]
                pred = np.where(ok, base + offset[order[np.where(ok, best, 0)]], -1)
            prev = vals[np.maximum(pred - lo, 0)]  # value of the chosen start (junk where not ok)
            lo = base + 1
            preds.append((lo, pred))
            vals = np.where(ok, prev + m.cut[lo : lo + size], np.inf)
        raise AssertionError("unreachable")


# ----------------------------------------------------------------------------------------------------------
# Reference: plain O(K n^2) dynamic programme (test oracle; same canonical costs, same tie rules)
# ----------------------------------------------------------------------------------------------------------
def _reference_min_bottleneck(model: _Model) -> float:
    """``best[b]`` = smallest bottleneck reaching ``b`` after ``s`` stages, over every previous start."""
    n, k = model.n, model.k
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    for s in range(k):
        new = np.full(n + 1, np.inf)
        ends = [n] if s == k - 1 else range(s + 1, n - (k - 1 - s) + 1)
        for b in ends:
            if not model.allowed[b]:
                continue
            a = np.arange(s, b, dtype=np.intp)
            a = a[np.isfinite(best[a])]
            if a.size == 0:
                continue
            a = a[model.memory_ok(s, a, b)]
            if a.size:
                new[b] = float(np.maximum(best[a], model.cost(s, a, b)).min())
        best = new
    return float(best[n])


def _reference_min_bytes(model: _Model, bound: float) -> tuple[float, tuple[int, ...]]:
    """Fewest cut bytes with every stage ``<= bound``; predecessor = smallest ``(bytes, position)``."""
    n, k = model.n, model.k
    val = np.full(n + 1, np.inf)
    val[0] = 0.0
    preds: list[IntArr] = []
    for s in range(k):
        new = np.full(n + 1, np.inf)
        pred = np.full(n + 1, -1, dtype=np.intp)
        ends = [n] if s == k - 1 else range(s + 1, n - (k - 1 - s) + 1)
        for b in ends:
            if not model.allowed[b]:
                continue
            a = np.arange(s, b, dtype=np.intp)
            a = a[np.isfinite(val[a])]
            if a.size == 0:
                continue
            a = a[model.memory_ok(s, a, b) & (model.cost(s, a, b) <= bound)]
            if a.size:
                j = int(a[np.lexsort((a, val[a]))[0]])
                pred[b] = j
                new[b] = val[j] + (model.cut[b] if b < n else 0.0)
        preds.append(pred)
        val = new
    bounds = [n]
    for s in range(k - 1, -1, -1):
        bounds.append(int(preds[s][bounds[-1]]))
    return float(val[n]), tuple(reversed(bounds))


# ----------------------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------------------
def _choose(
    model: _Model, opt: float, min_bytes: Callable[[float], tuple[float, tuple[int, ...]]]
) -> tuple[int, ...]:
    """The tie-break rule, shared by the engine and the reference so both pick the very same split.

    Fewest cut bytes among splits within ``TIE_RTOL`` of ``opt``; if that split is not exactly optimal,
    an exactly optimal split with as few bytes is preferred.  (Usually one DP pass: near-ties within
    1e-9 are rare.)  With no bytes on any inner cut there is nothing to trade: the exact pass decides.
    """
    loose = opt * (1.0 + TIE_RTOL)
    if loose == opt or not model.cut[1 : model.n].any():
        return min_bytes(opt)[1]
    loose_bytes, loose_bounds = min_bytes(loose)
    if model.bottleneck(loose_bounds) <= opt:
        return loose_bounds
    exact_bytes, exact_bounds = min_bytes(opt)
    return exact_bounds if exact_bytes <= loose_bytes else loose_bounds


def _memory_error(model: _Model, reference: bool) -> PartitionError:
    mem = model.memory_model()
    if reference:
        need = _reference_min_bottleneck(mem)
    else:
        found = _Engine(mem).min_bottleneck(min(float(p[-1]) for p in mem.work.prefix) / mem.k)
        assert found is not None
        need = found[0]
    assert model.mem_cap is not None
    return MemoryFitError(
        f"no split into {model.k} stages fits the memory caps (tightest {float(model.mem_cap.min()):.6g} "
        f"bytes); the smallest uniform cap that fits is {need:.17g} bytes: raise mem_caps or change k",
        need,
    )


def _finish(model: _Model, lower: float, reference: bool) -> Partition:
    """Solve ``model`` (fast engine, or the reference DP) and package the result."""
    if reference:
        opt = _reference_min_bottleneck(model)
        if math.isinf(opt):
            raise _memory_error(model, reference)
        bounds = _choose(model, opt, lambda t: _reference_min_bytes(model, t))
    else:
        engine = _Engine(model)
        found = engine.min_bottleneck(lower)
        if found is None:
            raise _memory_error(model, reference)
        bounds = _choose(model, found[0], engine.min_bytes)
    return _partition_of(model, lower, bounds)


def _partition_of(model: _Model, lower: float, bounds: Sequence[int]) -> Partition:
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


# ----------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------
def _vector(
    name: str,
    values: Sequence[float] | None,
    length: int,
    default: float,
    *,
    positive: bool = False,
    allow_inf: bool = False,
    hint: str = "",
) -> FloatArr:
    if values is None:
        return np.full(length, default, dtype=np.float64)
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise PartitionError(f"{name} must be a sequence of numbers ({exc})") from None
    if arr.ndim != 1 or arr.size != length:
        got = arr.size if arr.ndim == 1 else f"shape {arr.shape}"
        raise PartitionError(f"{name} has {got} entries but needs {length}{hint}")
    bad = np.isnan(arr) | (arr < 0) | (~allow_inf & np.isinf(arr)) | (positive & (arr == 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        need = "> 0" if positive else ">= 0"
        need += "" if allow_inf else " and finite"
        raise PartitionError(f"{name}[{i}] = {float(arr[i])!r} is invalid: every entry must be {need}")
    return arr


def _per_stage(
    name: str,
    values: Sequence[float] | None,
    k: int,
    default: float,
    *,
    positive: bool = False,
    allow_inf: bool = False,
) -> FloatArr:
    """Per-link values: accept K entries (entry 0, the link into stage 0, is ignored) or K-1 entries."""
    if values is not None and k > 1 and len(values) == k - 1:
        values = [default, *values]
    hint = f" (one per stage, entry 0 ignored; or {k - 1}, one per link)"
    return _vector(name, values, k, default, positive=positive, allow_inf=allow_inf, hint=hint)


def _check_k(k: int, n: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int | np.integer):
        raise PartitionError(f"k must be an integer number of stages, got {k!r}")
    if k < 1:
        raise PartitionError(f"k = {k} stages is impossible: ask for at least 1 stage")
    if n == 0:
        raise PartitionError("costs is empty: there are no items to split into stages")
    if k > n:
        raise PartitionError(f"cannot split {n} items into {k} non-empty stages: use k <= {n}")


def _allowed(allowed_cuts: Sequence[bool] | None, n: int, k: int) -> BoolArr:
    if allowed_cuts is None:
        allowed = np.ones(n + 1, dtype=bool)
    else:
        allowed = np.array(allowed_cuts, dtype=bool)
        if allowed.ndim != 1 or allowed.size != n + 1:
            raise PartitionError(
                f"allowed_cuts has {allowed.size} entries but needs n+1 = {n + 1} (one per position 0..n)"
            )
    allowed[0] = allowed[n] = True
    inner = int(allowed[1:n].sum())
    if inner < k - 1:
        raise PartitionError(
            f"allowed_cuts permits only {inner} cut positions but {k} stages need {k - 1}: "
            f"use k <= {inner + 1} or allow more cuts"
        )
    return allowed


def _prefix(name: str, values: FloatArr) -> FloatArr:
    try:
        out = _exact_prefix(values)
    except OverflowError:
        out = np.array([math.inf])
    if not math.isfinite(out[-1]):
        raise PartitionError(f"{name} sum to more than the largest float: rescale them (e.g. to seconds)")
    return out


def _costs(costs: Sequence[float]) -> FloatArr:
    try:
        n = len(costs)
    except TypeError:
        raise PartitionError(f"costs must be a sequence of numbers, got {type(costs).__name__}") from None
    return _vector("costs", costs, n, 0.0)


def _homogeneous_model(
    costs: Sequence[float],
    k: int,
    cut_bytes: Sequence[float] | None,
    bandwidth: float,
    allowed_cuts: Sequence[bool] | None,
) -> tuple[_Model, float]:
    c = _costs(costs)
    n = c.size
    _check_k(k, n)
    try:
        bw = float(bandwidth)
    except (TypeError, ValueError):
        bw = math.nan
    if not bw > 0:  # also rejects NaN
        raise PartitionError(f"bandwidth = {bandwidth!r} is invalid: give bytes per second > 0 (inf = free)")
    cut = _vector("cut_bytes", cut_bytes, n + 1, 0.0, hint=" (n+1: one per cut position 0..n)")
    model = _Model(
        n=n,
        k=k,
        work=_Work.single(c, _prefix("costs", c), k),
        cut=cut,
        speed=np.ones(k),
        tr_mul=np.ones(k),
        tr_div=np.full(k, bw),
        tr_add=np.zeros(k),
        overlap=False,
        allowed=_allowed(allowed_cuts, n, k),
    )
    lower = max(float(model.prefix(0)[n]) / k, float(c.max()))
    return model, lower


def _device_costs(device_costs: Sequence[Sequence[float]], k: int) -> FloatArr:
    """The ``k x n`` matrix of per-device item costs, validated (``k`` itself checked by the caller)."""
    try:
        arr = np.asarray(device_costs, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise PartitionError(
            f"device_costs must be one row of numbers per stage, all of the same length ({exc})"
        ) from None
    if arr.ndim != 2:
        raise PartitionError(
            f"device_costs has shape {arr.shape} but needs (k, n): one row per stage, one entry per item"
        )
    _check_k(k, arr.shape[1])
    if arr.shape[0] != k:
        raise PartitionError(f"device_costs has {arr.shape[0]} rows but needs {k} (one per stage)")
    bad = np.isnan(arr) | (arr < 0) | np.isinf(arr)
    if bad.any():
        s, i = (int(x) for x in np.argwhere(bad)[0])
        raise PartitionError(
            f"device_costs[{s}][{i}] = {float(arr[s, i])!r} is invalid: every entry must be >= 0 and finite"
        )
    return arr


def _memory_work(
    n: int,
    k: int,
    item_mem: Sequence[float],
    item_act: Sequence[float] | None,
    act_factor: Sequence[float] | None,
) -> _Work:
    """Per-stage item memory: ``item_mem[i] + act_factor[s] * item_act[i]`` (just ``item_mem`` without
    activations), one correctly rounded prefix array per distinct factor."""
    mem = _vector("item_mem", item_mem, n, 0.0, hint=" (one per item)")
    if item_act is None:
        return _Work.single(mem, _prefix("item_mem", mem), k)
    act = _vector("item_act", item_act, n, 0.0, hint=" (one per item)")
    fac = _vector("act_factor", act_factor, k, 0.0, hint=" (one per stage)")
    rows: dict[float, FloatArr] = {}
    for f in fac.tolist():
        if f not in rows:
            rows[f] = mem + f * act
    return _Work.table("item_mem + act_factor[{s}] * item_act", [rows[f] for f in fac.tolist()])


def _heterogeneous_model(
    costs: Sequence[float] | None,
    k: int,
    *,
    speeds: Sequence[float] | None,
    device_costs: Sequence[Sequence[float]] | None,
    cut_bytes: Sequence[float] | None,
    bandwidths: Sequence[float] | None,
    latencies: Sequence[float] | None,
    overlap: bool,
    item_mem: Sequence[float] | None,
    mem_caps: Sequence[float] | None,
    cut_mem_factor: Sequence[float] | None,
    item_act: Sequence[float] | None,
    act_factor: Sequence[float] | None,
    allowed_cuts: Sequence[bool] | None,
) -> tuple[_Model, float]:
    if device_costs is not None:
        if costs is not None:
            raise PartitionError(
                "give costs (with speeds) or device_costs, not both: with device_costs each stage's compute "
                "is the sum of its device's row, so pass costs=None"
            )
        if speeds is not None:
            raise PartitionError(
                "speeds and device_costs exclude each other: device_costs rows are already per-device times"
            )
        d = _device_costs(device_costs, k)
        n = d.shape[1]
        sp = np.ones(k)
        work = _Work.table("device_costs[{s}]", list(d))
        largest_item = float(d.min(axis=0).max())  # every item runs somewhere, at best on its fastest device
    else:
        if costs is None:
            raise PartitionError("costs is missing: give costs (with speeds), or device_costs")
        c = _costs(costs)
        n = c.size
        _check_k(k, n)
        sp = _vector("speeds", speeds, k, 1.0, positive=True, hint=" (one per stage)")
        work = _Work.single(c, _prefix("costs", c), k)
        largest_item = float(c.max()) / float(sp.max())
    bw = _per_stage("bandwidths", bandwidths, k, math.inf, positive=True, allow_inf=True)
    lat = _per_stage("latencies", latencies, k, 0.0)
    cut = _vector("cut_bytes", cut_bytes, n + 1, 0.0, hint=" (n+1: one per cut position 0..n)")
    if (item_mem is None) != (mem_caps is None):
        raise PartitionError("item_mem and mem_caps go together: give both to enforce memory, or neither")
    if cut_mem_factor is not None and mem_caps is None:
        raise PartitionError("cut_mem_factor needs item_mem and mem_caps: give them too, or drop it")
    if (item_act is None) != (act_factor is None):
        raise PartitionError(
            "item_act and act_factor go together: activation bytes per item, and per stage how many "
            "copies of them it holds; give both, or neither"
        )
    if item_act is not None and mem_caps is None:
        raise PartitionError(
            "item_act and act_factor need item_mem and mem_caps: give them too, or drop them"
        )
    mem = mem_cap = mem_fac = None
    if item_mem is not None:
        mem = _memory_work(n, k, item_mem, item_act, act_factor)
        mem_cap = _vector("mem_caps", mem_caps, k, math.inf, allow_inf=True, hint=" (one per stage)")
        mem_fac = _per_stage("cut_mem_factor", cut_mem_factor, k, 0.0)
    model = _Model(
        n=n,
        k=k,
        work=work,
        cut=cut,
        speed=sp,
        tr_mul=np.ones(k),
        tr_div=bw,
        tr_add=lat,
        overlap=bool(overlap),
        allowed=_allowed(allowed_cuts, n, k),
        mem=mem,
        mem_cap=mem_cap,
        mem_fac=mem_fac,
    )
    # the work bound: total work over total speed, or its generalisation (see _Model.relaxation)
    spread = model.spread_bound() if device_costs is not None else float(model.prefix(0)[n]) / float(sp.sum())
    lower = max(spread, largest_item)
    if k > 1:
        lower = max(lower, float(lat[1:].max()))  # every later stage pays its link's latency
    return model, lower


def _check_bounds(bounds: Sequence[int], n: int) -> list[int]:
    try:
        b = [int(x) for x in bounds]
    except (TypeError, ValueError):
        raise PartitionError(f"bounds must be integers, got {bounds!r}") from None
    if len(b) < 2 or b[0] != 0 or b[-1] != n or any(x >= y for x, y in itertools.pairwise(b)):
        raise PartitionError(f"bounds {tuple(b)} are not 0 < ... < n = {n} (strictly increasing, non-empty)")
    return b


# ----------------------------------------------------------------------------------------------------------
# Public entry points
# ----------------------------------------------------------------------------------------------------------
def solve(
    costs: Sequence[float],
    k: int,
    *,
    cut_bytes: Sequence[float] | None = None,
    bandwidth: float = math.inf,
    allowed_cuts: Sequence[bool] | None = None,
) -> Partition:
    """Split ``costs`` into ``k`` contiguous stages minimising the slowest stage, exactly.

    Stage cost = its compute (sum of item costs) + ``cut_bytes[start] / bandwidth`` (the time to receive
    its inputs; nothing for stage 0).  ``allowed_cuts[p] = False`` forbids a boundary at ``p`` (e.g. inside
    a fused group).  Among optimal splits (within ``TIE_RTOL``) the one moving the fewest bytes wins.

    Raises :class:`PartitionError` for impossible requests (``k`` outside ``1..n``, too few allowed cuts)
    and malformed inputs (negative or NaN costs, wrong lengths).
    """
    model, lower = _homogeneous_model(costs, k, cut_bytes, bandwidth, allowed_cuts)
    return _finish(model, lower, reference=False)


def solve_heterogeneous(
    costs: Sequence[float] | None,
    k: int,
    *,
    speeds: Sequence[float] | None = None,
    cut_bytes: Sequence[float] | None = None,
    bandwidths: Sequence[float] | None = None,
    latencies: Sequence[float] | None = None,
    overlap: bool = True,
    item_mem: Sequence[float] | None = None,
    mem_caps: Sequence[float] | None = None,
    cut_mem_factor: Sequence[float] | None = None,
    allowed_cuts: Sequence[bool] | None = None,
    device_costs: Sequence[Sequence[float]] | None = None,
    item_act: Sequence[float] | None = None,
    act_factor: Sequence[float] | None = None,
) -> Partition:
    """Split the items over ``k`` different devices in a fixed order, minimising the pipeline bottleneck.

    Compute, one of two ways:

    * ``costs`` with ``speeds``: stage ``s`` runs on device ``s`` in ``sum(costs[a:b]) / speeds[s]``
      (``speeds`` defaults to all 1);
    * ``device_costs`` (``costs=None``, no ``speeds``; giving either is refused): a ``k x n`` matrix,
      ``device_costs[s][i]`` = item ``i``'s time on the device of stage ``s`` (a per-device profile,
      per-op-type speed-ups...); stage ``s`` computes in ``sum(device_costs[s][a:b])``.  Equal rows are
      detected and share the solver's work.  Entries must be finite: like every stage sum here it is a
      difference of correctly rounded prefix sums, exact to an ulp of ``sum(device_costs[s][:b])``, so a
      huge placeholder for "cannot run" would blur that device's later sums.

    The link into stage ``s >= 1`` takes ``cut_bytes[start] / bandwidths[s] + latencies[s]`` (per-link
    lists take ``k`` entries with entry 0 ignored, or ``k - 1`` entries for the links alone; default: free
    links).  With ``overlap=True`` transfers run concurrently with compute, so each link is its own
    pipeline resource and a stage costs ``max(compute, transfer)``; with ``overlap=False`` their sum.

    Memory (optional, per stage): ``sum(item_mem[a:b]) + act_factor[s] * sum(item_act[a:b]) +
    cut_mem_factor[s] * cut_bytes[a]`` must not exceed ``mem_caps[s]`` — parameters (and optimizer state),
    activations kept for the micro-batches in flight on that stage (1F1B: ``min(M, k - s)``; GPipe: ``M``),
    and received inputs.  ``item_act``/``act_factor`` (``k`` entries, stage 0 included) are optional and go
    together; the per-item sums are ``item_mem[i] + act_factor[s] * item_act[i]``, correctly rounded.  If no
    split fits, :class:`MemoryFitError` names (and carries as ``smallest_fit_bytes``) the smallest cap that
    would fit every stage if all stages had it, computed with this very formula.

    ``lower_bound`` of the result: the largest of the work bound, the largest item on its fastest device,
    and the largest latency.  The work bound is the total work over the total speed, or with
    ``device_costs`` the fractional-assignment bound ``sum_i min_s w_s d[s][i] / sum_s w_s``, valid for
    any weights ``w >= 0`` (weak LP duality), with weights searched for the LP optimum: exact for two
    kinds of device, close for more (see ``_dual_weights``).
    """
    model, lower = _heterogeneous_model(
        costs,
        k,
        speeds=speeds,
        device_costs=device_costs,
        cut_bytes=cut_bytes,
        bandwidths=bandwidths,
        latencies=latencies,
        overlap=overlap,
        item_mem=item_mem,
        mem_caps=mem_caps,
        cut_mem_factor=cut_mem_factor,
        item_act=item_act,
        act_factor=act_factor,
        allowed_cuts=allowed_cuts,
    )
    return _finish(model, lower, reference=False)


def evaluate(
    costs: Sequence[float],
    bounds: Sequence[int],
    *,
    cut_bytes: Sequence[float] | None = None,
    bandwidth: float = math.inf,
) -> Partition:
    """Score a given split under :func:`solve`'s objective (a baseline, a hand-made or a saved split).

    Uses the very same cost formula as the solver, so ``evaluate(c, solve(c, k).bounds)`` reproduces the
    solver's numbers exactly and any other split can be compared with it fairly.
    """
    b = _check_bounds(bounds, len(costs))
    model, lower = _homogeneous_model(costs, len(b) - 1, cut_bytes, bandwidth, None)
    return _partition_of(model, lower, b)


def evaluate_heterogeneous(
    bounds: Sequence[int],
    costs: Sequence[float] | None,
    *,
    speeds: Sequence[float] | None = None,
    cut_bytes: Sequence[float] | None = None,
    bandwidths: Sequence[float] | None = None,
    latencies: Sequence[float] | None = None,
    overlap: bool = True,
    item_mem: Sequence[float] | None = None,
    mem_caps: Sequence[float] | None = None,
    cut_mem_factor: Sequence[float] | None = None,
    allowed_cuts: Sequence[bool] | None = None,
    device_costs: Sequence[Sequence[float]] | None = None,
    item_act: Sequence[float] | None = None,
    act_factor: Sequence[float] | None = None,
) -> Partition:
    """Score a given split under :func:`solve_heterogeneous`'s objective (``k = len(bounds) - 1``).

    Same arguments, same cost formula and same ``lower_bound``, so
    ``evaluate_heterogeneous(solve_heterogeneous(...).bounds, ...)`` reproduces the solver's result exactly
    and a baseline split can be compared with it fairly.  A split the solver could not return is refused
    with :class:`PartitionError`: a cut that ``allowed_cuts`` forbids, or a stage over its memory cap.
    """
    if device_costs is not None and costs is None:
        try:
            n = len(device_costs[0]) if len(device_costs) else 0
        except (TypeError, IndexError, KeyError):
            _device_costs(device_costs, 1)  # malformed: raises, saying what is wrong
            raise AssertionError("unreachable") from None
    else:
        n = len(costs) if costs is not None else 0
    b = _check_bounds(bounds, n)
    model, lower = _heterogeneous_model(
        costs,
        len(b) - 1,
        speeds=speeds,
        device_costs=device_costs,
        cut_bytes=cut_bytes,
        bandwidths=bandwidths,
        latencies=latencies,
        overlap=overlap,
        item_mem=item_mem,
        mem_caps=mem_caps,
        cut_mem_factor=cut_mem_factor,
        item_act=item_act,
        act_factor=act_factor,
        allowed_cuts=allowed_cuts,
    )
    for cut in b[1:-1]:
        if not model.allowed[cut]:
            raise PartitionError(f"bounds {tuple(b)} cut at {cut}, which allowed_cuts forbids")
    if model.mem_cap is not None:
        for s in range(model.k):
            held = float(model.memory(s, np.array([b[s]], dtype=np.intp), b[s + 1])[0])
            if not held <= model.mem_cap[s]:
                raise PartitionError(
                    f"bounds {tuple(b)}: stage {s} needs {held:.17g} bytes but mem_caps[{s}] is "
                    f"{float(model.mem_cap[s]):.17g}"
                )
    return _partition_of(model, lower, b)


def _reference_solve(
    costs: Sequence[float],
    k: int,
    *,
    cut_bytes: Sequence[float] | None = None,
    bandwidth: float = math.inf,
    allowed_cuts: Sequence[bool] | None = None,
) -> Partition:
    """:func:`solve` by the ``O(K n^2)`` reference DP (tests and benchmarks only)."""
    model, lower = _homogeneous_model(costs, k, cut_bytes, bandwidth, allowed_cuts)
    return _finish(model, lower, reference=True)


def _reference_solve_heterogeneous(
    costs: Sequence[float] | None,
    k: int,
    *,
    speeds: Sequence[float] | None = None,
    cut_bytes: Sequence[float] | None = None,
    bandwidths: Sequence[float] | None = None,
    latencies: Sequence[float] | None = None,
    overlap: bool = True,
    item_mem: Sequence[float] | None = None,
    mem_caps: Sequence[float] | None = None,
    cut_mem_factor: Sequence[float] | None = None,
    allowed_cuts: Sequence[bool] | None = None,
    device_costs: Sequence[Sequence[float]] | None = None,
    item_act: Sequence[float] | None = None,
    act_factor: Sequence[float] | None = None,
) -> Partition:
    """:func:`solve_heterogeneous` by the ``O(K n^2)`` reference DP (tests and benchmarks only)."""
    model, lower = _heterogeneous_model(
        costs,
        k,
        speeds=speeds,
        device_costs=device_costs,
        cut_bytes=cut_bytes,
        bandwidths=bandwidths,
        latencies=latencies,
        overlap=overlap,
        item_mem=item_mem,
        mem_caps=mem_caps,
        cut_mem_factor=cut_mem_factor,
        item_act=item_act,
        act_factor=act_factor,
        allowed_cuts=allowed_cuts,
    )
    return _finish(model, lower, reference=True)
