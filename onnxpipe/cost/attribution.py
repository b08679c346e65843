"""Regions joined across the tensors that are not anchors, and each region's measured time spread over its
original nodes (by FLOPs, else output elements)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from onnxpipe.core.text import names_text
from onnxpipe.cost.anchors import node_reads
from onnxpipe.cost.static import node_flops
from onnxpipe.cost.trace import Timing
from onnxpipe.cost.valuematch import Matched
from onnxpipe.ir.model import ModelView


class Weighting(Enum):
    """How a fused group's measured time was spread over its original nodes."""

    ALONE = "one node: nothing to spread"
    FLOPS = "by FLOPs"
    OUTPUT_ELEMENTS = "by output elements (the nodes have no FLOPs)"
    EQUAL = "in equal shares (nothing to weigh by)"


@dataclass
class Attribution:
    node_seconds: dict[str, float]
    regions: tuple[tuple[str, ...], ...]
    exact_fraction: float
    notes: list[str]


def attribute(view: ModelView, timing: Timing, matched: Matched) -> Attribution:
    """Join both graphs into regions and spread each region's measured time over its original nodes."""
    regions = _Regions(view, matched)
    seconds = {n.name: 0.0 for n in view.nodes if not n.is_constant}
    times = regions.times(timing)
    total = sum(times.values())
    tally = _spread_regions(regions, times, matched.shapes, seconds)
    notes = tally.notes(total)
    notes += _orphan_notes(regions, tally.orphans, matched.shapes, seconds)
    notes += _timing_notes(view, timing, total, seconds)
    return Attribution(
        node_seconds=seconds,
        regions=regions.groups(),
        exact_fraction=tally.exact / total if total > 0 else 1.0,
        notes=notes,
    )


