"""A decoder's rotary tables and masks made again in each stage that reads them, when that is cheaper.

The group before the layers makes, from the model inputs alone, tensors every layer reads: the rotary
cos/sin of the new positions (from ``position_ids`` and a small ``inv_freq`` table) and the attention
mask (from ``attention_mask``).  Sent, each crosses every cut after the first layer, and the mask grows
with the sequence (at a prompt, with its square).  Every stage can read the model inputs (the caller
feeds them to any stage that needs them; no link carries them), so a stage may hold copies of the nodes
that make such a tensor instead of receiving it, as it already does for shape values
(:mod:`onnxpipe.planning.recompute`).

**What may be copied** (:func:`input_derived`): a node that reads only model inputs other than the past
cache, weights and constants, and what other such nodes make (a ``Shape`` of anything counts too: it is
made of the stage's own dims, as :mod:`onnxpipe.planning.recompute` does; so the past length the mask
needs is read off the stage's own cache), not the embedding (its table is the largest weight), no
control flow.  A received tensor is a candidate when a copy of at most :data:`~onnxpipe.planning.recompute.
MAX_NODES` such nodes with at most :data:`~onnxpipe.planning.recompute.MAX_COPIED_BYTES` of weights makes it
from what the stage has (the model inputs but other layers' caches, the data tensors it receives anyway).

**When it is cheaper** (:class:`InputCopies`, per stage, its candidates in the order it reads them):

* the copies' seconds are the profiled times of the nodes they add (those the stage does not copy
  already, for shape values or an earlier candidate), at each phase the plan was profiled at (a prompt
  and a generation step for ``--phase both``, else the one phase);
* the bytes spared are the tensor's bytes at each phase's shapes; nothing is spared (and nothing
  copied) while a later stage still receives the tensor, since then it crosses this stage's cut anyway;
* a tensor is copied when the copies are cheaper **at every phase** (so that no phase gets slower for
  another's sake: at a generation step the rotary tables are a few bytes, at a prompt they are not);
* with a link bandwidth ``B`` (``--bandwidth``; a devices file's link in front of the stage) cheaper
  means the copies' seconds are below the spared bytes / ``B``: what the plan's own link model says the
  transfer costs;
* with no bandwidth (links the plan treats as free) it means all of the stage's copies so far, this
  tensor's included, take at most :data:`COPY_SHARE` of the stage's compute: a cost within the
  profile's own noise, paid to spare the real link bytes the plan cannot price.

The stage's estimated compute then includes its copies' seconds (per phase), its transfer time drops by
the bytes that no longer cross its cut, and the plan's bottleneck is taken over the stages so changed;
with a bandwidth on identical workers the cuts are chosen knowing which tensors the stages will copy
(:func:`priced_cuts`); with none, and on a devices file, they are chosen first (:func:`adjusted`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from onnxpipe.core.choices import Phase
from onnxpipe.ir.decoder import DecoderInfo
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapevalues import ValueKinds, value_kinds
from onnxpipe.partition.result import Partition
from onnxpipe.planning.recompute import Recomputed, copy_closure
from onnxpipe.planning.sequences import Sequences
from onnxpipe.planning.types import StageSpec

COPY_SHARE = 0.1
"""With no link bandwidth, the share of a stage's compute its copies of model-input values may take."""


@dataclass(frozen=True)
class PhaseCosts:
    """One phase the plan was profiled at: each node's seconds, each tensor's bytes, each stage's compute."""

    phase: Phase
    node_seconds: Mapping[str, float]
    sizes: Mapping[str, int]
    stage_compute: Sequence[float]
    stage_node_seconds: Sequence[Mapping[str, float]] = ()
    """Each stage's own node seconds (its device's, on a devices file); else ``node_seconds`` for all."""
    scale: float = 1.0
    """Samples per micro-batch: the copies run and the bytes cross once per sample."""

    def seconds(self, stage: int, node: str) -> float:
        """``node``'s seconds on ``stage`` for one micro-batch."""
        table = self.stage_node_seconds[stage] if self.stage_node_seconds else self.node_seconds
        return max(0.0, float(table.get(node, 0.0))) * self.scale


