"""Numerics under the cost model: correctly rounded prefix sums, the weights of the work bound, and the
chain bound.

The first two sit below the model and the engine and belong to neither.  Every stage cost is a difference
of two prefix sums, so how those sums round decides whether the solver's verdicts are exact; the dual
weights only decide how tight a lower bound is, never whether it holds, so they may be searched
approximately.

The chain bound (:func:`chain_bound`) is a lower bound for a chain of items on devices in a fixed order,
each item's time its device's own.  The solver's own bound for per-device costs
(:attr:`onnxpipe.partition.costmodel._Model.relaxation`) lets every item go to whichever device runs it
cheapest, whatever the order: valid for any arrangement of the devices, and the right seed for a search
over orders, but loose when the devices' costs disagree item by item.  Costs measured on different
runtimes do: a runtime that fuses ``MatMul`` into the following ``Add`` reports the time on the ``Add``
and none on the ``MatMul``, another the other way round, and the cheapest-device bound then counts almost
nothing for either, so a plan that is balanced reads as far from its bound.

This bound keeps what a pipeline keeps: stage ``s`` on device ``s`` runs one contiguous run of items,
and the runs follow one another in device order.  Only the items' indivisibility is relaxed: a device
may take part of an item (its time in proportion).  For a bottleneck ``T`` that relaxation is feasible
exactly when the devices, each taking as much of the chain as ``T`` allows from where the previous one
stopped, reach its end (taking more never leaves the next device worse off); the smallest feasible ``T``,
found by bisection, is the bound: compute only, so it holds under any transfer and memory model too.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from onnxpipe.core.errors import PartitionError

FloatArr = NDArray[np.float64]
IntArr = NDArray[np.intp]
BoolArr = NDArray[np.bool_]

_DUAL_SAMPLE = 8192  # items the lower-bound weight search looks at (evenly spaced), at most
BISECTIONS = 60  # halvings of the chain bound's interval


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
    terms = [m << sh for m, sh in zip(imant.tolist(), shifts.tolist(), strict=True)]
    sums = list(itertools.accumulate(terms, initial=0))
    if emin >= 0:
        scale = 1 << emin
        out[:] = [float(x * scale) for x in sums]
    else:
        den = 1 << -emin
        out[:] = [x / den for x in sums]  # int / int is correctly rounded in CPython
    return out


def _prefix(name: str, values: FloatArr) -> FloatArr:
    """:func:`_exact_prefix` of the input called ``name``, refused when the total overflows: every stage
    cost would then be ``inf`` or NaN, which no bound can order."""
    try:
        out = _exact_prefix(values)
    except OverflowError:
        out = np.array([math.inf])
    if not math.isfinite(out[-1]):
        raise PartitionError(f"{name} sum to more than the largest float: rescale them (e.g. to seconds)")
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
    # a quotient too large for a float is as good as infinite here: the breakpoint lies past ``top``
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
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


def _reach(prefix: np.ndarray, start: float, budget: float) -> float:
    """How far (a fractional item position) a device with cumulative costs ``prefix`` gets from
    ``start`` spending ``budget``."""
    n = len(prefix) - 1
    i = min(int(start), n - 1) if n else 0
    at = prefix[i] + (prefix[i + 1] - prefix[i]) * (start - i) if n else 0.0
    target = at + budget
    if target >= prefix[n]:
        return float(n)
    j = int(np.searchsorted(prefix, target, side="right")) - 1  # prefix[j] <= target < prefix[j + 1]
    width = prefix[j + 1] - prefix[j]
    return float(j + ((target - prefix[j]) / width if width > 0 else 1.0))


def chain_bound(rows: Sequence[Sequence[float]], upper: float) -> float:
    """The smallest bottleneck of a fractional contiguous split of items over ``len(rows)`` devices in
    order (``rows[s][i]``: item ``i`` on device ``s``), to within ``upper * 2**-BISECTIONS`` below, so
    still a valid lower bound; ``upper`` is a feasible bottleneck (an actual split's)."""
    if not rows or upper <= 0:
        return 0.0
    prefixes = [np.concatenate(([0.0], np.cumsum(np.asarray(r, dtype=np.float64)))) for r in rows]
    n = len(prefixes[0]) - 1

    def feasible(t: float) -> bool:
        position = 0.0
        for prefix in prefixes:
            position = _reach(prefix, position, t)
            if position >= n:
                return True
        return False

    lo, hi = 0.0, float(upper)
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return lo * (1 - 1e-9)  # below every rounding of the prefix sums
