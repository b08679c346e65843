"""Plans that may cut one dominating node into parts over consecutive stages (``--split-nodes auto``).

A contiguous plan stops at ``max(total / K, largest node)``. Here the nodes that can be cut
(:func:`.find.find_splittable`) and are large enough to matter (at least :data:`MIN_SHARE` of ``total / K``;
the :data:`MAX_CANDIDATES` largest) are solved on plain numbers (:func:`onnxpipe.partition.splitting.expand`
and :func:`onnxpipe.partition.solve`) with every part count from 2 to :data:`MAX_PARTS` (more parts than
stages give the cut finer places to fall) and every kind of cut they allow, their parts' costs measured
(:func:`.cut.sized_costs`) and the bytes each inner link carries counted (the node's input, forwarded, and
the parts' outputs the join needs). Equal parts that a split put in one stage are merged into one wider part
(more equal parts only give finer places to cut the node; two kernels in one stage would be slower than
one), and a wider part may cost more than its equal parts did: so the :data:`MAX_LAYOUTS` most promising
merged layouts are costed as such and solved again, and the lowest bottleneck chooses the node, the kind and
the count of parts (:func:`_best_layout`). The node is then cut in the model (:func:`.cut.cut_node`), the
profile carried over to the parts, and the cut model planned by :func:`onnxpipe.planning.workers.make_plan`
as any other; the split is kept only if that plan's bottleneck is below the best contiguous plan's.

The result holds the plan and the view its stages are made of (the cut model, or the original when no
split helps): the exporter writes the stages from that view, and ``verify`` compares them with the
original model file (the cut view keeps its path and sha256), so the difference the cut makes (float32
summation order only) is what verify reports.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from onnxpipe.core.errors import PartitionError
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.model import ModelView
from onnxpipe.partition import Partition, solve
from onnxpipe.partition.splitting import SplitCandidate, SplitShape, expand
from onnxpipe.planning.nodesplit.cut import (
    CutModel,
    PartCosts,
    chain_seconds,
    cut_node,
    node_seconds,
    shared_costs,
    sized_costs,
)
from onnxpipe.planning.nodesplit.find import SplitKind, Splittable, find_splittable, part_sizes
from onnxpipe.planning.records import NodeSplit
from onnxpipe.planning.sequences import Sequences, anywhere_cuttable, sequences
from onnxpipe.planning.types import Plan
from onnxpipe.planning.workers import make_plan
from onnxpipe.schedule.timeline import DEFAULT_MICROBATCHES

MAX_CANDIDATES = 3
"""The largest cuttable nodes offered (each costs a timing of its parts)."""
MIN_SHARE = 0.5
"""A node below half of ``total / K`` is never what holds a plan back: not offered."""
MAX_PARTS = 8
MAX_LAYOUTS = 6
"""The most promising cuts (node, kind, part sizes) costed as they will run before one is chosen."""


@dataclass(frozen=True)
class Planned:
    """A plan and the view its stages name nodes of (the cut model when a node was split)."""

    plan: Plan
    view: ModelView
    profile: Profile


@dataclass(frozen=True)
class _Search:
    """What every try of a split shares: the model and its costs, the stages and their link, whether the
    parts are timed, the plain numbers the partitioner solves on, and the contiguous plan to beat."""

    view: ModelView
    profile: Profile
    k: int
    bandwidth_bytes_per_s: float
    microbatches: int
    measure: bool
    seq: Sequences
    contiguous: Plan


@dataclass(frozen=True)
class _Offer:
    """A node that may be cut, at ``start`` in the sequence, with every (kind, part count) it offers: as
    the partitioner's shapes, and the kind and part costs behind each."""

    spec: Splittable
    start: int
    shapes: tuple[SplitShape, ...]
    choices: tuple[tuple[SplitKind, PartCosts], ...]


def plan_splitting_nodes(
    view: ModelView,
    profile: Profile,
    k: int,
    *,
    bandwidth_bytes_per_s: float = math.inf,
    microbatches: int = DEFAULT_MICROBATCHES,
    measure: bool = True,
) -> Planned:
    """The best plan into ``k`` stages on identical workers when one node may be cut (module doc)."""
    contiguous = make_plan(
        view, profile, k, bandwidth_bytes_per_s=bandwidth_bytes_per_s, microbatches=microbatches
    )
    plain = Planned(contiguous, view, profile)
    if k < 2:
        return plain
    search = _Search(
        view, profile, k, bandwidth_bytes_per_s, microbatches, measure, sequences(view, profile), contiguous
    )
    offers = _offers(search)
    if not offers:
        return plain
    best = _best_layout(search, offers)
    made = None if best is None else _realize(search, best)
    return plain if made is None else made