@dataclass(frozen=True)
class Copied:
    """What one stage makes of the model inputs instead of receiving: the tensors, the nodes copied for
    them, and the copies' seconds at each phase (in :class:`PhaseCosts` order)."""

    tensors: tuple[str, ...]
    nodes: tuple[str, ...]
    seconds: tuple[float, ...]


def input_derived(view: ModelView, dec: DecoderInfo) -> frozenset[int]:
    """Positions of the compute nodes a stage may copy: made of model inputs that are not the cache,
    weights and constants only, through such nodes (a ``Shape`` of anything too), the embedding left out."""
    pasts = set(dec.past_inputs)
    roots = (set(view.inputs) - pasts) | set(view.weights) | set(view.initializers)
    embedding = set(dec.embedding_nodes)
    made: set[str] = set()
    found: set[int] = set()
    for n in view.nodes:
        if n.is_constant:
            made.update(n.outputs)
            continue
        if n.has_subgraph or (n.name in embedding and n.op_type != "Shape"):
            continue
        if n.op_type == "Shape" or all(t in roots or t in made for t in n.reads):
            made.update(n.outputs)
            found.add(n.position)
    return frozenset(found)


class InputCopies:
    """The :data:`~onnxpipe.planning.stages.StageCopies` of a decoder: see the module for the rule.

    Called by :func:`~onnxpipe.planning.stages.assign_stages` for each stage, last to first (again from the
    last when it reassigns); :attr:`chosen` holds each stage's latest choice.
    """

    def __init__(
        self,
        view: ModelView,
        dec: DecoderInfo,
        phases: Sequence[PhaseCosts],
        bandwidth_bytes_per_s: float | Sequence[float],
        classes: Mapping[str, int],
        *,
        share: float | None = None,
    ) -> None:
        self.view = view
        self.phases = tuple(phases)
        self.bandwidths = bandwidth_bytes_per_s
        self.share = COPY_SHARE if share is None else share
        self.classes = classes
        self.allowed = input_derived(view, dec)
        self.pasts = frozenset(dec.past_inputs)
        self.chosen: dict[int, Copied] = {}
        self._received: dict[int, frozenset[object]] = {}

    def _value(self, tensor: str) -> object:
        """The value ``tensor`` holds: its class of equal tensors, or itself."""
        return self.classes.get(tensor, tensor)

    def __call__(self, stage: int, kinds: ValueKinds, received: Sequence[str], rec: Recomputed) -> Recomputed:
        view = self.view
        spared = set(rec.tensors)
        data = [t for t in received if t not in spared and not kinds.recomputable(t)]
        later: set[object] = set().union(*(values for s, values in self._received.items() if s > stage))
        candidates = [
            t
            for t in data
            if t not in view.inputs and view.producer.get(t) in self.allowed and self._value(t) not in later
        ]
        have = (set(view.inputs) - self.pasts) | {t for t in data if t not in candidates}
        have |= {t for t in received if t in self.pasts}  # the stage's own layers' cache
        chosen = set(rec.positions)
        sources = dict(rec.shape_sources)
        tensors: list[str] = []
        nodes: set[int] = set()
        seconds = [0.0] * len(self.phases)
        budget = [self.share * p.stage_compute[stage] for p in self.phases]
        for t in candidates:
            found = copy_closure(view, kinds, t, have, view.weights, chosen, self.allowed)
            if found is None:
                continue
            added, subs = found
            cost = [sum(p.seconds(stage, view.nodes[q].name) for q in added) for p in self.phases]
            size = [int(p.sizes.get(t, 0) * p.scale) for p in self.phases]
            bandwidth = _at(self.bandwidths, stage)
            if not all(map(self._cheaper, cost, size, seconds, budget, [bandwidth] * len(cost))):
                continue
            tensors.append(t)
            nodes |= added
            chosen |= added
            sources.update(subs)
            seconds = [a + b for a, b in zip(seconds, cost, strict=True)]
        self.chosen[stage] = Copied(
            tuple(tensors), tuple(view.nodes[q].name for q in sorted(nodes)), tuple(seconds)
        )
        self._received[stage] = frozenset(self._value(t) for t in data if t not in tensors)
        if not tensors:
            return rec
        return Recomputed(
            tuple(sorted(chosen)),
            (*rec.tensors, *tensors),
            rec.still_received,
            tuple(sorted(sources.items())),
        )

    @staticmethod
    def _cheaper(cost: float, size: int, spent: float, budget: float, bandwidth: float) -> bool:
        """Whether, at one phase, copies of ``cost`` seconds beat receiving ``size`` bytes over a link of
        ``bandwidth``, or (a free link) fit in ``budget`` with the ``spent`` of the earlier ones."""
        if size <= 0:
            return False
        if _priced(bandwidth):
            return cost < size / bandwidth
        return spent + cost <= budget


