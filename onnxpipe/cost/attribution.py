"""Regions joined across the tensors that are not anchors, and each region's measured time spread over its
original nodes (by FLOPs, else output elements)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import onnx

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


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:
            self.parent[i], i = root, self.parent[i]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def attribute(view: ModelView, timing: Timing, matched: Matched) -> Attribution:
    """Join both graphs into regions and spread each region's measured time over its original nodes."""
    o_nodes = view.nodes
    p_nodes = list(matched.optimized.graph.node)
    n_o = len(o_nodes)
    uf = _UnionFind(n_o + len(p_nodes))
    anchors = matched.anchors
    anchored_o = set(anchors.values()) | matched.duplicates
    constant = matched.constant

    # original side: join across tensors the optimized graph does not hold
    for tensor, prod in view.producer.items():
        if tensor in anchored_o or tensor in constant:
            continue
        for c in view.consumers.get(tensor, ()):
            uf.union(prod, c)
    # optimized side: join across tensors the original graph does not hold
    p_inits = {t.name for t in matched.optimized.graph.initializer}
    p_producer: dict[str, int] = {}
    p_consumers: dict[str, list[int]] = {}
    for j, n in enumerate(p_nodes):
        for out in n.output:
            if out:
                p_producer[out] = j
        for read in dict.fromkeys(node_reads(n)):
            p_consumers.setdefault(read, []).append(j)
    for tensor, j in p_producer.items():
        if tensor in anchors or tensor in p_inits:
            continue
        for c in p_consumers.get(tensor, ()):
            uf.union(n_o + j, n_o + c)
    # anchors: the two producers of one value are the same computation's ends
    for p_t, o_t in anchors.items():
        if p_t in p_producer and o_t in view.producer:
            uf.union(view.producer[o_t], n_o + p_producer[p_t])

    members: dict[int, list[int]] = {}
    for i in range(n_o + len(p_nodes)):
        members.setdefault(uf.find(i), []).append(i)

    seconds = {n.name: 0.0 for n in o_nodes if not n.is_constant}
    comp_time: dict[int, float] = {}
    for j, n in enumerate(p_nodes):
        s = timing.node_seconds.get(n.name, 0.0)
        if s:
            root = uf.find(n_o + j)
            comp_time[root] = comp_time.get(root, 0.0) + s

    def compute_members(root: int) -> list[int]:
        return [i for i in members[root] if i < n_o and not o_nodes[i].is_constant]

    def p_names(root: int) -> list[str]:
        return [p_nodes[i - n_o].name for i in members[root] if i >= n_o]

    notes: list[str] = []
    fused: list[str] = []
    fused_sizes: list[int] = []
    fused_time = 0.0
    flopless: list[str] = []
    flopless_time = 0.0
    exact = 0.0
    total = sum(comp_time.values())
    orphan_time: dict[int, float] = {}
    for root, t in comp_time.items():
        targets = compute_members(root)
        if not targets:
            orphan_time[root] = t
            continue
        how = _spread(view, targets, t, matched.shapes, seconds)
        if len(targets) == 1:
            exact += t
        elif how is Weighting.FLOPS:
            fused.extend(p_names(root))
            fused_time += t
            fused_sizes.append(len(targets))
        else:
            flopless.extend(p_names(root))
            flopless_time += t
    if flopless:
        notes.insert(
            0,
            f"{len(flopless)} optimized node(s) ({_short(flopless, 6)}) each ran a group of original nodes "
            f"without FLOPs (shape and data movement): their {flopless_time * 1e3:.3f} ms were split by "
            "output elements; the groups are listed in regions",
        )
    if fused:
        share = f" ({fused_time / total:.0%} of the time)" if total > 0 else ""
        notes.insert(
            0,
            f"{len(fused_sizes)} fused group(s) of {min(fused_sizes)}-{max(fused_sizes)} original nodes, "
            f"run as {len(fused)} optimized node(s) ({_short(fused, 6)}): their {fused_time * 1e3:.3f} ms"
            f"{share} were split by FLOPs; the groups are listed in regions",
        )
    orphan_notes: list[str] = []
    for root, t in orphan_time.items():
        near = _neighbour_regions(root, uf, members, n_o, p_nodes, p_producer, p_consumers, anchors, view)
        near = [r for r in near if compute_members(r)]
        if near:
            for r in near:
                _spread(view, compute_members(r), t / len(near), matched.shapes, seconds)
            receivers = [o_nodes[i].name for r in near for i in compute_members(r)]
        else:
            everyone = [i for i in range(n_o) if not o_nodes[i].is_constant]
            if everyone:
                _spread(view, everyone, t, matched.shapes, seconds)
            receivers = ["every node"]
        orphan_notes.append(
            f"{_short(p_names(root))}: work no original node does (a layout change or copy); its "
            f"{t * 1e3:.3f} ms went to the neighbouring node(s) {_short(receivers)}"
        )
    if len(orphan_notes) <= 5:
        notes.extend(orphan_notes)
    else:
        names = [n for root in orphan_time for n in p_names(root)]
        notes.append(
            f"{len(names)} optimized node(s) ({_short(names, 6)}) compute values no original node holds "
            f"(layout changes, reorders): their {sum(orphan_time.values()) * 1e3:.3f} ms went to the "
            "neighbouring original nodes"
        )
    if timing.foreign_seconds > 0:
        notes.append(
            f"{len(timing.foreign_names)} profiler event(s) for nodes outside the optimized main graph "
            f"({_short(timing.foreign_names)}, inside subgraphs): their time is part of their parent's"
        )
    if total == 0 and timing.total_seconds > 0 and seconds:
        notes.append("onnxruntime reported no kernel time; every node time is 0 (the model does nothing)")
    folded = [n.name for n in o_nodes if not n.is_constant and seconds[n.name] == 0.0]
    if folded and total > 0:
        notes.append(
            f"{len(folded)} original node(s) run inside no measured kernel (folded or removed by the "
            f"optimizer) and cost 0: {_short(folded)}"
        )
    regions = []
    for root in sorted(members):
        targets = compute_members(root)
        if len(targets) >= 2:
            regions.append(tuple(o_nodes[i].name for i in sorted(targets)))
    position = {n.name: n.position for n in o_nodes}
    regions.sort(key=lambda r: position[r[0]])
    return Attribution(
        node_seconds=seconds,
        regions=tuple(regions),
        exact_fraction=exact / total if total > 0 else 1.0,
        notes=notes,
    )


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