def _offers(search: _Search) -> list[_Offer]:
    """The cuttable nodes that may hold the plan back (at least :data:`MIN_SHARE` of ``total / K``), the
    :data:`MAX_CANDIDATES` largest, with what each offers."""
    total = math.fsum(search.seq.costs)
    position = {n.name: p for p, n in enumerate(search.seq.compute)}
    specs = sorted(
        (
            s
            for s in find_splittable(search.view).values()
            if chain_seconds(search.profile, s) >= MIN_SHARE * total / search.k
        ),
        key=lambda s: -chain_seconds(search.profile, s),
    )[:MAX_CANDIDATES]
    return [_offer(search, spec, position[spec.chain[0]]) for spec in specs]


def _offer(search: _Search, spec: Splittable, start: int) -> _Offer:
    """Every (kind, part count) ``spec`` offers, as the partitioner's shapes, fewest parts first."""
    by_kind = {kind: _equal_costs(search, spec, kind) for kind in spec.kinds}
    shapes: list[SplitShape] = []
    choices: list[tuple[SplitKind, PartCosts]] = []
    for p in range(2, MAX_PARTS + 1):
        for kind in spec.kinds:
            costs = by_kind[kind].get(p)
            if costs is None:
                continue
            shapes.append(_split_shape(search, spec, kind, part_sizes(spec.extent(kind), p), costs))
            choices.append((kind, costs))
    return _Offer(spec, start, tuple(shapes), tuple(choices))


def _equal_costs(search: _Search, spec: Splittable, kind: SplitKind) -> dict[int, PartCosts]:
    """The costs of ``spec`` cut by ``kind`` into each count of equal parts it allows, by count."""
    counts = list(range(2, min(MAX_PARTS, spec.extent(kind)) + 1))
    layouts = [part_sizes(spec.extent(kind), p) for p in counts]
    return dict(zip(counts, _costs(search, spec, kind, layouts), strict=True))


def _costs(
    search: _Search, spec: Splittable, kind: SplitKind, layouts: Sequence[Sequence[int]]
) -> list[PartCosts]:
    """The parts' costs of each layout: timed when asked (:func:`.costs.sized_costs`, which shares out
    static costs), else by their share."""
    if search.measure:
        return sized_costs(search.view, search.profile, spec, kind, layouts)
    return [shared_costs(search.profile, spec, kind, sizes) for sizes in layouts]


def _split_shape(
    search: _Search, spec: Splittable, kind: SplitKind, sizes: Sequence[int], costs: PartCosts
) -> SplitShape:
    """``spec`` cut by ``kind`` into parts of ``sizes`` costing ``costs``, as the partitioner's shape, with
    what each link between two parts carries on top of the node's input: the output the earlier parts
    made, which the join still needs."""
    out_bytes = float(search.seq.sizes.get(spec.output, 0))
    if kind == SplitKind.REDUCTION:  # every earlier partial sum travels to the join
        carried = tuple(out_bytes * (t + 1) for t in range(len(sizes) - 1))
    else:  # the earlier parts' slices of the output
        carried = tuple(out_bytes * sum(sizes[: t + 1]) / spec.extent(kind) for t in range(len(sizes) - 1))
    return SplitShape(costs.part_seconds, costs.join_seconds, carried, kind.value)


@dataclass(frozen=True)
class _Layout:
    """One way to cut one offered node: its kind, the sizes of its parts (equal parts that one stage
    took merged), their costs when known, and the bottleneck of the best split with them."""

    offer: int
    kind: SplitKind
    sizes: tuple[int, ...]
    costs: PartCosts | None
    bottleneck: float


