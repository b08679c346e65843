"""Which devices run the stages, in which order, and how many stages to make.

``--order free`` lets the planner choose the order of the devices (and, with fewer stages than devices,
which of them to use).  A pipeline's bottleneck depends on the order only through the *types* of devices
at each position: two devices with the same provider, speed, memory and threads are interchangeable
(:func:`onnxpipe.cluster.model.device_type`).  So, as in PipeEdge, the search runs over sequences of device
types, not over permutations of devices: a cluster of four edge boards of four speeds has 24 orders, but
eight devices of two types have only 70 distinct ones (8! / (4! 4!)) instead of 40,320.  Every distinct
sequence is solved *exactly* by the partitioner, so the best order found is the best there is; the
search refuses (with a message saying how to proceed) when there are more than ``max_orders`` sequences.

Links: a list of links describes consecutive devices in file order only, so reordering needs one link
shared by every pair (:attr:`onnxpipe.cluster.model.Cluster.uniform_link`).

``--stages auto`` (:func:`stages_auto`) tries every stage count and keeps the fewest stages whose
bottleneck is within a tolerance of the best, because each extra stage costs a device and adds latency
for little throughput once the pipeline is limited by its largest node or its links.

``--stages auto`` in the file's order (:class:`KeptDevices`): which devices to keep, leaving out those that
slow the pipeline. A plan of ``k`` stages in the file's order used to run on the first ``k`` devices, so a
slow device early in the file was in every plan of more stages than its position: its share of the work, or
the hop into it, bounded the pipeline below what the others reach without it (users of exo and llama.cpp
report that adding a slower machine made everything slower; prima.cpp drops such devices). Here each stage
count tries every choice of ``k`` devices that keeps their file order and best scores wins (ties: the choice
that comes first, so identical devices stay the first ones). Sets of devices of the same types over the same
links score the same and are solved once: ``n`` identical devices cost ``n`` solves, a slow one among them
about ``n^2 / 2``. Beyond :data:`MAX_SETS` distinct sets (many devices of many types) a backward elimination
stands in: from the whole file, drop the device whose absence scores best, again and again, and per count
keep the better of that set and the first ``k`` devices, so no plan gets worse than the prefix it replaces.
Leaving a device out from inside the file needs the one link every pair shares (a list of links joins
consecutive devices only: then only the ends of a run can go).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from onnxpipe.cluster.model import Cluster, device_type
from onnxpipe.core.choices import DeviceOrder, Objective
from onnxpipe.core.errors import PartitionError, UsageError
from onnxpipe.core.options import opt

DEFAULT_MAX_ORDERS = 20_000
"""Most distinct device-type sequences :func:`best_device_order` solves (each is one exact partition)."""
DEFAULT_TOLERANCE = 0.05
"""``--stages auto`` keeps the fewest stages within 5% of the best bottleneck."""
SCORE_TIE_RTOL = 1e-12
"""Scores closer than this are equal: the searches keep the choice found first (file order first)."""


class HasBottleneck(Protocol):
    """What the search needs from a partition result (:class:`onnxpipe.partition.Partition` has it)."""

    @property
    def bottleneck(self) -> float: ...

    @property
    def latency(self) -> float: ...


P = TypeVar("P", bound=HasBottleneck)


def score(result: HasBottleneck, objective: Objective) -> float:
    """What the searches minimise: the bottleneck (a stream), or one request's time through every stage
    and link (``latency``)."""
    return result.latency if objective == Objective.LATENCY else result.bottleneck


@dataclass(frozen=True)
class OrderSearch(Generic[P]):
    """The devices chosen for a ``k``-stage plan: ``order[i]`` is the index (in the file) of stage ``i``'s
    device; ``cluster`` is the arranged cluster and ``result`` the partition on it.

    ``evaluated`` counts the distinct type sequences solved; ``free`` says whether the order was searched
    or taken from the file.
    """

    order: tuple[int, ...]
    cluster: Cluster
    result: P
    evaluated: int
    free: bool

    @property
    def bottleneck(self) -> float:
        return self.result.bottleneck

    @property
    def latency(self) -> float:
        return self.result.latency

    @property
    def k(self) -> int:
        return len(self.order)


def type_ids(cluster: Cluster) -> tuple[int, ...]:
    """Each device's type as a small integer, numbered by first appearance in the file."""
    ids: dict[tuple[object, ...], int] = {}
    return tuple(ids.setdefault(device_type(d), len(ids)) for d in cluster.devices)


