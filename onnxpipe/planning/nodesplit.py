"""Plans that may cut one dominating node into parts over consecutive stages (``--split-nodes auto``).

A contiguous plan stops at ``max(total / K, largest node)``. Here the nodes that can be cut
(:func:`onnxpipe.ir.nodesplit.find_splittable`) and are large enough to matter (at least :data:`MIN_SHARE`
of ``total / K``; the :data:`MAX_CANDIDATES` largest) are offered to
:func:`onnxpipe.partition.splitting.solve_with_split` with every part count from 2 to :data:`MAX_PARTS`
(more parts than stages give the cut finer places to fall) and every kind of cut they allow, their parts'
costs measured (:mod:`onnxpipe.cost.parts`) and the bytes each inner link carries counted (the node's input,
forwarded, and the parts' outputs the join needs). The best is exact over those choices. Equal parts the
best split put in one stage are merged into one wider part (more equal parts only give finer places to cut
the node; two kernels in one stage would be slower than one), costed again; since a wider part may cost
more than its equal parts did, the best split with at most one part per stage is planned too, and the
faster plan wins. The node is then cut in the
model (:func:`onnxpipe.ir.nodesplit.cut_node`), the profile carried over to the parts, and the cut model
planned by :func:`onnxpipe.planning.workers.make_plan` as any other; the split is kept only if that plan's
bottleneck is below the best contiguous plan's.

The result holds the plan and the view its stages are made of (the cut model, or the original when no
split helps): the exporter writes the stages from that view, and ``verify`` compares them with the
original model file (the cut view keeps its path and sha256), so the difference the cut makes (float32
summation order only) is what verify reports.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from types import MappingProxyType

from onnxpipe.core.errors import PartitionError
from onnxpipe.cost.parts import PartCosts, chain_seconds, part_costs, shared_costs, sized_costs
from onnxpipe.cost.profile import CostSource, Profile
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.nodesplit import CutModel, SplitKind, Splittable, cut_node, find_splittable, part_sizes
from onnxpipe.partition.splitting import SplitCandidate, SplitShape, solve_with_split
from onnxpipe.planning.sequences import Sequences, sequences
from onnxpipe.planning.types import NodeSplit, Plan
from onnxpipe.planning.workers import make_plan
from onnxpipe.schedule.timeline import DEFAULT_MICROBATCHES

MAX_CANDIDATES = 3
"""The largest cuttable nodes offered (each costs a timing of its parts)."""
MIN_SHARE = 0.5
"""A node below half of ``total / K`` is never what holds a plan back: not offered."""
MAX_PARTS = 8


@dataclass(frozen=True)
class Planned:
    """A plan and the view its stages name nodes of (the cut model when a node was split)."""

    plan: Plan
    view: ModelView
    profile: Profile


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
    seq = sequences(view, profile)
    total = math.fsum(seq.costs)
    position = {n.name: p for p, n in enumerate(seq.compute)}
    specs = sorted(
        (s for s in find_splittable(view).values() if chain_seconds(profile, s) >= MIN_SHARE * total / k),
        key=lambda s: -chain_seconds(profile, s),
    )[:MAX_CANDIDATES]
    if not specs:
        return plain
    candidates: list[SplitCandidate] = []
    choices: list[list[tuple[SplitKind, PartCosts]]] = []
    for spec in specs:
        shapes, options = _shapes(view, profile, spec, k, seq.sizes.get(spec.output, 0), measure)
        candidates.append(SplitCandidate(position[spec.chain[0]], len(spec.chain), tuple(shapes)))
        choices.append(options)
    # all part counts (parts sharing a stage merged afterwards), and at most one part per stage (equal
    # parts, as measured): a merged part is costed again, and may cost more than its equal parts did
    best: Planned | None = None
    for most in dict.fromkeys((MAX_PARTS, min(k, MAX_PARTS))):
        allowed = [
            SplitCandidate(c.start, c.length, tuple(sh for sh in c.shapes if sh.parts <= most))
            for c in candidates
        ]
        kept = [
            [o for o, sh in zip(opts, c.shapes, strict=True) if sh.parts <= most]
            for opts, c in zip(choices, candidates, strict=True)
        ]
        made = _realize(
            view,
            profile,
            k,
            specs,
            allowed,
            kept,
            seq,
            contiguous,
            bandwidth_bytes_per_s,
            microbatches,
            measure,
        )
        if made is not None and (best is None or made.plan.bottleneck_seconds < best.plan.bottleneck_seconds):
            best = made
    return plain if best is None else best


def _realize(
    view: ModelView,
    profile: Profile,
    k: int,
    specs: list[Splittable],
    candidates: list[SplitCandidate],
    choices: list[list[tuple[SplitKind, PartCosts]]],
    seq: Sequences,
    contiguous: Plan,
    bandwidth_bytes_per_s: float,
    microbatches: int,
    measure: bool,
) -> Planned | None:
    """The best split over ``candidates``, cut in the model and planned; None when it does not help."""
    try:
        found = solve_with_split(
            seq.costs,
            k,
            candidates,
            cut_bytes=seq.cut_bytes,
            bandwidth=bandwidth_bytes_per_s,
            allowed_cuts=seq.allowed,
        )
    except PartitionError:  # too few allowed cuts with the fused groups: try without them
        found = solve_with_split(
            seq.costs, k, candidates, cut_bytes=seq.cut_bytes, bandwidth=bandwidth_bytes_per_s
        )
    if found.split is None:
        return None
    spec = specs[found.split.candidate]
    kind, costs = choices[found.split.candidate][found.split.shape]
    sizes = merged_sizes(spec, kind, found.split.part_stages)
    if len(sizes) < 2:
        return None
    if len(sizes) < costs.parts:  # parts that share a stage become one wider part, costed as such
        measured = measure and profile.source == CostSource.PROFILE.value
        costs = (
            sized_costs(view, profile, spec, kind, [sizes])[0]
            if measured
            else shared_costs(profile, spec, kind, sizes)
        )
    cut = cut_node(view, spec, kind, sizes)
    cut_profile = carried_profile(profile, cut, costs)
    planned = make_plan(
        cut.view, cut_profile, k, bandwidth_bytes_per_s=bandwidth_bytes_per_s, microbatches=microbatches
    )
    if not planned.bottleneck_seconds < contiguous.bottleneck_seconds:
        return None
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
        contiguous_bound_seconds=found.contiguous_bound,
        measured=costs.measured,
    )
    note = (
        f"node {spec.node} cut by {kind.value} into {costs.parts} parts in stages "
        f"{', '.join(str(s) for s in record.stages)}: the slowest stage is "
        f"{planned.bottleneck_seconds / contiguous.bottleneck_seconds:.3f}x the best contiguous split's, "
        f"{planned.bottleneck_seconds / found.contiguous_bound:.3f}x the bound max(total / K, largest node) "
        f"no contiguous split beats (parts' costs {'measured' if costs.measured else 'by their share'})"
    )
    final = dataclasses.replace(planned, node_splits=(record,), notes=(*planned.notes, note))
    return Planned(final, cut.view, cut_profile)


def merged_sizes(spec: Splittable, kind: SplitKind, part_stages: tuple[int, ...]) -> list[int]:
    """The sizes of the parts once the equal parts the partitioner put in one stage are merged.

    More equal parts give the partitioner finer places to cut the node, but two parts in one stage
    only cost a second, narrower kernel: one part per stage, of the summed width, computes the same.
    """
    total = spec.depth if kind == SplitKind.REDUCTION else spec.width
    equal = part_sizes(total, len(part_stages))
    sizes: dict[int, int] = {}
    for stage, size in zip(part_stages, equal, strict=True):
        sizes[stage] = sizes.get(stage, 0) + size
    return list(sizes.values())


def _shapes(
    view: ModelView, profile: Profile, spec: Splittable, k: int, out_bytes: int, measure: bool
) -> tuple[list[SplitShape], list[tuple[SplitKind, PartCosts]]]:
    """Every (kind, part count) ``spec`` offers, as the partitioner's shapes, fewest parts first."""
    shapes: list[SplitShape] = []
    options: list[tuple[SplitKind, PartCosts]] = []
    by_kind: dict[SplitKind, dict[int, PartCosts]] = {}
    for kind in spec.kinds:
        total = spec.depth if kind == SplitKind.REDUCTION else spec.width
        counts = list(range(2, min(MAX_PARTS, total) + 1))
        if measure and profile.source == CostSource.PROFILE.value:
            by_kind[kind] = part_costs(view, profile, spec, kind, counts)
        else:
            by_kind[kind] = {p: shared_costs(profile, spec, kind, p) for p in counts}
    for p in range(2, MAX_PARTS + 1):
        for kind in spec.kinds:
            costs = by_kind[kind].get(p)
            if costs is None:
                continue
            if kind == SplitKind.REDUCTION:  # every earlier partial sum travels to the join
                carried = tuple(float(out_bytes) * (t + 1) for t in range(p - 1))
            else:  # the earlier parts' slices of the output
                sizes = part_sizes(spec.width, p)
                carried = tuple(float(out_bytes) * sum(sizes[: t + 1]) / spec.width for t in range(p - 1))
            shapes.append(SplitShape(costs.part_seconds, costs.join_seconds, carried, kind.value))
            options.append((kind, costs))
    return shapes, options


def carried_profile(profile: Profile, cut: CutModel, costs: PartCosts) -> Profile:
    """``profile`` for the cut model: each part's cost spread over its nodes as the chain's was over the
    chain (a reduction's ``Slice`` free), the join's to the join, nodes that only computed the cut
    weights gone; a part, and the last part with the join, are fused groups (kept in one stage)."""
    chain = cut.spec.chain
    chain_costs = [max(0.0, float(profile.node_seconds.get(n, 0.0))) for n in chain]
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
