"""The latency objective: the split whose stages and hops add up to the least time, exactly.

One request at a time (single-sequence decoding, a lone query) waits for every stage and every hop in
turn: its time is ``sum_s (compute_s + transfer_s)``, whether or not the links overlap compute for a
stream.  Written over the cuts, with ``C_s`` stage ``s``'s prefix sums over its speed, that sum is
``C_{K-1}[n] - C_0[0] + sum_{s >= 1} w_s(b_s)`` where ``w_s(p) = C_{s-1}[p] - C_s[p] + transfer_s(p)``:
on identical devices the compute telescopes away and only the hops are left; on different devices each
cut also pays (or earns) the change of speed of the items it moves.  So the best split is a shortest path
over cut positions, layer by layer: stage ``s`` may start at ``a`` and end anywhere in ``(a, r_s(a)]``
(its memory grows with its end: :class:`~onnxpipe.partition.engine._Engine`'s memory ends), which makes
each layer a minimum over the intervals covering each position (:meth:`_Engine.shortest`), ``O(n log n)``.
Float addition is monotone, so adding ``w`` after the minimum loses no optimum.  Ties (free links on
identical devices: every split costs the same) go to the fewest bytes crossing the cuts, then the
earliest positions.
"""

from __future__ import annotations

import math

from onnxpipe.partition.costmodel import _Model
from onnxpipe.partition.engine import _Engine, _smallest_uniform_cap
from onnxpipe.partition.numeric import FloatArr, IntArr
from onnxpipe.partition.result import _memory_error


def latency_bounds(model: _Model) -> tuple[int, ...]:
    """The bounds of the split of ``model`` with the least sum of stage and transfer times (memory caps
    and forbidden cuts respected), or :class:`MemoryFitError` naming the smallest cap when none fits:
    the engine's shortest path over the cuts, under no bound on a stage's time, weighed by ``w_s``."""
    found = _Engine(model).shortest(math.inf, lambda s, p: _cut_weight(model, s, p))
    if found is None:  # no stage fits anywhere its predecessors can end
        raise _memory_error(model, _smallest_uniform_cap(model))
    return found[1]


def _cut_weight(model: _Model, s: int, p: IntArr) -> FloatArr:
    """``w_s(p)``: what stage ``s`` starting at ``p`` adds to the latency beyond the constant ends: its
    transfer in, and the items before ``p`` paid at stage ``s - 1``'s speed instead of its own."""
    before = model.prefix(s - 1)[p] / model.speed[s - 1]
    after = model.prefix(s)[p] / model.speed[s]
    out: FloatArr = (before - after) + model.transfer(s, p)
    return out
