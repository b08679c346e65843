"""Anchors: pairs of an optimized and an original tensor that hold the same value, found by name and by
value (:mod:`onnxpipe.cost.sketch` prints), and original tensors the optimizer computes only once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx

from onnxpipe.cost.sketch import Print, near_norm
from onnxpipe.ir.graph import dfs_order
from onnxpipe.ir.model import ModelView, subgraph_outer_reads

NAME_ANCHOR_TOLERANCE = 0.05
"""A tensor name shared by both graphs is trusted unless its values differ by more than this."""


@dataclass
class AnchorFinder:
    """Finds anchors, pairs (optimized tensor -> original tensor): shared names first, then equal values
    (:meth:`find`); value anchors in the optimized graph's topological order, so that the inputs of a
    node are settled before its outputs are matched."""

    view: ModelView
    optimized: onnx.ModelProto
    o_prints: Mapping[str, Print]
    p_prints: Mapping[str, list[Print]]
    by_size: Mapping[int, list[tuple[float, str]]]
    constant: set[str]

    def __post_init__(self) -> None:
        self.p_nodes = list(self.optimized.graph.node)
        self.p_inits = {t.name for t in self.optimized.graph.initializer}
        self.p_producer = {t: n for n in self.p_nodes for t in n.output if t}
        self.pos = dict(self.view.producer)
        self.anchors: dict[str, str] = {}
        self.used: set[str] = set()
        """Original tensors taken by an anchor."""
        self.lower: dict[str, int] = {}
        """Per optimized tensor, the latest original position it is known to come after."""

    def find(self) -> dict[str, str]:
        self.by_name()
        if self.p_prints:
            self.by_value()
        return self.anchors

    def by_name(self) -> None:
        original = set(self.view.producer) | set(self.view.inputs)
        graph = self.optimized.graph
        names = [i.name for i in graph.input] + [t for n in self.p_nodes for t in n.output if t]
        for t in dict.fromkeys(names):
            if t not in original or t in self.p_inits:
                continue
            o_p, p_p = self.o_prints.get(t), self.p_prints.get(t)
            if o_p is not None and p_p and not any(o_p.same(q, NAME_ANCHOR_TOLERANCE) for q in p_p):
                continue  # same name, different value: not the same tensor
            self.anchors[t] = t
            self.used.add(t)

    def by_value(self) -> None:
        available = self.p_inits | {i.name for i in self.optimized.graph.input}
        consumers_of: dict[str, set[str]] = {}
        for node in self.view.nodes:
            for r in node.reads:
                consumers_of.setdefault(r, set()).update(node.outputs)
        for idx in topological(self.p_nodes, available):
            node = self.p_nodes[idx]
            bound = max((self.lower.get(i, -1) for i in node_reads(node)), default=-1)
            images: set[str] | None = None
            for t in node.output:
                if not t:
                    continue
                if t in self.anchors:
                    self.lower[t] = self.pos.get(self.anchors[t], -1)
                    continue
                self.lower[t] = bound
                prints = self.p_prints.get(t)
                if not prints:
                    continue
                cands = value_candidates(prints, self.o_prints, self.by_size, self.used, self.constant)
                if images is None and (len(cands) != 1):
                    images = self.p_frontier(node)
                if not cands:
                    self.layout_copy(t, prints, images or set())
                    continue
                if len(cands) > 1:
                    cands = self.best_ranked(node, cands, images or set(), bound)
                best = min(cands, key=lambda c: self.pos.get(c, -1))
                # equal values along a chain (Relu of non-negative data, Identity, Reshape): the last
                while True:
                    nxt = [c for c in cands if c in consumers_of.get(best, ()) and c != best]
                    if not nxt:
                        break
                    best = max(nxt, key=lambda c: self.pos.get(c, -1))
                self.anchors[t] = best
                self.used.add(best)
                self.lower[t] = self.pos.get(best, -1)

    def layout_copy(self, t: str, prints: Sequence[Print], images: set[str]) -> None:
        """Anchor ``t`` to one of its node's own inputs when it holds the same value in another layout
        (ReorderInput): a copy, not a tensor to join regions across."""
        copies = [
            o
            for o in sorted(images, key=lambda o: self.pos.get(o, -1))
            if o in self.o_prints and any(q.same(self.o_prints[o]) for q in prints)
        ]
        if copies:
            self.anchors[t] = copies[-1]
            self.lower[t] = self.pos.get(copies[-1], -1)

    def best_ranked(self, node: onnx.NodeProto, cands: list[str], images: set[str], bound: int) -> list[str]:
        """Among equal values in several places (parallel branches of degenerate weights), those computed
        from what ``node`` is computed from, then those the optimizer named ``node`` after, then those
        downstream of its inputs."""

        def rank(c: str) -> tuple[bool, bool, bool]:
            front = self.o_frontier(c)
            consistent = front is not None and front <= images
            producer = self.view.nodes[self.pos[c]].name if c in self.pos else ""
            return consistent, _named_after(node.name, c, producer), self.pos.get(c, -1) > bound

        ranks = {c: rank(c) for c in cands}
        top = max(ranks.values())
        return [c for c in cands if ranks[c] == top]

    def o_frontier(self, t: str, limit: int = 256) -> set[str] | None:
        """Anchored original tensors that ``t`` is computed from through unanchored ones (None: too far)."""
        found: set[str] = set()
        seen: set[int] = set()
        stack = [self.pos[t]] if t in self.pos else []
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            if len(seen) > limit:
                return None
            for r in self.view.nodes[i].reads:
                if r in self.used:
                    found.add(r)
                elif r in self.constant:
                    continue
                elif r in self.pos:
                    stack.append(self.pos[r])
                else:
                    found.add(r)
        return found

    def p_frontier(self, node: onnx.NodeProto, limit: int = 256) -> set[str]:
        """Original images of the anchored tensors ``node`` is computed from through unanchored ones."""
        found: set[str] = set()
        seen: set[str] = set()
        stack = [node]
        while stack and len(seen) <= limit:
            n = stack.pop()
            if n.name in seen:
                continue
            seen.add(n.name)
            for r in node_reads(n):
                if r in self.anchors:
                    found.add(self.anchors[r])
                elif r in self.p_producer and r not in self.p_inits:
                    stack.append(self.p_producer[r])
        return found


def node_reads(node: onnx.NodeProto) -> list[str]:
    return [i for i in node.input if i] + sorted(subgraph_outer_reads(node))


def _named_after(p_name: str, tensor: str, node: str) -> bool:
    """Whether the optimizer derived ``p_name`` from the original tensor or node name."""
    return any(p_name == x or p_name.startswith(x + "_") for x in (tensor, node) if x)


def find_duplicates(
    view: ModelView,
    anchors: Mapping[str, str],
    o_prints: Mapping[str, Print],
    p_prints: Mapping[str, list[Print]],
    constant: set[str],
) -> set[str]:
    """Unanchored original tensors equal to an anchored optimized one computed elsewhere: onnxruntime
    merged two identical computations (common subexpression elimination) and runs only one of them.

    Equal values on one chain (a Relu of non-negative data) are not duplicates: those nodes are fused."""
    anchored = set(anchors.values())
    index: dict[int, list[tuple[float, int, Print, str]]] = {}
    for p_t, o_t in anchors.items():
        for q in p_prints.get(p_t, ()):
            lst = index.setdefault(q.size, [])
            lst.append((q.norm, len(lst), q, o_t))
    for lst in index.values():
        lst.sort(key=lambda e: e[:2])
    result: set[str] = set()
    for o, pr in o_prints.items():
        if o in anchored or o in constant or o not in view.producer:
            continue
        for _, _, q, twin in near_norm(index.get(pr.size, []), pr.norm):
            if pr.same(q) and not _related(view, o, twin):
                result.add(o)
                break
    return result


def _related(view: ModelView, a: str, b: str, limit: int = 64) -> bool:
    """Whether one tensor is computed from the other within ``limit`` nodes."""
    for src, dst in ((a, b), (b, a)):
        seen: set[str] = set()
        stack = [src]
        while stack and len(seen) < limit:
            t = stack.pop()
            if t == dst:
                return True
            if t in seen:
                continue
            seen.add(t)
            for c in view.consumers.get(t, ()):
                stack.extend(view.nodes[c].outputs)
    return False


def value_candidates(
    prints: Sequence[Print],
    o_prints: Mapping[str, Print],
    by_size: Mapping[int, list[tuple[float, str]]],
    used: set[str],
    constant: set[str],
) -> list[str]:
    """Original tensors, neither ``used`` nor ``constant``, whose values one of ``prints`` matches."""
    found: list[str] = []
    for p in prints:
        for _, name in near_norm(by_size.get(p.size, []), p.norm):
            if name not in used and name not in constant and name not in found and p.same(o_prints[name]):
                found.append(name)
    return found


def topological(nodes: Sequence[onnx.NodeProto], available: set[str]) -> list[int]:
    """``nodes`` in a topological order (:func:`~onnxpipe.ir.graph.dfs_order`), by index."""
    outs = [[o for o in n.output if o] for n in nodes]
    return dfs_order([node_reads(n) for n in nodes], outs, available, [n.name for n in nodes])
