"""Graph questions on plain names and indices: topological orders, live bytes, what crosses a cut.

Nothing here touches protobuf.  Functions take a node list as ``deps[i]`` (tensors node ``i`` reads,
outer-scope reads of subgraphs included) and ``outs[i]`` (tensors it writes).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from onnxpipe.core.errors import ModelLoadError


def _producers(outs: Sequence[Sequence[str]]) -> dict[str, int]:
    return {t: i for i, o in enumerate(outs) for t in o}


def dfs_order(
    deps: Sequence[Sequence[str]],
    outs: Sequence[Sequence[str]],
    available: Iterable[str],
    labels: Sequence[str] | None = None,
) -> list[int]:
    """Kahn's algorithm with a ready *stack*: depth-first, so a branch runs to its join before the next.

    Breadth-first orders interleave parallel branches layer by layer and keep every branch's tensors live
    at once; depth-first keeps one branch's tensors live at a time.  Ties go to the file order, so the
    result is deterministic.  Raises :class:`ModelLoadError` on a cycle or a read of an undefined tensor.
    """
    order, succ = _kahn(deps, outs, available, depth_first=True)
    if len(order) != len(deps):
        raise cycle_error(sorted(set(range(len(deps))) - set(order)), succ, labels)
    return order


def stable_order(
    deps: Sequence[Sequence[str]], outs: Sequence[Sequence[str]], available: Iterable[str]
) -> list[int] | None:
    """Kahn's algorithm, the ready node of lowest index first (the file's order as far as it goes);
    ``None`` if some node cannot be placed."""
    order, _ = _kahn(deps, outs, available, depth_first=False)
    return order if len(order) == len(deps) else None


def _dependencies(
    deps: Sequence[Sequence[str]], outs: Sequence[Sequence[str]], available: Iterable[str]
) -> tuple[list[int], list[list[int]]]:
    """Each node's number of producer nodes and its reader nodes (``available`` tensors come from none)."""
    prod = _producers(outs)
    avail = set(available)
    indeg = [0] * len(deps)
    succ: list[list[int]] = [[] for _ in deps]
    for i, d in enumerate(deps):
        preds = {prod[t] for t in d if t in prod and t not in avail}
        indeg[i] = len(preds)
        for p in preds:
            succ[p].append(i)
    return indeg, succ


def _kahn(
    deps: Sequence[Sequence[str]],
    outs: Sequence[Sequence[str]],
    available: Iterable[str],
    *,
    depth_first: bool,
) -> tuple[list[int], list[list[int]]]:
    """The order Kahn's algorithm places (short of the nodes on or after a cycle) and each node's readers.

    Ready nodes wait in a heap by index; ``depth_first`` puts the ones a node readies ahead of all that
    waited before (a stack of batches, each by index), so a branch runs to its join before the next."""
    indeg, succ = _dependencies(deps, outs, available)
    ready = [(0, i) for i, k in enumerate(indeg) if k == 0]
    order: list[int] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for s in succ[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (-len(order) if depth_first else 0, s))
    return order, succ


def cycle_error(
    stuck: Sequence[int], succ: Sequence[Sequence[int]], labels: Sequence[str] | None
) -> ModelLoadError:
    """The error for nodes a topological order could not place: it names one cycle among them, node by
    node.  networkx finds it, imported here: only a graph that fails pays for the search and for the
    library (about 15 MB of memory that every split would otherwise carry)."""
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_edges_from((i, s) for i in stuck for s in succ[i] if s in set(stuck))
    name = (lambda i: labels[i]) if labels is not None else str
    try:
        cycle = [u for u, _ in nx.find_cycle(graph)]
    except nx.NetworkXNoCycle:  # unreachable: nodes left over by Kahn's algorithm lie on or after a cycle
        cycle = list(stuck[:1])
    shown = " -> ".join(repr(name(i)) for i in [*cycle, cycle[0]])
    return ModelLoadError(
        f"nodes {shown} form a cycle (each writes what the next one reads); the graph is not a DAG: "
        "re-export the model"
    )


def live_bytes_profile(
    order: Sequence[int],
    deps: Sequence[Sequence[str]],
    outs: Sequence[Sequence[str]],
    size: Mapping[str, int],
    initializers: Mapping[str, int] | Iterable[str],
    model_outputs: Sequence[str] = (),
) -> list[int]:
    """Bytes live across each cut point ``p = 1 .. n-1`` of ``order`` (initializers excluded): the
    :func:`cut_profile` of the nodes in that order, the model outputs they make read after the last."""
    made = {t for o in outs for t in o}
    last = [t for t in model_outputs if t in made]
    profile = cut_profile(
        [*(deps[i] for i in order), last], [*(outs[i] for i in order), ()], size, initializers
    )
    return list(profile[1 : len(order)])