class _Regions:
    """Both graphs' nodes joined into regions, each a fused group seen from both sides.

    Item ``i < n_o`` is original node ``i``, item ``n_o + j`` optimized node ``j``.  Two items share a
    region when a tensor only one graph holds links them, or when they make the same anchored value; a
    region's root is its smallest item.
    """

    def __init__(self, view: ModelView, matched: Matched) -> None:
        # networkx only where a profile is measured: importing it costs about 20 MB and 0.1 s, which a
        # split from a saved or static profile does not pay (as in onnxpipe.ir.graph.cycle_error)
        from networkx.utils import UnionFind

        self.view = view
        self.p_nodes = list(matched.optimized.graph.node)
        self.n_o = len(view.nodes)
        self.anchors = matched.anchors
        self.uf = UnionFind(range(self.n_o + len(self.p_nodes)))
        self.p_producer: dict[str, int] = {}
        self.p_consumers: dict[str, list[int]] = {}
        self._join_original(matched)
        self._join_optimized(matched)
        self._join_anchors()
        self.members = {min(g): sorted(g) for g in sorted(self.uf.to_sets(), key=min)}
        self.root = {i: root for root, items in self.members.items() for i in items}

    def _join_original(self, matched: Matched) -> None:
        """Original side: join across tensors the optimized graph does not hold."""
        view = self.view
        anchored_o = set(self.anchors.values()) | matched.duplicates
        for tensor, prod in view.producer.items():
            if tensor in anchored_o or tensor in matched.constant:
                continue
            for c in view.consumers.get(tensor, ()):
                self.uf.union(prod, c)

    def _join_optimized(self, matched: Matched) -> None:
        """Optimized side: join across tensors the original graph does not hold."""
        p_inits = {t.name for t in matched.optimized.graph.initializer}
        for j, n in enumerate(self.p_nodes):
            for out in n.output:
                if out:
                    self.p_producer[out] = j
            for read in dict.fromkeys(node_reads(n)):
                self.p_consumers.setdefault(read, []).append(j)
        for tensor, j in self.p_producer.items():
            if tensor in self.anchors or tensor in p_inits:
                continue
            for c in self.p_consumers.get(tensor, ()):
                self.uf.union(self.n_o + j, self.n_o + c)

    def _join_anchors(self) -> None:
        """Anchors: the two producers of one value are the same computation's ends."""
        for p_t, o_t in self.anchors.items():
            if p_t in self.p_producer and o_t in self.view.producer:
                self.uf.union(self.view.producer[o_t], self.n_o + self.p_producer[p_t])

    def times(self, timing: Timing) -> dict[int, float]:
        """Each region's measured seconds (regions whose optimized nodes took none are left out)."""
        times: dict[int, float] = {}
        for j, n in enumerate(self.p_nodes):
            s = timing.node_seconds.get(n.name, 0.0)
            if s:
                root = self.root[self.n_o + j]
                times[root] = times.get(root, 0.0) + s
        return times

    def compute_members(self, root: int) -> list[int]:
        """The region's original compute nodes (constants are never charged)."""
        return [i for i in self.members[root] if i < self.n_o and not self.view.nodes[i].is_constant]

    def p_names(self, root: int) -> list[str]:
        """The names of the region's optimized nodes."""
        return [self.p_nodes[i - self.n_o].name for i in self.members[root] if i >= self.n_o]

    def groups(self) -> tuple[tuple[str, ...], ...]:
        """The regions of two or more original compute nodes, by name, in the model's order."""
        nodes = self.view.nodes
        regions = []
        for root in sorted(self.members):
            targets = self.compute_members(root)
            if len(targets) >= 2:
                regions.append(tuple(nodes[i].name for i in sorted(targets)))
        position = {n.name: n.position for n in nodes}
        regions.sort(key=lambda r: position[r[0]])
        return tuple(regions)

    def neighbours(self, root: int) -> list[int]:
        """Regions that feed or read the region ``root`` (breadth first through regions without original
        compute nodes, until some are found)."""
        seen = {root}
        frontier = [root]
        while frontier:
            found: list[int] = []
            nxt: list[int] = []
            for k in (k for r in frontier for i in self.members[r] for k in self._linked(i)):
                rk = self.root[k]
                if rk in seen:
                    continue
                seen.add(rk)
                (found if self.compute_members(rk) else nxt).append(rk)
            if found:
                return sorted(found)
            frontier = nxt
        return []

    def _linked(self, i: int) -> list[int]:
        """The items item ``i`` reads from or feeds, an optimized node's anchored tensors' original
        producers and readers included."""
        view, n_o = self.view, self.n_o
        if i < n_o:
            tensors = list(view.nodes[i].reads) + list(view.nodes[i].outputs)
            near = [view.producer[t] for t in tensors if t in view.producer]
            return near + [c for t in view.nodes[i].outputs for c in view.consumers.get(t, ())]
        n = self.p_nodes[i - n_o]
        near = [n_o + self.p_producer[t] for t in n.input if t in self.p_producer]
        near += [n_o + c for t in n.output for c in self.p_consumers.get(t, ())]
        for t in list(n.input) + list(n.output):
            o_t = self.anchors.get(t)
            if o_t is not None:
                if o_t in view.producer:
                    near.append(view.producer[o_t])
                near += list(view.consumers.get(o_t, ()))
        return near


@dataclass
class _Tally:
    """What spreading the regions' times did, for the notes: the time charged to one node alone
    (``exact``), the fused groups split by FLOPs, the groups without FLOPs split otherwise, and the
    regions with no original node (``orphans``, by root), whose time is still to give away."""

    exact: float = 0.0
    fused: list[str] = field(default_factory=list)
    fused_sizes: list[int] = field(default_factory=list)
    fused_time: float = 0.0
    flopless: list[str] = field(default_factory=list)
    flopless_time: float = 0.0
    orphans: dict[int, float] = field(default_factory=dict)

    def notes(self, total: float) -> list[str]:
        """The notes on the fused groups split by FLOPs, then on those split otherwise."""
        notes: list[str] = []
        if self.fused:
            share = f" ({self.fused_time / total:.0%} of the time)" if total > 0 else ""
            sizes, names = self.fused_sizes, self.fused
            notes.append(
                f"{len(sizes)} fused group(s) of {min(sizes)}-{max(sizes)} original nodes, run as "
                f"{len(names)} optimized node(s) ({names_text(names, 6)}): their "
                f"{self.fused_time * 1e3:.3f} ms{share} were split by FLOPs; the groups are listed in regions"
            )
        if self.flopless:
            names, ms = self.flopless, self.flopless_time * 1e3
            notes.append(
                f"{len(names)} optimized node(s) ({names_text(names, 6)}) each ran a group of original nodes "
                f"without FLOPs (shape and data movement): their {ms:.3f} ms were split by output elements; "
                "the groups are listed in regions"
            )
        return notes