def _priced(bandwidth: float) -> bool:
    """Whether a link of ``bandwidth`` charges its bytes (``inf``: the plan treats it as free)."""
    return math.isfinite(bandwidth) and bandwidth > 0


def _at(bandwidths: float | Sequence[float], stage: int) -> float:
    """The bandwidth of the link in front of ``stage``: one for all, or one per stage."""
    return float(bandwidths) if isinstance(bandwidths, (int, float)) else float(bandwidths[stage])


def priced_cuts(
    view: ModelView,
    dec: DecoderInfo,
    seqs: Sequence[Sequences],
    node_seconds: Sequence[Mapping[str, float]],
    bandwidth: float,
) -> list[list[float]]:
    """Per phase (``seqs[i]`` measured with ``node_seconds[i]``), the bytes in front of each position as
    the partitioner should weigh them when stages will copy what is cheaper to copy: a tensor made of the
    model inputs whose copies (from scratch) beat its bytes at ``bandwidth`` at every phase counts,
    at each position it crosses, as the bytes its copies' seconds would send (``seconds * bandwidth``).

    Why: the stage then pays the copies instead of the transfer, and the cuts are chosen knowing it;
    the plan's figures are still worked out from the real bytes and copies (:func:`adjusted`).  With no
    bandwidth the links cost nothing and the cut bytes are returned as they are.
    """
    cuts = [[float(b) for b in seq.cut_bytes] for seq in seqs]
    if not _priced(bandwidth) or not seqs:
        return cuts
    kinds = value_kinds(view)
    allowed = input_derived(view, dec)
    order = seqs[0].compute
    at = {n.name: p for p, n in enumerate(order)}
    have = set(view.inputs) - set(dec.past_inputs)
    for q in sorted(allowed):
        for t in view.nodes[q].outputs:
            if kinds.recomputable(t) or view.nodes[q].name not in at:
                continue
            readers = [at[view.nodes[r].name] for r in view.consumers.get(t, ()) if view.nodes[r].name in at]
            first, last = at[view.nodes[q].name] + 1, max(readers, default=-1)
            if last < first:
                continue
            found = copy_closure(view, kinds, t, have, view.weights, (), allowed)
            if found is None:
                continue
            cost = [
                sum(max(0.0, float(ns.get(view.nodes[n].name, 0.0))) for n in found[0]) for ns in node_seconds
            ]
            size = [float(seq.sizes.get(t, 0)) for seq in seqs]
            if not all(c < b / bandwidth for c, b in zip(cost, size, strict=True)):
                continue
            for phase, cut in enumerate(cuts):
                cheaper = size[phase] - cost[phase] * bandwidth
                for p in range(first, last + 1):
                    cut[p] = max(0.0, cut[p] - cheaper)
    return cuts


def gone_bytes(
    view: ModelView, stages: Sequence[StageSpec], copied: Mapping[int, Copied], sizes: Mapping[str, int]
) -> list[int]:
    """Per stage, the bytes (at ``sizes``) of the copied tensors that no longer cross the cut in front of
    it: made by an earlier stage, copied by this stage or a later one, received by none of those."""
    stage_of = {n: st.index for st in stages for n in st.node_names}
    out: list[int] = []
    for st in stages:
        later = [s for s in stages if s.index >= st.index]
        still = {t for s in later for t in s.inputs}
        gone = {
            t
            for s in later
            for t in (copied[s.index].tensors if s.index in copied else ())
            if t not in still and _made_in(view, stage_of, t) < st.index
        }
        out.append(sum(int(sizes.get(t, 0)) for t in gone))
    return out


def _made_in(view: ModelView, stage_of: Mapping[str, int], tensor: str) -> int:
    pos = view.producer.get(tensor)
    return stage_of.get(view.nodes[pos].name, -1) if pos is not None else -1