def cut_profile(
    compute_deps: Sequence[Sequence[str]],
    compute_outs: Sequence[Sequence[str]],
    tensor_bytes: Mapping[str, int],
    free: Iterable[str],
    classes: Mapping[str, int] | None = None,
) -> tuple[int, ...]:
    """What crosses each cut between consecutive compute nodes, for nodes already in order; ``free``
    tensors (weights, constants) never cross.

    Item ``p`` for ``p = 0 .. m`` is the size of the tensors a stage starting at compute position ``p``
    must receive: produced before ``p`` (model inputs count as produced before 0) and read at or after
    ``p``.  In a linear pipeline these travel down the chain, skip connections included, so this is the
    load on the link in front of that stage.  Items ``0`` and ``m`` are 0 by convention.

    ``classes`` (:func:`onnxpipe.ir.shapevalues.value_classes`) counts provably equal tensors once: a cut
    carries a value while any tensor of it crosses, as the exported stages send one tensor of each value
    (:func:`onnxpipe.planning.stages.assign_stages`).  Without it every tensor counts, as if none were equal.
    """
    m = len(compute_deps)
    freeset = set(free)
    start = {t: p for p, o in enumerate(compute_outs) for t in o}
    last = {t: p for p, d in enumerate(compute_deps) for t in d if t not in freeset}
    crossing = [(t, start.get(t, -1) + 1, end) for t, end in last.items() if end > start.get(t, -1)]
    # spans of one value: a class's tensors (equal values have equal sizes; the largest if one is unknown)
    spans: dict[tuple[str, object], list[tuple[int, int, int]]] = {}
    for t, lo, hi in crossing:
        key = ("class", classes[t]) if classes is not None and t in classes else ("tensor", t)
        spans.setdefault(key, []).append((lo, hi, tensor_bytes.get(t, 0)))
    diff = np.zeros(m + 2, dtype=np.int64)
    for value in spans.values():
        b = max(x[2] for x in value)
        for lo, hi in _merged([(x[0], x[1]) for x in value]):
            diff[lo] += b
            diff[hi + 1] -= b
    live = np.cumsum(diff)[: m + 1]
    live[0] = 0
    live[m] = 0
    return tuple(int(x) for x in live)


def _merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of closed integer intervals ``[lo, hi]`` as disjoint ones, in order."""
    if len(intervals) == 1:
        return intervals
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def greedy_live_order(
    deps: Sequence[Sequence[str]],
    outs: Sequence[Sequence[str]],
    available: Iterable[str],
    size: Mapping[str, int],
) -> list[int]:
    """List scheduling that runs next the ready node that adds the fewest live bytes.

    A node's effect is the bytes it writes minus the bytes of inputs it reads for the last time.
    Effects change as other readers run, so the ready heap is refreshed lazily (a stale entry is
    re-pushed with its current effect).  Ties go to the most recently readied node, which keeps a branch
    going (depth-first) rather than interleaving branches.
    """

    prod = _producers(outs)
    avail = set(available)
    unique_deps = [tuple(dict.fromkeys(t for t in d if t not in avail or t in prod)) for d in deps]
    readers = Counter(t for ud in unique_deps for t in ud)
    indeg, succ = _dependencies(deps, outs, avail)

    def effect(i: int) -> int:
        freed = sum(size.get(t, 0) for t in unique_deps[i] if readers.get(t, 0) == 1)
        return sum(size.get(t, 0) for t in outs[i]) - freed

    n = len(deps)
    readied = itertools.count()  # the order nodes became ready in, the latest first on ties
    heap = [(effect(i), -next(readied), i) for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    done = [False] * n
    while heap:
        eff, neg_seq, i = heapq.heappop(heap)
        if done[i]:
            continue
        current = effect(i)
        if current != eff:
            heapq.heappush(heap, (current, neg_seq, i))
            continue
        done[i] = True
        order.append(i)
        for t in unique_deps[i]:
            readers[t] -= 1
        for s in sorted(succ[i]):
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (effect(s), -next(readied), s))
    if len(order) != n:
        raise cycle_error([i for i in range(n) if not done[i]], succ, None)
    return order