def _best_layout(search: _Search, offers: list[_Offer]) -> tuple[_Offer, _Layout] | None:
    """The cut that gives the smallest bottleneck once the parts a stage shares are one part, costed as
    such; None when none beats the contiguous split.

    Every offered shape (kind and count of equal parts) is solved on plain numbers; the parts each best
    split puts in one stage become one wider part; the :data:`MAX_LAYOUTS` most promising such layouts
    are costed (timed together, one timing per node and kind) and solved again with those costs.  So the
    count of parts is the one whose parts, as they will run, make the slowest stage fastest: a merged
    part may cost more than the equal parts it replaces (a narrower kernel runs less efficiently), which
    the equal parts' split could not see.  Ties go to fewer parts, then to the order offered.
    """
    found: dict[tuple[int, SplitKind, tuple[int, ...]], _Layout] = {}
    for oi, offer in enumerate(offers):
        for shape, (kind, costs) in zip(offer.shapes, offer.choices, strict=True):
            part = _solve_shape(search, offer, shape)
            if part is None or not part.bottleneck < search.contiguous.bottleneck_seconds:
                continue
            stages = tuple(part.stage_of(offer.start + t) for t in range(shape.parts))
            sizes = tuple(merged_sizes(offer.spec, kind, stages))
            if len(sizes) < 2:
                continue
            key = (oi, kind, sizes)
            known = costs if len(sizes) == costs.parts else None
            if key not in found or (known is not None and found[key].costs is None):
                found[key] = _Layout(oi, kind, sizes, known, part.bottleneck)
    promising = sorted(found.values(), key=lambda t: (t.bottleneck, len(t.sizes)))[:MAX_LAYOUTS]
    scored = [_scored(search, offers, layout) for layout in _costed(search, offers, promising)]
    ranked = [t for t in scored if t.bottleneck < search.contiguous.bottleneck_seconds]
    if not ranked:
        return None
    best = min(ranked, key=lambda t: (t.bottleneck, len(t.sizes)))
    return offers[best.offer], best


def _costed(search: _Search, offers: list[_Offer], layouts: list[_Layout]) -> list[_Layout]:
    """``layouts`` with the costs of their parts, those not yet known costed together per node and kind."""
    missing: dict[tuple[int, SplitKind], list[tuple[int, ...]]] = {}
    for t in layouts:
        if t.costs is None:
            missing.setdefault((t.offer, t.kind), []).append(t.sizes)
    costs: dict[tuple[int, SplitKind, tuple[int, ...]], PartCosts] = {}
    for (oi, kind), sizes in missing.items():
        for one, c in zip(sizes, _costs(search, offers[oi].spec, kind, sizes), strict=True):
            costs[(oi, kind, one)] = c
    return [
        t if t.costs is not None else replace(t, costs=costs[(t.offer, t.kind, t.sizes)]) for t in layouts
    ]


def _scored(search: _Search, offers: list[_Offer], layout: _Layout) -> _Layout:
    """``layout`` with the bottleneck of the best split with its parts as costed (inf when none)."""
    offer, costs = offers[layout.offer], layout.costs
    assert costs is not None
    part = _solve_shape(search, offer, _split_shape(search, offer.spec, layout.kind, layout.sizes, costs))
    return replace(layout, bottleneck=math.inf if part is None else part.bottleneck)


def _solve_shape(search: _Search, offer: _Offer, shape: SplitShape) -> Partition | None:
    """The best split with ``offer``'s node cut into ``shape``, within the fused groups when it can; None
    when no split into ``k`` stages has that shape."""
    seq = search.seq
    run = SplitCandidate(offer.start, len(offer.spec.chain), (shape,))

    def attempt(allowed: Sequence[bool] | None) -> Partition:
        ex = expand(
            seq.costs,
            seq.cut_bytes,
            [True] * (len(seq.costs) + 1) if allowed is None else allowed,
            run,
            shape,
        )
        return solve(
            ex.costs,
            search.k,
            cut_bytes=ex.cut_bytes,
            bandwidth=search.bandwidth_bytes_per_s,
            allowed_cuts=ex.allowed,
        )

    try:
        try:
            return attempt(seq.allowed)
        except PartitionError:  # too few allowed cuts with the fused groups: try without them
            return anywhere_cuttable(attempt, seq.cuttable)
    except PartitionError:
        return None