def count_orders(cluster: Cluster, k: int) -> int:
    """How many distinct type sequences of length ``k`` the cluster's devices can form."""
    counts = _counts(type_ids(cluster))
    memo: dict[tuple[tuple[int, ...], int], int] = {}

    def count(c: tuple[int, ...], r: int) -> int:
        if r == 0:
            return 1
        key = (c, r)
        if key not in memo:
            memo[key] = sum(count(_take(c, t), r - 1) for t in range(len(c)) if c[t] > 0)
        return memo[key]

    return count(counts, k)


def distinct_orders(cluster: Cluster, k: int) -> Iterator[tuple[int, ...]]:
    """Every distinct ordered choice of ``k`` devices up to swapping devices of one type.

    Yields device indices; for each type sequence the devices of a type are taken in file order (any
    would do).  File order itself (the first ``k`` devices) comes first, so that ties keep it.
    """
    ids = type_ids(cluster)
    counts = _counts(ids)
    by_type: list[list[int]] = [[] for _ in counts]
    for i, t in enumerate(ids):
        by_type[t].append(i)

    def indices(types: Sequence[int]) -> tuple[int, ...]:
        unused = [iter(devices) for devices in by_type]  # each type's devices, next first
        return tuple(next(unused[t]) for t in types)

    first = ids[:k]
    yield indices(first)

    def walk(prefix: list[int], c: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        if len(prefix) == k:
            if tuple(prefix) != first:
                yield indices(prefix)
            return
        for t in range(len(c)):
            if c[t] > 0:
                prefix.append(t)
                yield from walk(prefix, _take(c, t))
                prefix.pop()

    yield from walk([], counts)


def fixed_order(cluster: Cluster, k: int, solve: Callable[[Cluster], P]) -> OrderSearch[P]:
    """The first ``k`` devices in file order: the plan without ``--order free``."""
    arranged = cluster.prefix(k)
    return OrderSearch(tuple(range(k)), arranged, solve(arranged), 1, free=False)


def best_device_order(
    cluster: Cluster,
    k: int,
    solve: Callable[[Cluster], P],
    *,
    max_orders: int = DEFAULT_MAX_ORDERS,
    objective: Objective = Objective.THROUGHPUT,
) -> OrderSearch[P]:
    """The order (and choice) of ``k`` devices whose exact partition has the smallest bottleneck (or
    latency: ``objective``).

    ``solve(arranged)`` partitions the model over an arranged cluster (stage ``i`` on
    ``arranged.devices[i]``) and raises :class:`PartitionError` when nothing fits its memory; such orders
    are skipped.  Ties keep the order met first, file order first.  Exact: every distinct device-type
    sequence is solved.
    """
    if not 1 <= k <= cluster.size:
        raise UsageError(
            f"{cluster.source or 'cluster'}: {k} stages need {k} devices but the cluster has {cluster.size}; "
            f"choose {opt('stages')} between 1 and {cluster.size}"
        )
    total = count_orders(cluster, k)
    if k > 1 and len(set(type_ids(cluster))) > 1 and cluster.uniform_link is None:
        raise UsageError(
            f"{cluster.source or 'cluster'}: {opt('order', 'free')} needs the same link between every pair "
            "of "
            "devices; write links as one object, or keep the file's order"
        )
    if total > max_orders:
        raise UsageError(
            f"{cluster.source or 'cluster'}: {total} distinct device orders for {k} stages is more than "
            f"{max_orders}; give identical devices identical settings so they group into fewer types, "
            "or keep the file's order"
        )
    best: tuple[tuple[int, ...], Cluster, P] | None = None
    first_error: PartitionError | None = None
    for order in distinct_orders(cluster, k):
        arranged = cluster.arranged(order)
        try:
            result = solve(arranged)
        except PartitionError as e:
            first_error = first_error or e
            continue
        if best is None or score(result, objective) < score(best[2], objective) * (1 - SCORE_TIE_RTOL):
            best = (order, arranged, result)
    if best is None:
        assert first_error is not None
        raise PartitionError(
            f"no order of {k} of the {cluster.size} devices fits memory ({total} orders tried); "
            f"in file order: {first_error}"
        ) from first_error
    return OrderSearch(best[0], best[1], best[2], total, free=True)  # every distinct order was solved


def place(
    cluster: Cluster,
    k: int,
    solve: Callable[[Cluster], P],
    *,
    order: DeviceOrder = DeviceOrder.FIXED,
    objective: Objective = Objective.THROUGHPUT,
) -> OrderSearch[P]:
    """``--order fixed|free``: the first ``k`` devices in file order, or the best order and choice."""
    if order == DeviceOrder.FREE:
        return best_device_order(cluster, k, solve, objective=objective)
    return fixed_order(cluster, k, solve)


# --------------------------------------------------------------------------------------------------
# --stages auto


R = TypeVar("R", bound=HasBottleneck)


@dataclass(frozen=True)
class StagesChoice(Generic[R]):
    """The stage count ``--stages auto`` chose, its result, and each count's bottleneck (``inf``: no fit)."""

    k: int
    result: R
    bottlenecks: tuple[tuple[int, float], ...]
    reason: str


def stages_auto(
    max_k: int,
    solve_k: Callable[[int], R],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    objective: Objective = Objective.THROUGHPUT,
) -> StagesChoice[R]:
    """Choose the number of stages: the fewest within ``tolerance`` of the best bottleneck (or latency:
    ``objective``) over ``1..max_k``.  The table holds each count's score under the objective.

    ``solve_k(k)`` plans ``k`` stages (for example ``lambda k: place(cluster, k, solve, order=...)``) and
    raises :class:`PartitionError` when ``k`` stages cannot be made (memory, too few nodes); those counts
    are skipped.  More stages can be *slower* on a heterogeneous cluster (a slow device or link joins the
    pipeline), which is why every count is tried rather than stopping at the first that fits.
    """
    if not tolerance >= 0 or math.isinf(tolerance):
        raise UsageError(f"stage tolerance must be a non-negative number, got {tolerance}")
    if max_k < 1:
        raise UsageError(f"no stage count to try between 1 and {max_k}")
    results: dict[int, R] = {}
    last_error: PartitionError | None = None
    table: list[tuple[int, float]] = []
    for k in range(1, max_k + 1):
        try:
            r = solve_k(k)
        except PartitionError as e:
            last_error = e
            table.append((k, math.inf))
            continue
        results[k] = r
        table.append((k, score(r, objective)))
    if not results:
        assert last_error is not None
        raise PartitionError(f"no stage count from 1 to {max_k} fits: {last_error}") from last_error
    best = min(score(r, objective) for r in results.values())
    k = min(kk for kk, r in results.items() if score(r, objective) <= best * (1 + tolerance))
    what = "latency" if objective == Objective.LATENCY else "bottleneck"
    reason = (
        f"the fewest stages within {tolerance:.0%} of the best {what} ({best * 1e3:.3f} ms over 1..{max_k} "
        "stages)"
    )
    return StagesChoice(k, results[k], tuple(table), reason)


def _counts(ids: Sequence[int]) -> tuple[int, ...]:
    counted = Counter(ids)
    return tuple(counted[t] for t in range(max(ids, default=-1) + 1))


def _take(c: tuple[int, ...], t: int) -> tuple[int, ...]:
    return (*c[:t], c[t] - 1, *c[t + 1 :])


# --------------------------------------------------------------------------------------------------
# --stages auto in the file's order: the devices kept

MAX_SETS = 256
"""Most distinct device sets ``--stages auto`` solves, over all stage counts, to choose exactly."""


def joined(cluster: Cluster, kept: Sequence[int]) -> Cluster | None:
    """The devices at ``kept`` (ascending file indices) as a pipeline, or None when no link joins them."""
    i, j = kept[0], kept[-1]
    if list(kept) == list(range(i, j + 1)):
        return Cluster(cluster.devices[i : j + 1], cluster.links[i:j], cluster.source)
    return cluster.arranged(kept) if cluster.uniform_link is not None else None


class KeptDevices(Generic[P]):
    """For each stage count, the devices in file order whose plan scores best (see the module's text)."""

    def __init__(self, cluster: Cluster, solve: Callable[[Cluster], P], objective: Objective) -> None:
        self.cluster, self.solve, self.objective = cluster, solve, objective
        self.types = type_ids(cluster)
        self.solved: dict[tuple[object, ...], P | PartitionError] = {}
        self.chain: dict[int, tuple[int, ...]] | None = None
        n = cluster.size
        every = (c for k in range(1, n + 1) for c in itertools.combinations(range(n), k))
        self.exact = n <= 16 and len({self._key(c) for c in every} - {None}) <= MAX_SETS

    def _key(self, kept: tuple[int, ...]) -> tuple[object, ...] | None:
        """What the plan on ``kept`` depends on: the devices' types and the links between them (None:
        no link joins them)."""
        i, j = kept[0], kept[-1]
        link = self.cluster.uniform_link
        if kept == tuple(range(i, j + 1)):
            links = self.cluster.links[i:j]
        elif link is not None:
            links = (link,) * (len(kept) - 1)
        else:
            return None
        return (tuple(self.types[x] for x in kept), links)

    def result(self, kept: Sequence[int]) -> P:
        """The plan on the devices ``kept``; :class:`PartitionError` when nothing fits or no link joins
        them."""
        arranged, key = joined(self.cluster, kept), self._key(tuple(kept))
        if arranged is None or key is None:
            raise PartitionError(f"{self.cluster.label}: no link joins devices {list(kept)}")
        if key not in self.solved:
            try:
                self.solved[key] = self.solve(arranged)
            except PartitionError as e:
                self.solved[key] = e
        found = self.solved[key]
        if isinstance(found, PartitionError):
            raise found
        return found

    def score_of(self, kept: Sequence[int]) -> float:
        """The objective's score of the plan on ``kept``, ``inf`` when there is none."""
        try:
            return score(self.result(kept), self.objective)
        except PartitionError:
            return math.inf

    def _eliminated(self) -> dict[int, tuple[int, ...]]:
        """The backward elimination: the devices left at each count, from the whole file down to one."""
        current = tuple(range(self.cluster.size))
        chain = {len(current): current}
        while len(current) > 1:
            best: tuple[float, tuple[int, ...]] | None = None
            for d in reversed(current):  # the last device first: it goes on a tie
                kept = tuple(i for i in current if i != d)
                if joined(self.cluster, kept) is None:
                    continue
                s = self.score_of(kept)
                if best is None or s < best[0] * (1 - SCORE_TIE_RTOL):
                    best = (s, kept)
            assert best is not None  # dropping the last device always leaves a joined run
            current = best[1]
            chain[len(current)] = current
        return chain

    def search(self, k: int) -> OrderSearch[P]:
        """The ``k`` devices to plan on (:class:`PartitionError` when none fits)."""
        if self.exact:  # the first choice of each distinct set, in file order: the first k devices first
            first: dict[tuple[object, ...], tuple[int, ...]] = {}
            for c in itertools.combinations(range(self.cluster.size), k):
                key = self._key(c)
                if key is not None:
                    first.setdefault(key, c)
            candidates = list(first.values())
        else:
            if self.chain is None:
                self.chain = self._eliminated()
            candidates = [tuple(range(k)), self.chain[k]]
        kept = candidates[0]
        for c in candidates[1:]:
            if self.score_of(c) < self.score_of(kept) * (1 - SCORE_TIE_RTOL):
                kept = c
        arranged = joined(self.cluster, kept)
        assert arranged is not None
        return OrderSearch(kept, arranged, self.result(kept), len(candidates), free=False)

    def notes(self, chosen: OrderSearch[P]) -> list[str]:
        """A note for each device left out whose return would make the chosen plan worse, with the figures
        with and without it."""
        notes: list[str] = []
        without = score(chosen.result, self.objective)
        for d in range(self.cluster.size):
            if d in chosen.order:
                continue
            kept = tuple(sorted((*chosen.order, d)))
            if joined(self.cluster, kept) is None:
                continue
            worse = self.score_of(kept)
            if not without < worse < math.inf:  # it helps, or nothing fits with it: not a slower pipeline
                continue
            name = self.cluster.devices[d].name
            slower = "a request slower" if self.objective == Objective.LATENCY else "the pipeline slower"
            notes.append(
                f"{opt('stages', 'auto')} left out {name}, which makes {slower}: "
                f"{self._figure(without)} without it, {self._figure(worse)} with it"
            )
        return notes

    def _figure(self, value: float) -> str:
        if self.objective == Objective.LATENCY:
            return f"{value * 1e3:.3f} ms per request alone"
        return f"{1.0 / value:.1f} micro-batches/s" if value > 0 else "no time per micro-batch"