def adjusted(
    part: Partition,
    copied: Mapping[int, Copied],
    gone: Sequence[float],
    phase: int,
    bandwidth: float | Sequence[float],
    *,
    overlap: bool = False,
) -> Partition:
    """``part`` (one phase's scores of the split) with each stage's copies' seconds at ``phase`` (an index
    into :class:`PhaseCosts` order) added to its compute and ``gone`` bytes taken off its transfer (at
    the bandwidth of the link in front of it); a stage costs compute plus transfer, or the larger of the
    two when they ``overlap`` (as the partitioner scored it)."""
    compute = tuple(
        c + (copied[s].seconds[phase] if s in copied else 0.0) for s, c in enumerate(part.compute)
    )
    transfer = tuple(
        max(0.0, t - gone[s] / _at(bandwidth, s)) if s > 0 and _priced(_at(bandwidth, s)) else t
        for s, t in enumerate(part.transfer)
    )
    return part.recosted(
        compute, transfer, overlap=overlap, cut_bytes=max(0, part.cut_bytes_total - int(sum(gone[1:])))
    )


def with_copy_costs(
    stages: Sequence[StageSpec], part: Partition, gone: Sequence[int] | None = None
) -> tuple[StageSpec, ...]:
    """``stages`` with the compute and transfer of ``part`` (as :func:`adjusted` made it) and ``gone``
    bytes taken off what crosses the cut in front of each (None: every cut carries what it did)."""
    return tuple(
        dataclasses.replace(
            st,
            compute_seconds=float(part.compute[st.index]),
            transfer_seconds=float(part.transfer[st.index]),
            link_bytes_in=(
                max(0, st.link_bytes_in - gone[st.index])
                if gone is not None and st.index > 0
                else st.link_bytes_in
            ),
        )
        for st in stages
    )


@dataclass(frozen=True)
class Counted:
    """Stages with what they copy counted (:func:`counting_copies`): their costs, each phase's partition
    so changed, and the copies' note (None when there are none)."""

    stages: tuple[StageSpec, ...]
    parts: tuple[Partition, ...]
    note: str | None


def counting_copies(
    view: ModelView,
    stages: Sequence[StageSpec],
    parts: Sequence[Partition],
    copies: InputCopies | None,
    phases: Sequence[PhaseCosts],
    bandwidth: float,
) -> Counted:
    """``stages`` and each phase's partition (``parts``, in ``phases`` order) with the copies ``copies``
    chose: :func:`adjusted` per phase, the stages' compute and transfer the last phase's (what a plan
    reports), each phase's estimate in ``phase_seconds``."""
    chosen = copies.chosen if copies is not None else {}
    gone = [gone_bytes(view, stages, chosen, p.sizes) for p in phases]
    fixed = tuple(
        adjusted(part, chosen, g, i, bandwidth) for i, (part, g) in enumerate(zip(parts, gone, strict=True))
    )
    counted = tuple(
        dataclasses.replace(
            st,
            phase_seconds=tuple(
                (p.phase, f.stage_costs[st.index]) for p, f in zip(phases, fixed, strict=True)
            ),
        )
        for st in with_copy_costs(stages, fixed[-1], gone[-1])
    )
    return Counted(counted, fixed, copies_note(chosen, phases, gone))


def copies_note(
    copied: Mapping[int, Copied], phases: Sequence[PhaseCosts], gone: Sequence[Sequence[int]]
) -> str | None:
    """One line: what each stage makes of the model inputs instead of receiving, and the bytes per step
    of each phase that no longer cross its cut (``gone``: per phase, per stage)."""
    parts = []
    for s in sorted(copied):
        c = copied[s]
        if not c.tensors:
            continue
        spared = ", ".join(f"{g[s]} B at {p.phase}" for p, g in zip(phases, gone, strict=True))
        parts.append(f"stage {s}: {len(c.tensors)} tensor(s) with {len(c.nodes)} node(s) copied, {spared}")
    if not parts:
        return None
    return (
        "rotary tables and masks made of the model inputs in each stage that reads them when cheaper than "
        "receiving them (onnxpipe.planning.decoder_recompute); less crossing each cut per step: "
        + "; ".join(parts)
    )