def _neighbour_regions(
    root: int,
    uf: _UnionFind,
    members: Mapping[int, list[int]],
    n_o: int,
    p_nodes: Sequence[onnx.NodeProto],
    p_producer: Mapping[str, int],
    p_consumers: Mapping[str, list[int]],
    anchors: Mapping[str, str],
    view: ModelView,
) -> list[int]:
    """Regions that feed or read the region ``root`` (breadth first through regions without original
    compute nodes, until some are found)."""
    seen = {root}
    frontier = [root]
    while frontier:
        found: list[int] = []
        nxt: list[int] = []
        for r in frontier:
            for i in members[r]:
                if i < n_o:
                    tensors = list(view.nodes[i].reads) + list(view.nodes[i].outputs)
                    near = [view.producer[t] for t in tensors if t in view.producer]
                    near += [c for t in view.nodes[i].outputs for c in view.consumers.get(t, ())]
                else:
                    n = p_nodes[i - n_o]
                    near = [n_o + p_producer[t] for t in n.input if t in p_producer]
                    near += [n_o + c for t in n.output for c in p_consumers.get(t, ())]
                    for t in list(n.input) + list(n.output):
                        o_t = anchors.get(t)
                        if o_t is not None:
                            if o_t in view.producer:
                                near.append(view.producer[o_t])
                            near += list(view.consumers.get(o_t, ()))
                for k in near:
                    rk = uf.find(k)
                    if rk in seen:
                        continue
                    seen.add(rk)
                    has_compute = any(m < n_o and not view.nodes[m].is_constant for m in members[rk])
                    (found if has_compute else nxt).append(rk)
        if found:
            return sorted(found)
        frontier = nxt
    return []


def _short(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
