"""Vectorised array searches of the engine, exact whatever their inputs' quality.

They know nothing of stages or costs: one finds the latest end a monotone predicate allows, repairing
``searchsorted``'s floating-point guesses; the other takes minima over many intervals at once.  Kept
apart so the engine reads as the algorithm and these can be checked on plain arrays.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxpipe.partition.numeric import BoolArr, IntArr

_BIG = np.iinfo(np.intp).max
"""Marks "no value" in :func:`_range_chmin`'s output: larger than every key it is given."""


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


def _best_cover(
    size: int, left: IntArr, right: IntArr, order: IntArr, allowed: BoolArr
) -> tuple[BoolArr, IntArr]:
    """For each position ``0..size-1``: whether an interval ``[left[j], right[j]]`` covers it (and the
    position is ``allowed``), and the covering ``j`` that comes first in ``order`` (a preference order of
    the intervals: best first).  The layered passes' step, "the best start that can end here"."""
    rank = np.empty(order.size, dtype=np.intp)
    rank[order] = np.arange(order.size, dtype=np.intp)
    best = _range_chmin(size, left, right, rank)
    ok: BoolArr = (best < _BIG) & allowed
    return ok, order[np.where(ok, best, 0)]
