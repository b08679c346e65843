"""The latency objective: the split whose stages and hops add up to the least time, exactly.

One request at a time (single-sequence decoding, a lone query) waits for every stage and every hop in
turn: its time is ``sum_s (compute_s + transfer_s)``, whether or not the links overlap compute for a
stream.  Written over the cuts, with ``C_s`` stage ``s``'s prefix sums over its speed, that sum is
``C_{K-1}[n] - C_0[0] + sum_{s >= 1} w_s(b_s)`` where ``w_s(p) = C_{s-1}[p] - C_s[p] + transfer_s(p)``:
on identical devices the compute telescopes away and only the hops are left; on different devices each
cut also pays (or earns) the change of speed of the items it moves.  So the best split is a shortest path
over cut positions, layer by layer: stage ``s`` may start at ``a`` and end anywhere in ``(a, r_s(a)]``
(its memory grows with its end: :class:`~onnxpipe.partition.engine._Engine`'s memory ends), which makes
each layer a minimum over the intervals covering each position (:func:`_range_chmin`), ``O(n log n)``.
Float addition is monotone, so adding ``w`` after the minimum loses no optimum.  Ties (free links on
identical devices: every split costs the same) go to the fewest bytes crossing the cuts, then the
earliest positions.
"""

from __future__ import annotations

import math

import numpy as np

from onnxpipe.partition.costmodel import _Model
from onnxpipe.partition.engine import _Engine, _smallest_uniform_cap
from onnxpipe.partition.numeric import FloatArr, IntArr
from onnxpipe.partition.result import _memory_error
from onnxpipe.partition.scan import _best_cover


def latency_bounds(model: _Model) -> tuple[int, ...]:
    """The bounds of the split of ``model`` with the least sum of stage and transfer times (memory caps
    and forbidden cuts respected), or :class:`MemoryFitError` naming the smallest cap when none fits."""
    n, k = model.n, model.k
    engine = _Engine(model)
    positions = np.arange(n + 1, dtype=np.intp)
    vals = np.full(n + 1, math.inf)
    vals[0] = 0.0
    nbytes = np.zeros(n + 1)
    preds: list[IntArr] = []
    for s in range(k):
        last_start = n - (k - s)  # later stages need an item each
        starts = positions[: last_start + 1][np.isfinite(vals[: last_start + 1])]
        mem = engine.mem[s]
        ends = np.full(starts.size, n, dtype=np.intp) if mem is None else mem.get(0, last_start)[starts]
        ends = np.minimum(ends, n - (k - 1 - s))
        keep = ends > starts
        starts, ends = starts[keep], ends[keep]
        if starts.size == 0:  # no stage s fits anywhere its predecessors can end
            raise _memory_error(model, _smallest_uniform_cap(model))
        order = np.lexsort((starts, nbytes[starts], vals[starts])).astype(np.intp)
        ok, chosen = _best_cover(n + 1, starts + 1, ends, order, model.allowed)
        pred = np.where(ok, starts[chosen], -1)
        preds.append(pred)
        nbytes = np.where(ok, nbytes[np.maximum(pred, 0)] + model.cut, 0.0)
        vals = np.where(ok, vals[np.maximum(pred, 0)], math.inf)
        if s + 1 < k:
            vals = vals + _cut_weight(model, s + 1, positions)
    if not math.isfinite(vals[n]):
        raise _memory_error(model, _smallest_uniform_cap(model))
    bounds = [n]
    for pred in reversed(preds):
        bounds.append(int(pred[bounds[-1]]))
    return tuple(reversed(bounds))


def _cut_weight(model: _Model, s: int, p: IntArr) -> FloatArr:
    """``w_s(p)``: what stage ``s`` starting at ``p`` adds to the latency beyond the constant ends: its
    transfer in, and the items before ``p`` paid at stage ``s - 1``'s speed instead of its own."""
    before = model.prefix(s - 1)[p] / model.speed[s - 1]
    after = model.prefix(s)[p] / model.speed[s]
    out: FloatArr = (before - after) + model.transfer(s, p)
    return out