def _realize(search: _Search, best: tuple[_Offer, _Layout]) -> Planned | None:
    """The chosen cut made in the model and the cut model planned; None when that plan does not beat the
    contiguous one.  Parts that the plan still puts in one stage (their costs as merged moved the cuts)
    are merged again, costed and planned again, until each part has a stage of its own."""
    offer, layout = best
    sizes, costs = list(layout.sizes), layout.costs
    assert costs is not None
    while True:
        cut = cut_node(search.view, offer.spec, layout.kind, sizes)
        cut_profile = carried_profile(search.profile, cut, costs)
        bandwidth, microbatches = search.bandwidth_bytes_per_s, search.microbatches
        planned = make_plan(
            cut.view, cut_profile, search.k, bandwidth_bytes_per_s=bandwidth, microbatches=microbatches
        )
        stage_of = planned.stage_of()
        shared = [stage_of[p[-1]] for p in cut.parts]
        if len(set(shared)) == len(shared):
            break
        sizes = _merged(shared, sizes)
        if len(sizes) < 2:
            return None
        (costs,) = _costs(search, offer.spec, layout.kind, [sizes])
    if not planned.bottleneck_seconds < search.contiguous.bottleneck_seconds:
        return None
    bound = search.contiguous.lower_bound_seconds
    return Planned(_recorded(planned, cut, costs, search.contiguous, bound), cut.view, cut_profile)


def _recorded(planned: Plan, cut: CutModel, costs: PartCosts, contiguous: Plan, bound: float) -> Plan:
    """``planned`` with the record of its split and the note that says what the split gained."""
    spec, kind = cut.spec, cut.kind
    stage_of = planned.stage_of()
    record = NodeSplit(
        node=spec.node,
        kind=kind.value,
        parts=costs.parts,
        stages=tuple(stage_of[p[-1]] for p in cut.parts),
        carried=spec.chain[1:],
        part_nodes=cut.parts,
        join=cut.join,
        contiguous_bottleneck_seconds=contiguous.bottleneck_seconds,
        contiguous_bound_seconds=bound,
        measured=costs.measured,
    )
    note = (
        f"node {spec.node} cut by {kind.value} into {costs.parts} parts in stages "
        f"{', '.join(str(s) for s in record.stages)}: the slowest stage is "
        f"{planned.bottleneck_seconds / contiguous.bottleneck_seconds:.3f}x the best contiguous split's, "
        f"{planned.bottleneck_seconds / bound:.3f}x the bound max(total / K, largest node) "
        f"no contiguous split beats (parts' costs {'measured' if costs.measured else 'by their share'})"
    )
    return dataclasses.replace(planned, node_splits=(record,), notes=(*planned.notes, note))


def merged_sizes(spec: Splittable, kind: SplitKind, part_stages: tuple[int, ...]) -> list[int]:
    """The sizes of the parts once the equal parts the partitioner put in one stage are merged.

    More equal parts give the partitioner finer places to cut the node, but two parts in one stage
    only cost a second, narrower kernel: one part per stage, of the summed width, computes the same.
    """
    return _merged(part_stages, part_sizes(spec.extent(kind), len(part_stages)))


def _merged(stages: Sequence[int], sizes: Sequence[int]) -> list[int]:
    """The parts of ``sizes`` that one stage holds (``stages``, non-decreasing) as one part, in order."""
    merged: dict[int, int] = {}
    for stage, size in zip(stages, sizes, strict=True):
        merged[stage] = merged.get(stage, 0) + size
    return list(merged.values())


def carried_profile(profile: Profile, cut: CutModel, costs: PartCosts) -> Profile:
    """``profile`` for the cut model: each part's cost spread over its nodes as the chain's was over the
    chain (a reduction's ``Slice`` free), the join's to the join, nodes that only computed the cut
    weights gone; a part, and the last part with the join, are fused groups (kept in one stage)."""
    chain = cut.spec.chain
    chain_costs = [node_seconds(profile, n) for n in chain]
    whole = math.fsum(chain_costs)
    names = {n.name for n in cut.view.nodes}
    seconds = {n: t for n, t in profile.node_seconds.items() if n in names}
    for nodes, cost in zip(cut.parts, costs.part_seconds, strict=True):
        tail = nodes[len(nodes) - len(chain) :]  # the part's copies of the chain's nodes, in order
        for extra in nodes[: len(nodes) - len(chain)]:
            seconds[extra] = 0.0
        for node, share in zip(tail, chain_costs, strict=True):
            seconds[node] = cost * (share / whole if whole > 0 else 1.0 / len(chain))
    seconds[cut.join] = costs.join_seconds
    dropped = set(chain)
    regions = [r for r in profile.regions if not dropped & set(r)]
    regions += [tuple(p) for p in cut.parts if len(p) > 1]
    regions.append((*cut.parts[-1], cut.join))
    return dataclasses.replace(
        profile,
        node_seconds=MappingProxyType(seconds),
        regions=tuple(regions),
        total_seconds=profile.total_seconds,
    )
