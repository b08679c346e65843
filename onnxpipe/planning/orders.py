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
"""

from __future__ import annotations

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
