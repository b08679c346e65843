"""The records a plan is made of, beyond its stages: the values a stage remakes from an equal one, a
decoder's layers, cache tensors and limits, and the numbers the manifest keeps of a plan.

Defined here, in the room that makes them, and written to and read from ``manifest.json`` as they are by
:mod:`onnxpipe.core.codec` (their field names are the manifest's keys, docs/manifest.md): the manifest
holds these records, it does not copy them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, NamedTuple

from onnxpipe.core.choices import Ends, LinkModel, Objective, Phase, PhaseChoice
from onnxpipe.core.codec import FieldError, Finite, Minimum
from onnxpipe.core.files import FileName
from onnxpipe.core.inputfiles import InputRecord
from onnxpipe.core.iocontract import IOContract

Positive = Annotated[int, Minimum(1)]


@dataclass(frozen=True)
class SameValue:
    """A tensor a stage's nodes read under ``name`` and that it receives as the equal input ``same_as``
    (an ``Identity`` node in the stage file makes one from the other).

    A plan's stage (:attr:`onnxpipe.planning.types.StageSpec.aliases`) also remakes so the repeats of a
    value it emits, from that output; the manifest lists the received ones only."""

    name: str
    same_as: str


@dataclass(frozen=True)
class DecoderModelRecord:
    """``plan.decoder.model``: what a generator checks before any work, from the model's own config and its
    graph, and the tokenizer files the split copied beside its stages (optional; a manifest written before
    it lacks it)."""

    vocab_size: Positive | None = None
    """Token ids are below it: the logits' width (else the embedding's rows)."""
    context_length: Positive | None = None
    """Positions the model itself takes (its config's, its rotary or position table's); None when nothing
    says."""
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    """The ids that end a sequence, from the model's config; empty when no config says them."""
    pad_token_id: int | None = None
    config: str | None = None
    """The config file the ids and context came from (``genai_config.json``, ``config.json``); None: the
    graph alone."""
    files: tuple[FileName, ...] = ()
    """The tokenizer, chat template and generation files copied into the folder."""
    chat_template: FileName | None = None
    """The file in the folder that holds the chat template (``chat_template.jinja``,
    ``tokenizer_config.json``...); None when the model has none."""


class PhaseShape(NamedTuple):
    """A phase a decoder was profiled at: its new tokens and its cached ones."""

    phase: Phase
    new_tokens: Positive
    past_tokens: int


@dataclass(frozen=True)
class DecoderRecord:
    """What the plan of a decoder with a KV cache adds: its layers, how it was cut, the context its cache
    is counted at (the plan's ``decoder``, and ``plan.decoder`` in the manifest)."""

    layers: Positive
    layer_cuts: bool
    """Whether cuts fell between layers only (each layer's cache in one stage)."""
    ends: Ends
    """Where the embedding and LM head went."""
    max_context: Positive
    """Tokens of context the stages' ``kv_cache_bytes`` are for: the ``max_context`` asked for, or the
    model's own context where that is smaller."""
    phase: PhaseChoice
    """What the stage estimates are for."""
    phase_shapes: tuple[PhaseShape, ...] = ()
    """(phase, new tokens, cached tokens) of each phase profiled."""
    io: IOContract | None = None
    """The tensors a generation loop feeds and reads, each with its role (the split's IO contract)."""
    model: DecoderModelRecord | None = None
    """The model's limits and token ids, and the tokenizer files in the folder (written by the export)."""


@dataclass(frozen=True)
class NodeSplit:
    """One node cut into parts placed in consecutive stages (``--split-nodes auto``), and why
    (``plan.node_splits[]`` in the manifest, added in schema 3).

    The split passed ``contiguous_bound_seconds``, ``max(total / K, largest node)``: no contiguous split
    can beat it, and the best one found (``contiguous_bottleneck_seconds``) is at or above it.
    """

    node: str
    kind: str
    """How it was cut: ``columns``, ``reduction`` or ``channels``
    (:class:`onnxpipe.planning.nodesplit.find.SplitKind`)."""
    parts: Annotated[int, Minimum(2)]
    stages: tuple[int, ...]
    """The stage of each part, in order; the join runs in the last one."""
    contiguous_bound_seconds: float
    """``max(total / K, largest node)``: the bound no contiguous split beats, which this split passed."""
    contiguous_bottleneck_seconds: float
    carried: tuple[str, ...] = ()
    """The nodes after it that each part computes on its slice (a bias, an activation)."""
    part_nodes: tuple[tuple[str, ...], ...] = ()
    """Each part's nodes (in the cut model :func:`onnxpipe.planning.nodesplit.cut.cut_node` makes); empty
    in a manifest written before the field."""
    join: str = ""
    """The node that joins the parts' results; empty in a manifest written before the field."""
    measured: bool = False
    """Whether the parts' costs were timed (:func:`onnxpipe.planning.nodesplit.cut.sized_costs`) or scaled
    by their share."""

    def __post_init__(self) -> None:
        if len(self.stages) != self.parts or list(self.stages) != sorted(self.stages):
            raise FieldError(
                "stages",
                f"expected {self.parts} non-decreasing stage indices, one per part, got {list(self.stages)}",
            )