def _spread_regions(
    regions: _Regions,
    times: Mapping[int, float],
    shapes: Mapping[str, tuple[int, ...]],
    seconds: dict[str, float],
) -> _Tally:
    """Spread each region's time over its original compute nodes (:func:`_spread`); what it did."""
    tally = _Tally()
    for root, t in times.items():
        targets = regions.compute_members(root)
        if not targets:
            tally.orphans[root] = t
            continue
        how = _spread(regions.view, targets, t, shapes, seconds)
        if len(targets) == 1:
            tally.exact += t
        elif how is Weighting.FLOPS:
            tally.fused.extend(regions.p_names(root))
            tally.fused_time += t
            tally.fused_sizes.append(len(targets))
        else:
            tally.flopless.extend(regions.p_names(root))
            tally.flopless_time += t
    return tally


def _orphan_notes(
    regions: _Regions,
    orphans: Mapping[int, float],
    shapes: Mapping[str, tuple[int, ...]],
    seconds: dict[str, float],
) -> list[str]:
    """Give each region without an original node its time: to the neighbouring regions, else to every
    node; the notes that say so (one for all when there are more than five)."""
    nodes = regions.view.nodes
    notes: list[str] = []
    for root, t in orphans.items():
        near = regions.neighbours(root)
        if near:
            for r in near:
                _spread(regions.view, regions.compute_members(r), t / len(near), shapes, seconds)
            receivers = [nodes[i].name for r in near for i in regions.compute_members(r)]
        else:
            everyone = [i for i in range(regions.n_o) if not nodes[i].is_constant]
            if everyone:
                _spread(regions.view, everyone, t, shapes, seconds)
            receivers = ["every node"]
        notes.append(
            f"{names_text(regions.p_names(root), 4)}: work no original node does (a layout change or "
            f"copy); its {t * 1e3:.3f} ms went to the neighbouring node(s) {names_text(receivers, 4)}"
        )
    if len(notes) <= 5:
        return notes
    names = [n for root in orphans for n in regions.p_names(root)]
    return [
        f"{len(names)} optimized node(s) ({names_text(names, 6)}) compute values no original node holds "
        f"(layout changes, reorders): their {sum(orphans.values()) * 1e3:.3f} ms went to the "
        "neighbouring original nodes"
    ]


def _timing_notes(view: ModelView, timing: Timing, total: float, seconds: Mapping[str, float]) -> list[str]:
    """Notes on time measured outside the main graph, on a run with no kernel time, and on the nodes no
    kernel ran (folded or removed by the optimizer)."""
    notes: list[str] = []
    if timing.foreign_seconds > 0:
        notes.append(
            f"{len(timing.foreign_names)} profiler event(s) for nodes outside the optimized main graph "
            f"({names_text(timing.foreign_names, 4)}, inside subgraphs): their time is part of their parent's"
        )
    if total == 0 and timing.total_seconds > 0 and seconds:
        notes.append("onnxruntime reported no kernel time; every node time is 0 (the model does nothing)")
    folded = [n.name for n in view.nodes if not n.is_constant and seconds[n.name] == 0.0]
    if folded and total > 0:
        notes.append(
            f"{len(folded)} original node(s) run inside no measured kernel (folded or removed by the "
            f"optimizer) and cost 0: {names_text(folded, 4)}"
        )
    return notes


def _spread(
    view: ModelView,
    targets: Sequence[int],
    t: float,
    shapes: Mapping[str, tuple[int, ...]],
    out: dict[str, float],
) -> Weighting:
    """Add ``t`` seconds to the nodes at ``targets`` in proportion to FLOPs (else output elements)."""
    nodes = [view.nodes[i] for i in targets]
    if len(nodes) == 1:
        out[nodes[0].name] += t
        return Weighting.ALONE
    weights = [node_flops(view, n, shapes) for n in nodes]
    how = Weighting.FLOPS
    if sum(weights) <= 0:
        weights = [float(sum(math.prod(shapes.get(o, ())) for o in n.outputs if o in shapes)) for n in nodes]
        how = Weighting.OUTPUT_ELEMENTS
    if sum(weights) <= 0:
        weights = [1.0] * len(nodes)
        how = Weighting.EQUAL
    total = sum(weights)
    for n, w in zip(nodes, weights, strict=True):
        out[n.name] += t * w / total
    return how
