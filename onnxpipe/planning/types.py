"""A plan: which nodes each stage holds, what flows between the stages, and the numbers that justify it.

Plain frozen data over node and tensor names: the planners (:mod:`onnxpipe.planning.planner`,
:mod:`onnxpipe.planning.cluster`) make one, the exporter writes it out, the CLI prints it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from onnxpipe.cluster.costs import DeviceCosts
from onnxpipe.cluster.model import Cluster
from onnxpipe.core.choices import BoundaryDtype, Phase
from onnxpipe.planning.records import PlanFigures, PlanSummary, SameValue
from onnxpipe.schedule.timeline import Timeline

ShapeParts = tuple[int | tuple[str, int], ...]
"""A tensor's dims as a stage can make them: a number, or (tensor, axis) of a tensor of that stage."""


@dataclass(frozen=True)
class StageSpec:
    """One stage: its nodes, the tensors it receives and emits, and its estimated costs."""

    index: int
    node_names: tuple[str, ...]
    constant_nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    compute_seconds: float
    transfer_seconds: float
    bytes_in: int
    bytes_out: int
    param_bytes: int
    peak_activation_bytes: int
    device: str = "cpu"
    link_bytes_in: int = 0
    worker: int | None = None
    """The worker that runs the stage in an interleaved split (:func:`make_interleaved_plan`), else None."""
    aliases: tuple[SameValue, ...] = ()
    """Tensors the stage remakes from an equal one with an ``Identity`` node: those it reads and
    receives as an equal tensor of ``inputs`` (an earlier stage sends each value once), and repeats of
    a value it emits, remade from that output."""
    skipped_nodes: tuple[str, ...] = ()
    """Nodes of ``node_names`` left out of the stage file: what they computed is remade from an equal
    tensor (see ``aliases``) or no longer needed."""
    kv_layers: tuple[int, ...] = ()
    """A decoder's layers whose KV cache this stage holds (:mod:`onnxpipe.planning.decoder_plan`)."""
    kv_cache_bytes: int = 0
    """That cache's bytes at the plan's maximum context
    (:attr:`~onnxpipe.manifest.entries.DecoderRecord.max_context`)."""
    phase_seconds: tuple[tuple[Phase, float], ...] = ()
    """A decoder's estimated stage time at each phase profiled (``prefill``, ``decode``)."""

    recomputed_nodes: tuple[str, ...] = ()
    """Nodes of earlier stages this stage's file also holds (in the source's order, before its own):
    they make the shape values and constant-only values it would otherwise receive
    (:mod:`onnxpipe.planning.recompute`)."""
    recomputed_tensors: tuple[str, ...] = ()
    """The tensors those copies make that the stage reads instead of receiving them."""
    shape_sources: tuple[tuple[str, ShapeParts], ...] = ()
    """``(node, dims)`` for copies of ``Shape`` nodes whose input the stage does not have: the copy is
    made of the input's dims instead, each a number or ``(tensor, axis)`` of a tensor the stage has
    (:func:`onnxpipe.export.build` writes ``Shape``, ``Gather`` and ``Concat`` nodes for it)."""
    crossing_shape_values: tuple[str, ...] = ()
    """Values of shapes or weights alone (:class:`~onnxpipe.ir.shapevalues.ValueKinds`) the stage still
    receives: no cheap copy makes them from what it has, or their stage would have nothing else to send;
    the plan's notes name them."""

    @property
    def file_node_names(self) -> tuple[str, ...]:
        """The source nodes the stage file holds: ``node_names`` without ``skipped_nodes``."""
        skipped = set(self.skipped_nodes)
        return tuple(n for n in self.node_names if n not in skipped)

    @property
    def cost_seconds(self) -> float:
        return self.compute_seconds + self.transfer_seconds


@dataclass(frozen=True, kw_only=True)
class Plan(PlanFigures):
    """A K-stage partition of one model: its stages, and the numbers that justify it (its figures, which
    the manifest keeps as they are, :meth:`summary`)."""

    model_sha256: str
    stages: tuple[StageSpec, ...]
    input_shapes: Mapping[str, tuple[int, ...]]
    tensor_bytes: Mapping[str, int] = field(repr=False)
    objective: str = "minimize the largest stage time (compute + transfer in)"
    notes: tuple[str, ...] = ()
    timeline: Timeline | None = None
    cluster: Cluster | None = None
    device_costs: tuple[DeviceCosts, ...] = ()
    microbatch_size: int = 1
    stage_counts_tried: tuple[tuple[int, float], ...] = ()
    """``--stages auto``: each stage count tried and its bottleneck (``inf``: could not be made)."""
    boundary_dtypes: Mapping[str, BoundaryDtype] = field(default_factory=dict)
    """The float32 tensors crossing a cut that travel compressed, and as what
    (:func:`~onnxpipe.planning.planner.plan_with_wire`)."""

    @property
    def k(self) -> int:
        return len(self.stages)

    @property
    def latency_seconds(self) -> float:
        """One sample alone through every stage and link in turn: the sum of the stages' compute and
        transfer times (what the ``latency`` objective minimises; a stream waits on the bottleneck)."""
        return math.fsum(x for s in self.stages for x in (s.compute_seconds, s.transfer_seconds))

    @property
    def ratio_to_lower_bound(self) -> float:
        if self.lower_bound_seconds <= 0:
            return 1.0
        return self.bottleneck_seconds / self.lower_bound_seconds

    def stage_of(self) -> dict[str, int]:
        """Node name -> stage index, for every compute node."""
        return {n: s.index for s in self.stages for n in s.node_names}

    def summary(self, duplicated_param_bytes: int, more_notes: Sequence[str]) -> PlanSummary:
        """The manifest's ``plan``: the figures as they are, with the export's ``duplicated_param_bytes``
        (weights written more than once) and ``more_notes`` (what it found at the stage boundaries)."""
        figures = {f.name: getattr(self, f.name) for f in dataclasses.fields(PlanFigures)}
        return PlanSummary(
            **{**figures, "notes": (*self.notes, *more_notes)},
            k=self.k,
            ratio_to_lower_bound=self.ratio_to_lower_bound,
            profiled_input_shapes={n: tuple(int(d) for d in v) for n, v in self.input_shapes.items()},
            duplicated_param_bytes=duplicated_param_bytes,
        )


def stage_boundary(wire: Mapping[str, BoundaryDtype], spec: StageSpec) -> BoundaryDtype:
    """What the compressed float32 activations ``spec`` receives cross as (``wire``: a plan's
    :attr:`~Plan.boundary_dtypes`; float32 when none is)."""
    return next((wire[t] for t in spec.inputs if t in wire), BoundaryDtype.FLOAT32)
