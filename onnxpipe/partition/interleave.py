"""Interleaved stages: ``S = K * V`` contiguous stages on ``K`` workers, stage ``s`` on worker ``s % K``
(or ``K * V + 1``: the last stage back on worker 0 with the first, which then holds a table the first and
the last stage share, a tied token embedding and LM head, once).

Why
---
A contiguous split into ``K`` stages balances time, but a model's weights are rarely spread like its
time: ResNet-50's time-balanced halves hold 11% and 89% of its weights, so the second worker needs almost
a whole replica's memory, and the split that balances weights is far slower than the time-balanced one
(``benchmarks/results/interleave.json``).
Cutting the model into more stages than workers and dealing them out in turn (worker 0 runs stages 0 and
2, worker 1 stages 1 and 3, as in Megatron-LM's interleaved schedule) lets a worker take a cheap-in-weights
slice from the front and a heavy one from the back, so both the time and the weights of the workers can
be near ``1/K``.  Each worker still computes every micro-batch's share once, so the throughput bound is
the busiest worker's time per micro-batch.

Objective, lexicographic and exact
----------------------------------
A worker's load is the sum over its stages of compute (``costs`` summed over the stage's items) plus the
transfer into the stage (``cut_bytes[start] / bandwidth``; nothing for stage 0).  Its memory is the sum of
``item_mem`` over its stages' items.

1. ``fastest``: the smallest possible busiest-worker load, over every split.
2. Among the splits whose busiest worker is at most ``fastest * (1 + time_slack)``: the smallest
   largest worker memory, then the fewest bytes crossing cuts, then the lexicographically first bounds.

``time_slack`` is the price in throughput the caller accepts for memory balance: with 0 only exactly
fastest splits qualify.  Every split is examined: the search walks the cut positions in lexicographic
order, scores the last two cuts of every prefix at once with numpy, and skips a prefix only when a bound
proves that no completion of it can beat (or tie) the best split found so far; a prefix that leaves
too few positions for the cuts still to place is never formed.  At worst the search scores
``C(positions, S - 1)`` splits and forms ``sum_j C(positions - (S - 1 - j), j)`` prefixes in Python
(``j <= S - 3``), so requests beyond :data:`MAX_SPLITS` or :data:`MAX_PREFIXES` are refused with the
numbers rather than left to run for hours; the test oracle (``benchmarks/reference_dp.py``) enumerates
every split with ``itertools.combinations``.  Cut bytes are whole bytes for the tie-break (rounded),
so that their totals are exact in any order of summation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from onnxpipe.core.errors import PartitionError
from onnxpipe.partition.costmodel import _Model
from onnxpipe.partition.inputs import _check_bounds, _homogeneous_model, _vector
from onnxpipe.partition.numeric import FloatArr, IntArr, _prefix
from onnxpipe.partition.result import Partition, _partition_of

MAX_SPLITS = 60_000_000
"""Most splits (``C(allowed inner positions, S - 1)``) an interleaved search may have to score."""
MAX_PREFIXES = 100_000
"""Most prefixes the search may form one by one (each costs tens of microseconds in Python)."""

_MARGIN = 1.0 - 1e-12
"""Averages used to prune are shrunk by this much first: a sum computed in another order may round up by
a few ulps, and pruning must never drop a split that ties the best."""


@dataclass(frozen=True)
class InterleavedPartition:
    """A split into contiguous stages, stage ``s`` on worker ``workers[s]``.

    ``stages`` is the split as a chain of stages (a stage's cost its compute plus its transfer in); the
    other fields are what dealing the stages out to workers makes of it.
    """

    stages: Partition
    workers: tuple[int, ...]
    """The worker of each stage: ``s % k``."""
    worker_seconds: tuple[float, ...]
    """Per worker: the compute and transfers of all its stages, the time it is busy per micro-batch."""
    worker_memory: tuple[float, ...]
    """Per worker: ``item_mem`` summed over its stages' items (zeros without ``item_mem``)."""
    bottleneck: float
    """``max(worker_seconds)``: the steady-state time per micro-batch."""
    fastest: float
    """The smallest bottleneck any split reaches (criterion 1); ``bottleneck <= fastest * (1 + slack)``."""
    lower_bound: float
    """``sum(costs) / k``: no split of the work over ``k`` workers can do better."""

    @property
    def k(self) -> int:
        """The number of workers."""
        return len(self.worker_seconds)


@dataclass(frozen=True)
class _Sums:
    """Prefix sums and per-position transfer times, validated: the plain numbers every score comes from."""

    n: int
    k: int
    stages: int
    time: FloatArr  # prefix sums of costs, n + 1
    mem: FloatArr  # prefix sums of item_mem, n + 1
    xfer: FloatArr  # transfer time of a stage starting at p (0 at p = 0), n + 1
    cut: IntArr  # whole bytes crossing a cut at p, n + 1 (the tie-break; transfers use the exact values)
    positions: IntArr  # allowed inner cut positions, ascending
    chain: _Model  # the stages as a chain (one link into each, no overlap): what reports them

    def score(self, bounds: Sequence[int]) -> tuple[FloatArr, FloatArr, FloatArr, FloatArr]:
        """Per-stage compute and transfer, per-worker load and memory: the one formula for reporting."""
        b = np.asarray(bounds)
        comp = self.time[b[1:]] - self.time[b[:-1]]
        tr = self.xfer[b[:-1]]
        mem = self.mem[b[1:]] - self.mem[b[:-1]]
        owner = np.arange(len(comp)) % self.k
        load = np.zeros(self.k)
        wmem = np.zeros(self.k)
        for s in range(len(comp)):  # stage order, the order the search adds them in
            load[owner[s]] += comp[s] + tr[s]
            wmem[owner[s]] += mem[s]
        return comp, tr, load, wmem


def _sums(
    costs: Sequence[float],
    workers: int,
    stages: int,
    item_mem: Sequence[float] | None,
    cut_bytes: Sequence[float] | None,
    bandwidth: float,
    allowed_cuts: Sequence[bool] | None,
) -> _Sums:
    for name, v in (("workers", workers), ("stages", stages)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise PartitionError(f"{name} must be a positive integer, got {v!r}")
    s = int(stages)
    if s < workers or s % workers > 1:
        raise PartitionError(
            f"{s} stages cannot be dealt out to {workers} workers: give a multiple of {workers}, or one more"
        )
    model, _ = _homogeneous_model(costs, s, cut_bytes, bandwidth, allowed_cuts)
    n, cut = model.n, model.cut
    if cut.max(initial=0.0) >= 2.0**62:
        raise PartitionError("cut_bytes must be below 2**62 bytes")
    xfer = cut / model.tr_div[0]
    xfer[0] = 0.0
    mem = _vector("item_mem", item_mem, n, 0.0)
    return _Sums(
        n=n,
        k=workers,
        stages=s,
        time=model.prefix(0),
        mem=_prefix("item_mem", mem),
        xfer=xfer,
        cut=np.rint(cut).astype(np.int64),
        positions=np.flatnonzero(model.allowed[1:n]) + 1,
        chain=model,
    )


# --------------------------------------------------------------------------------------------------
# the exhaustive search


@dataclass
class _Prefix:
    """The first ``len(cuts)`` cuts of a split: the loads and memory of the stages they close."""

    cuts: tuple[int, ...]
    load: FloatArr
    mem: FloatArr


@dataclass(frozen=True)
class _Block:
    """Every completion of one prefix: the last ``r <= 2`` cuts, and each completion's score."""

    tails: IntArr  # (completions, r) cut positions
    max_load: FloatArr
    max_mem: FloatArr
    cut_bytes: IntArr


def _complete(t: _Sums, pre: _Prefix) -> _Block | None:
    """Score every way to place the remaining (at most two) cuts after ``pre``, vectorised."""
    j = len(pre.cuts)  # stage j starts at q
    q = pre.cuts[-1] if pre.cuts else 0
    r = t.stages - 1 - j
    after = t.positions[t.positions > q]
    if r == 0:
        tails = np.zeros((1, 0), dtype=np.intp)
    elif r == 1:
        tails = after[:, None]
    else:
        i, i2 = np.triu_indices(after.size, 1)  # row-major: lexicographic (b, c)
        tails = np.stack([after[i], after[i2]], axis=1)
    if tails.shape[0] == 0:
        return None
    starts = [np.full(tails.shape[0], q), *(tails[:, m] for m in range(r))]
    ends = [*(tails[:, m] for m in range(r)), np.full(tails.shape[0], t.n)]
    load = np.repeat(pre.load[:, None], tails.shape[0], axis=1)
    mem = np.repeat(pre.mem[:, None], tails.shape[0], axis=1)
    for m, (a, b) in enumerate(zip(starts, ends, strict=True)):  # stage order, as in _Sums.score
        w = (j + m) % t.k
        load[w] = load[w] + ((t.time[b] - t.time[a]) + t.xfer[a])
        mem[w] = mem[w] + (t.mem[b] - t.mem[a])
    prior = sum(int(t.cut[c]) for c in pre.cuts)
    cut = prior + t.cut[tails].sum(axis=1) if r else np.full(1, prior, dtype=np.int64)
    return _Block(tails, load.max(axis=0), mem.max(axis=0), cut)


def _walk(t: _Sums, keep: Callable[[_Prefix], bool], visit: Callable[[_Prefix, _Block], None]) -> None:
    """Visit every prefix of ``S - 1 - min(2, S - 1)`` cuts in lexicographic order that ``keep`` accepts
    (a rejected prefix's extensions are skipped too), with its block of completions."""
    depth = t.stages - 1 - min(2, t.stages - 1)

    def extend(pre: _Prefix) -> None:
        if not keep(pre):
            return
        if len(pre.cuts) == depth:
            block = _complete(t, pre)
            if block is not None:
                visit(pre, block)
            return
        j = len(pre.cuts)
        q = pre.cuts[-1] if pre.cuts else 0
        w = j % t.k
        start = int(np.searchsorted(t.positions, q, side="right"))
        stop = t.positions.size - (t.stages - 2 - j)  # leave a position for each later cut
        for c in t.positions[start:stop]:
            c = int(c)
            load = pre.load.copy()
            mem = pre.mem.copy()
            load[w] += (t.time[c] - t.time[q]) + t.xfer[q]
            mem[w] += t.mem[c] - t.mem[q]
            extend(_Prefix((*pre.cuts, c), load, mem))

    extend(_Prefix((), np.zeros(t.k), np.zeros(t.k)))


def _rest(t: _Sums, pre: _Prefix) -> tuple[float, float]:
    """Work and memory still to place after ``pre``: the open stage and every later one, transfers of
    later stages left out (they only add)."""
    q = pre.cuts[-1] if pre.cuts else 0
    work = float(t.time[t.n] - t.time[q] + t.xfer[q])
    return work, float(t.mem[t.n] - t.mem[q])


def _fastest(t: _Sums) -> float:
    """Criterion 1: the smallest busiest-worker load over every split."""
    best = math.inf

    def keep(pre: _Prefix) -> bool:
        work, _ = _rest(t, pre)
        lower = max(float(pre.load.max()), (float(pre.load.sum()) + work) / t.k * _MARGIN)
        return lower <= best

    def visit(pre: _Prefix, block: _Block) -> None:
        nonlocal best
        best = min(best, float(block.max_load.min()))

    _walk(t, keep, visit)
    return best


def _least_memory(t: _Sums, cap: float) -> tuple[int, ...]:
    """Criterion 2: among splits with every worker's load ``<= cap``, the least largest worker memory,
    then the fewest cut bytes, then the first bounds."""
    best: tuple[float, int, tuple[int, ...]] | None = None

    def keep(pre: _Prefix) -> bool:
        work, rest_mem = _rest(t, pre)
        if float(pre.load.max()) > cap or (float(pre.load.sum()) + work) / t.k * _MARGIN > cap:
            return False
        if best is None:
            return True
        return (
            float(pre.mem.max()) <= best[0] and (float(pre.mem.sum()) + rest_mem) / t.k * _MARGIN <= best[0]
        )

    def visit(pre: _Prefix, block: _Block) -> None:
        nonlocal best
        ok = np.flatnonzero(block.max_load <= cap)
        if ok.size == 0:
            return
        order = np.lexsort((block.cut_bytes[ok], block.max_mem[ok]))  # stable: ties keep bound order
        i = int(ok[order[0]])
        cand = (float(block.max_mem[i]), int(block.cut_bytes[i]), (*pre.cuts, *map(int, block.tails[i])))
        if best is None or cand < best:
            best = cand

    _walk(t, keep, visit)
    assert best is not None  # the fastest split itself satisfies the cap
    return best[2]


def _check_size(t: _Sums) -> None:
    p = int(t.positions.size)
    splits = math.comb(p, t.stages - 1)
    depth = t.stages - 1 - min(2, t.stages - 1)
    prefixes = sum(math.comb(p - (t.stages - 1 - j), j) for j in range(depth + 1))
    if splits > MAX_SPLITS or prefixes > MAX_PREFIXES:
        raise PartitionError(
            f"an interleaved split of {t.n} items into {t.stages} stages may have to examine {splits:,} "
            f"placements of its cuts (at most {MAX_SPLITS:,}) through {prefixes:,} prefixes (at most "
            f"{MAX_PREFIXES:,}): use fewer stages per worker or workers"
        )


def _result(t: _Sums, bounds: Sequence[int], fastest: float) -> InterleavedPartition:
    _, _, load, wmem = t.score(bounds)
    lower_bound = float(t.time[t.n]) / t.k
    return InterleavedPartition(
        stages=_partition_of(t.chain, lower_bound, bounds),
        workers=tuple(s % t.k for s in range(t.stages)),
        worker_seconds=tuple(float(x) for x in load),
        worker_memory=tuple(float(x) for x in wmem),
        bottleneck=float(load.max()),
        fastest=fastest,
        lower_bound=lower_bound,
    )


def solve_interleaved(
    costs: Sequence[float],
    workers: int,
    stages: int,
    *,
    item_mem: Sequence[float] | None = None,
    cut_bytes: Sequence[float] | None = None,
    bandwidth: float = math.inf,
    allowed_cuts: Sequence[bool] | None = None,
    time_slack: float = 0.0,
) -> InterleavedPartition:
    """The best split of ``costs`` into ``stages`` contiguous stages (``V * workers``, or one more: the
    last on worker 0 with the first) dealt out to ``workers`` workers in turn (criteria in the module
    docstring), found exactly.

    ``cut_bytes`` has one entry per position ``0..n``; ``allowed_cuts[p] = False`` forbids a boundary at
    ``p``.  Raises :class:`PartitionError` for impossible or malformed requests and for searches larger
    than :data:`MAX_SPLITS`.
    """
    if not (isinstance(time_slack, int | float) and math.isfinite(time_slack) and time_slack >= 0):
        raise PartitionError(f"time_slack must be a finite number >= 0, got {time_slack!r}")
    t = _sums(costs, workers, stages, item_mem, cut_bytes, bandwidth, allowed_cuts)
    _check_size(t)
    fastest = _fastest(t)
    bounds = (0, *_least_memory(t, fastest * (1.0 + time_slack)), t.n)
    return _result(t, bounds, fastest)


def evaluate_interleaved(
    costs: Sequence[float],
    workers: int,
    bounds: Sequence[int],
    *,
    item_mem: Sequence[float] | None = None,
    cut_bytes: Sequence[float] | None = None,
    bandwidth: float = math.inf,
) -> InterleavedPartition:
    """Score a given split with the solver's formula (``fastest`` is then this split's bottleneck)."""
    n = len(costs)
    b = _check_bounds(bounds, n)
    stages = len(b) - 1
    t = _sums(costs, workers, stages, item_mem, cut_bytes, bandwidth, None)
    load = t.score(b)[2]
    return _result(t, b, float(load.max()))