@dataclass(frozen=True, kw_only=True)
class PlanFigures:
    """The numbers that justify a partition, and how it was made: what a plan
    (:class:`~onnxpipe.planning.types.Plan`) and the manifest's ``plan`` (:class:`PlanSummary`) both hold,
    declared once here."""

    objective: str
    bottleneck_seconds: float
    lower_bound_seconds: float
    cost_source: str
    threads: Positive
    bandwidth_bytes_per_s: float
    notes: tuple[str, ...]
    workers: Positive | None = None
    """How many workers an interleaved split deals its stages out to (``None``: a worker per stage)."""
    time_slack: Annotated[float, Finite()] = 0.0
    """An interleaved split's accepted slowdown for weight balance (see ``onnxpipe split --time-slack``)."""
    worker_param_bytes: tuple[int, ...] | None = None
    """With ``workers``: each worker's weight bytes, every tensor its stages hold counted once (a tied
    embedding and LM head on one worker's first and last stage, once); absent otherwise.  The manifest's
    counts the stage files' weights (:func:`onnxpipe.export.record.shared_weights`)."""
    reference_seconds: Annotated[float, Finite()] | None = None
    """The whole model's time per run (one session, the plan's threads, the profiled shapes), measured
    when the stage estimates were: the profile's median run, or timed right after calibration.  A run
    times the model again (``onnxpipe run --compare``) and so tells the machine's own change of speed
    since from what the estimates got wrong.  None for static costs and plans for other devices."""
    profiled_inputs: tuple[InputRecord, ...] = ()
    """The sample input files (``--inputs``) the costs were measured on, by name, sha256 and shapes
    (never their data); empty when the inputs were random at the profiled shapes."""
    node_splits: tuple[NodeSplit, ...] = ()
    """Nodes cut into parts placed in consecutive stages (``--split-nodes auto``); the stages then name the
    parts' nodes, which the model cut by :func:`onnxpipe.planning.nodesplit.cut.cut_node` holds."""
    link_model: LinkModel | None = None
    """``serial`` (a stage's transfer in adds to its compute) or ``overlap`` (links run beside compute);
    None for a plan made outside the planner, and in a manifest written before the field (whose plans were
    serial without a devices file, overlap with one)."""
    decoder: DecoderRecord | None = None
    """Set when the model is a decoder with a KV cache (:mod:`onnxpipe.planning.decoder_plan`)."""
    optimized_for: Objective | None = None
    """The objective that chose the split (``throughput``: the bottleneck; ``latency``: one request's
    time through every stage and link); None for a plan made outside the planner, and in a manifest
    written before the field (whose plans were all throughput)."""

    def __post_init__(self) -> None:
        if self.time_slack < 0:
            raise FieldError("time_slack", f"expected a share of 0 or more, got {self.time_slack}")
        if self.reference_seconds is not None and self.reference_seconds <= 0:
            raise FieldError(
                "reference_seconds", f"expected a time above 0 seconds, got {self.reference_seconds}"
            )


@dataclass(frozen=True, kw_only=True)
class PlanSummary(PlanFigures):
    """The manifest's ``plan``: the plan's figures (made by :meth:`onnxpipe.planning.types.Plan.summary`)
    and what the export adds."""

    k: Positive
    ratio_to_lower_bound: float
    profiled_input_shapes: Mapping[str, tuple[int, ...]]
    duplicated_param_bytes: int = 0
    """Bytes of weights held by more than one worker (each weight's bytes times the workers beyond the
    first that hold it; the stages of one worker count it once)."""
