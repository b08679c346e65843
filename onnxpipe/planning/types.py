"""A plan: which nodes each stage holds, what flows between the stages, and the numbers that justify it.

Plain frozen data over node and tensor names: the planners (:mod:`onnxpipe.planning.planner`,
:mod:`onnxpipe.planning.cluster`) make one, the exporter writes it out, the CLI prints it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from onnxpipe.cluster.costs import DeviceCosts
from onnxpipe.cluster.model import Cluster
from onnxpipe.core.choices import LinkModel, Phase
from onnxpipe.core.inputfiles import InputRecord
from onnxpipe.planning.records import DecoderRecord, NodeSplit, PlanSummary, SameValue
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
    """A decoder's layers whose KV cache this stage holds (:mod:`onnxpipe.planning.decoder`)."""
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


@dataclass(frozen=True)
class Plan:
    """A K-stage partition of one model, with the numbers that justify it."""

    model_sha256: str
    stages: tuple[StageSpec, ...]
    bottleneck_seconds: float
    lower_bound_seconds: float
    cost_source: str
    threads: int
    bandwidth_bytes_per_s: float
    input_shapes: Mapping[str, tuple[int, ...]]
    tensor_bytes: Mapping[str, int] = field(repr=False)
    objective: str = "minimize the largest stage time (compute + transfer in)"
    notes: tuple[str, ...] = ()
    timeline: Timeline | None = None
    cluster: Cluster | None = None
    device_costs: tuple[DeviceCosts, ...] = ()
    microbatch_size: int = 1
    workers: int | None = None
    """How many workers an interleaved split deals its stages out to; None: a worker per stage."""
    time_slack: float = 0.0
    """The slowdown an interleaved split was allowed to trade for balanced weights."""
    decoder: DecoderRecord | None = None
    """Set when the model is a decoder with a KV cache (:mod:`onnxpipe.planning.decoder`)."""
    reference_seconds: float | None = None
    """The whole model's time per run with the plan's threads at the profiled shapes, measured when the
    stage estimates were (see :attr:`onnxpipe.manifest.PlanSummary.reference_seconds`)."""
    profiled_inputs: tuple[InputRecord, ...] = ()
    """The ``--inputs`` files the costs came from (:attr:`onnxpipe.cost.profile.Profile.inputs`)."""
    node_splits: tuple[NodeSplit, ...] = ()
    """Nodes cut into parts over consecutive stages (``--split-nodes auto``); the stages then name the
    parts' nodes, which the model cut by :func:`onnxpipe.planning.nodesplit.cut_node` holds."""
    stage_counts_tried: tuple[tuple[int, float], ...] = ()
    """``--stages auto``: each stage count tried and its bottleneck (``inf``: could not be made)."""
    link_model: LinkModel | None = None
    """``serial`` or ``overlap`` (:mod:`onnxpipe.planning.links`); None for a plan made outside the
    planner."""

    @property
    def k(self) -> int:
        return len(self.stages)

    @property
    def ratio_to_lower_bound(self) -> float:
        if self.lower_bound_seconds <= 0:
            return 1.0
        return self.bottleneck_seconds / self.lower_bound_seconds

    def stage_of(self) -> dict[str, int]:
        """Node name -> stage index, for every compute node."""
        return {n: s.index for s in self.stages for n in s.node_names}

    def summary(self, duplicated_param_bytes: int, more_notes: Sequence[str]) -> PlanSummary:
        """The numbers the manifest keeps of the plan (its ``plan``), made here only: a field the two share
        is copied in this one place.  ``duplicated_param_bytes`` and ``more_notes`` are the export's
        (weights written more than once, what it found at the stage boundaries)."""
        return PlanSummary(
            objective=self.objective,
            k=self.k,
            bottleneck_seconds=self.bottleneck_seconds,
            lower_bound_seconds=self.lower_bound_seconds,
            ratio_to_lower_bound=self.ratio_to_lower_bound,
            cost_source=self.cost_source,
            threads=self.threads,
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s,
            profiled_input_shapes={n: tuple(int(d) for d in v) for n, v in self.input_shapes.items()},
            notes=(*self.notes, *more_notes),
            duplicated_param_bytes=duplicated_param_bytes,
            workers=self.workers,
            time_slack=self.time_slack,
            reference_seconds=self.reference_seconds,
            profiled_inputs=self.profiled_inputs,
            node_splits=self.node_splits,
            link_model=self.link_model,
            decoder=self.decoder,
        )
