"""The oracles of :mod:`onnxpipe.partition`: a plain ``O(K n^2)`` dynamic programme, and every
interleaved split scored one by one.

The DP shares the canonical cost formula (:class:`_Model`) and the tie-break rule (:func:`_choose`) with
the engine but none of its cleverness (no bisection, no pruning, no windows), so the engine's results must
equal its results exactly: same bounds, same bits.  Tests and benchmarks only (the package never runs
them); too slow beyond a few thousand items.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from onnxpipe.partition.costmodel import _Model
from onnxpipe.partition.inputs import HeterogeneousRequest, _heterogeneous_model, _homogeneous_model
from onnxpipe.partition.interleave import InterleavedPartition, _result, _sums
from onnxpipe.partition.numeric import FloatArr, IntArr
from onnxpipe.partition.result import Partition, _balanced, _choose, _memory_error, _partition_of


def reference_solve(
    costs: Sequence[float],
    k: int,
    *,
    cut_bytes: Sequence[float] | None = None,
    bandwidth: float = math.inf,
    allowed_cuts: Sequence[bool] | None = None,
) -> Partition:
    """:func:`~onnxpipe.partition.solve` by the reference DP."""
    return _reference_finish(*_homogeneous_model(costs, k, cut_bytes, bandwidth, allowed_cuts))


def reference_solve_heterogeneous(request: HeterogeneousRequest, k: int) -> Partition:
    """:func:`~onnxpipe.partition.solve_heterogeneous` by the reference DP."""
    return _reference_finish(*_heterogeneous_model(request, k))


def _reference_finish(model: _Model, lower: float) -> Partition:
    """Solve ``model`` by the DP and package the result exactly as the engine's ``_finish`` does."""
    return _partition_of(model, lower, _reference_bounds(model))


def _reference_bounds(model: _Model, *, balance: bool = True) -> tuple[int, ...]:
    """The DP's optimal bounds, tie-broken and balanced by the engine's very rules."""
    opt = _reference_min_bottleneck(model)
    if math.isinf(opt):
        raise _memory_error(model, _reference_min_bottleneck(model.memory_model()))
    bounds = _choose(model, opt, lambda t: _reference_min_bytes(model, t))
    if not balance:
        return bounds
    return _balanced(model, bounds, lambda sub: _reference_bounds(sub, balance=False))


def _ends(model: _Model, s: int) -> list[int]:
    """Where stage ``s`` may end: allowed cuts that leave every later stage an item; ``n`` for the last."""
    n, k = model.n, model.k
    ends = [n] if s == k - 1 else range(s + 1, n - (k - 1 - s) + 1)
    return [b for b in ends if model.allowed[b]]


def _starts(model: _Model, s: int, b: int, reached: FloatArr) -> IntArr:
    """Where stage ``s`` ending at ``b`` may start: positions the earlier stages reached (finite
    ``reached``) whose stage fits in memory."""
    a: IntArr = np.arange(s, b, dtype=np.intp)
    a = a[np.isfinite(reached[a])]
    if a.size:
        a = a[model.memory_ok(s, a, b)]
    return a


def _reference_min_bottleneck(model: _Model) -> float:
    """``best[b]`` = smallest bottleneck reaching ``b`` after ``s`` stages, over every previous start."""
    n, k = model.n, model.k
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    for s in range(k):
        new = np.full(n + 1, np.inf)
        for b in _ends(model, s):
            a = _starts(model, s, b, best)
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
        for b in _ends(model, s):
            a = _starts(model, s, b, val)
            a = a[model.cost(s, a, b) <= bound] if a.size else a
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


def reference_interleaved(
    costs: Sequence[float],
    workers: int,
    stages_per_worker: int,
    *,
    item_mem: Sequence[float] | None = None,
    cut_bytes: Sequence[float] | None = None,
    bandwidth: float = math.inf,
    allowed_cuts: Sequence[bool] | None = None,
    time_slack: float = 0.0,
) -> InterleavedPartition:
    """The test oracle: every split scored one by one with :meth:`_Sums.score`, the criteria applied
    literally."""
    t = _sums(costs, workers, workers * stages_per_worker, item_mem, cut_bytes, bandwidth, allowed_cuts)
    scored = []
    for inner in itertools.combinations((int(p) for p in t.positions), t.stages - 1):
        bounds = (0, *inner, t.n)
        _, _, load, wmem = t.score(bounds)
        cut = sum(int(t.cut[c]) for c in inner)
        scored.append((float(load.max()), float(wmem.max()), cut, bounds))
    fastest = min(s[0] for s in scored)
    cap = fastest * (1.0 + time_slack)
    best = min((s[1], s[2], s[3]) for s in scored if s[0] <= cap)
    return _result(t, best[2], fastest)
