"""A lower bound for a chain of items on devices in a fixed order, each item's time its device's own.

The solver's own bound for per-device costs (:attr:`onnxpipe.partition.costmodel._Model.relaxation`) lets
every item go to whichever device runs it cheapest, whatever the order: valid for any arrangement of the
devices, and the right seed for a search over orders, but loose when the devices' costs disagree item by
item.  Costs measured on different runtimes do: a runtime that fuses ``MatMul`` into the following
``Add`` reports the time on the ``Add`` and none on the ``MatMul``, another the other way round, and the
cheapest-device bound then counts almost nothing for either, so a plan that is balanced reads as far
from its bound.

This bound keeps what a pipeline keeps: stage ``s`` on device ``s`` runs one contiguous run of items,
and the runs follow one another in device order.  Only the items' indivisibility is relaxed: a device
may take part of an item (its time in proportion).  For a bottleneck ``T`` that relaxation is feasible
exactly when the devices, each taking as much of the chain as ``T`` allows from where the previous one
stopped, reach its end (taking more never leaves the next device worse off); the smallest feasible ``T``,
found by bisection, is the bound: compute only, so it holds under any transfer and memory model too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BISECTIONS = 60


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
