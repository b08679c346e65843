"""What ``manifest.json`` holds, entry by entry: frozen dataclasses and the words that stand for places.

The whole manifest is :class:`onnxpipe.manifest.manifest.Manifest`; these are its parts.  Nothing here
imports onnx: a runtime that only reads split folders needs none of the splitting machinery.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from onnxpipe.core.choices import Ends, LinkModel, Phase, PhaseChoice
from onnxpipe.core.dims import Shape
from onnxpipe.core.inputfiles import InputRecord
from onnxpipe.core.iocontract import IOContract

SCHEMA_VERSION = 4
"""Version 4 writes a decoder's ``plan.decoder.io`` as its IO contract (each tensor with its role);
version 3 adds the fields a runner must honour (a device's ``runtime``, a decoder's ``kv_layers``)
and the boundary contract; version 2 spelled the place a pass-through model output comes from
``"model_input"`` (version 1: ``"model input"``).  All four are read (docs/manifest.md, versioning)."""
READABLE_VERSIONS = (1, 2, 3, 4)
MANIFEST_NAME = "manifest.json"

MODEL: Literal["model"] = "model"
"""A stage input's ``source`` when the caller feeds it (a model input)."""
MODEL_INPUT: Literal["model_input"] = "model_input"
"""A model output's ``produced_by`` when it is a model input passed through."""
MODEL_OUTPUT: Literal["model_output"] = "model_output"
"""A stage output's consumer when the caller receives it (a model output)."""
V1_MODEL_INPUT = "model input"
"""How version 1 spelled :data:`MODEL_INPUT`."""


@dataclass(frozen=True)
class SourceInfo:
    """The model that was split: its file name, where it is, and its content hash.

    ``path`` is relative to the folder holding ``manifest.json`` (POSIX separators), absolute when no
    relative path exists, or ``None`` when the model was never a file.
    """

    file: str
    path: str | None
    sha256: str


@dataclass(frozen=True)
class ModelTensor:
    """A model input: name, numpy dtype name, shape with its symbolic dims (the model's own names)."""

    name: str
    dtype: str
    shape: Shape
    profiled_shape: tuple[int, ...] | None = None
    """Its concrete shape when the model ran at ``plan.profiled_input_shapes`` (observed, or worked out
    from the model inputs' symbols); None when neither could tell (added in schema 3)."""
    batch_axis: int | None = None
    """The axis that carries the model inputs' batch dim; None when it has none (added in schema 3)."""


@dataclass(frozen=True)
class ModelOutput:
    """A model output and the stage that produces it (``"model_input"`` for a pass-through input)."""

    name: str
    dtype: str
    shape: Shape
    produced_by: int | Literal["model_input"]
    profiled_shape: tuple[int, ...] | None = None
    """Its concrete shape when the model ran at ``plan.profiled_input_shapes`` (observed, or worked out
    from the model inputs' symbols); None when neither could tell (added in schema 3)."""
    batch_axis: int | None = None
    """The axis that carries the model inputs' batch dim; None when it has none (added in schema 3)."""


@dataclass(frozen=True)
class StageInput:
    """A tensor a stage receives; ``source`` is ``"model"`` or the index of the stage producing it."""

    name: str
    dtype: str
    shape: Shape
    bytes_per_sample: int
    source: int | Literal["model"]
    profiled_shape: tuple[int, ...] | None = None
    """Its concrete shape when the model ran at ``plan.profiled_input_shapes`` (observed, or worked out
    from the model inputs' symbols); None when neither could tell (added in schema 3)."""
    batch_axis: int | None = None
    """The axis that carries the model inputs' batch dim; None when it has none (added in schema 3)."""


@dataclass(frozen=True)
class StageOutput:
    """A tensor a stage emits; ``consumers`` are later stage indices and/or ``"model_output"``."""

    name: str
    dtype: str
    shape: Shape
    bytes_per_sample: int
    consumers: tuple[int | Literal["model_output"], ...]
    profiled_shape: tuple[int, ...] | None = None
    """Its concrete shape when the model ran at ``plan.profiled_input_shapes`` (observed, or worked out
    from the model inputs' symbols); None when neither could tell (added in schema 3)."""
    batch_axis: int | None = None
    """The axis that carries the model inputs' batch dim; None when it has none (added in schema 3)."""


@dataclass(frozen=True)
class SameValue:
    """A tensor a stage's nodes read under ``name`` and that it receives as the equal input ``same_as``
    (an ``Identity`` node in the stage file makes one from the other).

    A plan's stage (:attr:`onnxpipe.planning.types.StageSpec.aliases`) also remakes so the repeats of a
    value it emits, from that output; the manifest lists the received ones only."""

    name: str
    same_as: str


@dataclass(frozen=True)
class StageEntry:
    """One stage file and what the plan estimated for it."""

    index: int
    file: str
    sha256: str
    external_data: str | None
    external_data_sha256: str | None
    node_count: int
    constant_node_count: int
    device: str
    inputs: tuple[StageInput, ...]
    outputs: tuple[StageOutput, ...]
    estimated_compute_seconds: float
    estimated_transfer_seconds: float
    param_bytes: int
    peak_activation_bytes: int
    shared_param_bytes: int = 0
    link_bytes_in: int = 0
    worker: int | None = None
    """The worker that runs this stage (an interleaved split deals ``K * V`` stages out to ``K`` workers
    in turn); ``None`` in a manifest written before the field existed, which means a worker per stage:
    read it through :meth:`Manifest.worker_of`."""
    skipped_node_count: int = 0
    """Compute nodes of this stage's range left out of its file: what they computed is remade from an
    equal value (received by a later stage, ``same_values`` there, or by this one from a value it
    emits).  ``node_count`` plus this, over all stages, is the model's compute node count."""
    same_values: tuple[SameValue, ...] = ()
    """Inputs this stage's nodes read under another name: provably equal to an input it receives."""
    recomputed_node_count: int = 0
    """Copies of earlier stages' nodes in this file: they make the shape values and constant-only
    values it would otherwise receive (added in schema 3)."""
    required_opsets: tuple[tuple[str, int], ...] = ()
    """``(domain, version)`` of every op domain the stage file's nodes use (``""`` is the default ONNX
    domain), sorted: what a runtime must support to load it (added in schema 3)."""

    kv_layers: tuple[int, ...] = ()
    """A decoder's layers whose KV cache this stage holds (its past inputs and present outputs)."""
    kv_cache_bytes: int = 0
    """That cache's bytes at the plan's maximum context (:attr:`DecoderRecord.max_context`)."""
    estimated_phase_seconds: tuple[tuple[Phase, float], ...] = ()
    """A decoder's estimated stage time at each phase profiled, as (phase, seconds)."""


@dataclass(frozen=True)
class NodeSplitRecord:
    """A node the plan cut into parts over consecutive stages (added in schema 3, optional; made by
    :meth:`onnxpipe.planning.types.NodeSplit.record`)."""

    node: str
    kind: str
    parts: int
    stages: tuple[int, ...]
    contiguous_bound_seconds: float
    """``max(total / K, largest node)``: the bound no contiguous split beats, which this split passed."""
    contiguous_bottleneck_seconds: float


@dataclass(frozen=True)
class DecoderModelRecord:
    """``plan.decoder.model``: what a generator checks before any work, from the model's own config and its
    graph, and the tokenizer files the split copied beside its stages (optional; a manifest written before
    it lacks it)."""

    vocab_size: int | None
    """Token ids are below it: the logits' width (else the embedding's rows)."""
    context_length: int | None
    """Positions the model itself takes (its config's, its rotary or position table's); None when nothing
    says."""
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    """The ids that end a sequence, from the model's config; empty when no config says them."""
    pad_token_id: int | None = None
    config: str | None = None
    """The config file the ids and context came from (``genai_config.json``, ``config.json``); None: the
    graph alone."""
    files: tuple[str, ...] = ()
    """The tokenizer, chat template and generation files copied into the folder."""
    chat_template: str | None = None
    """The file in the folder that holds the chat template (``chat_template.jinja``,
    ``tokenizer_config.json``...); None when the model has none."""


@dataclass(frozen=True)
class DecoderRecord:
    """What the plan of a decoder with a KV cache adds: its layers, how it was cut, the context its cache
    is counted at (the plan's ``decoder``, and ``plan.decoder`` in the manifest)."""

    layers: int
    layer_cuts: bool
    """Whether cuts fell between layers only (each layer's cache in one stage)."""
    ends: Ends
    """Where the embedding and LM head went."""
    max_context: int
    """Tokens of context the stages' ``kv_cache_bytes`` are for: the ``max_context`` asked for, or the
    model's own context where that is smaller."""
    phase: PhaseChoice
    """What the stage estimates are for."""
    phase_shapes: tuple[tuple[Phase, int, int], ...] = ()
    """(phase, new tokens, cached tokens) of each phase profiled."""
    io: IOContract | None = None
    """The tensors a generation loop feeds and reads, each with its role (the split's IO contract)."""
    model: DecoderModelRecord | None = None
    """The model's limits and token ids, and the tokenizer files in the folder (written by the export)."""


@dataclass(frozen=True)
class PlanSummary:
    """The numbers that justify the partition (made by :meth:`onnxpipe.planning.types.Plan.summary`)."""

    objective: str
    k: int
    bottleneck_seconds: float
    lower_bound_seconds: float
    ratio_to_lower_bound: float
    cost_source: str
    threads: int
    bandwidth_bytes_per_s: float
    profiled_input_shapes: Mapping[str, tuple[int, ...]]
    notes: tuple[str, ...] = ()
    duplicated_param_bytes: int = 0
    workers: int | None = None
    """How many workers run the stages (``k`` unless the split is interleaved; ``None``: ``k``)."""
    time_slack: float = 0.0
    """An interleaved split's accepted slowdown for weight balance (see ``onnxpipe split --time-slack``)."""
    reference_seconds: float | None = None
    """The whole model's time per run (one session, the plan's threads, the profiled shapes), measured
    when the stage estimates were: the profile's median run, or timed right after calibration.  A run
    times the model again (``onnxpipe run --compare``) and so tells the machine's own change of speed
    since from what the estimates got wrong.  None for static costs and plans for other devices."""
    profiled_inputs: tuple[InputRecord, ...] = ()
    """The sample input files (``--inputs``) the costs were measured on, by name, sha256 and shapes
    (never their data); empty when the inputs were random at ``profiled_input_shapes``."""
    node_splits: tuple[NodeSplitRecord, ...] = ()
    """Nodes cut into parts placed in consecutive stages (``--split-nodes auto``); empty: none."""
    link_model: LinkModel | None = None
    """``serial`` (a stage's transfer in adds to its compute) or ``overlap`` (links run beside compute);
    None in a manifest written before the field (whose plans were serial without a devices file,
    overlap with one)."""
    decoder: DecoderRecord | None = None
    """Set when the model is a decoder with a KV cache."""


VERIFICATION_STATUSES = ("unverified", "passed", "failed")
"""``verification.status``: not (yet) compared with the model, or compared and found to match or not."""


@dataclass(frozen=True)
class VerificationRecord:
    """Whether and how the stages were compared with the model (``verification``, added in schema 3).

    ``split`` writes ``unverified`` with the stages and the result once its verification ends, so that
    a folder whose verification was interrupted (Ctrl-C) says so; ``onnxpipe verify`` writes its result.
    ``rtol``, ``atol``, ``seed``, ``runs`` and ``input_shapes`` say how (None while unverified)."""

    status: str
    rtol: float | None = None
    atol: float | None = None
    seed: int | None = None
    runs: int | None = None
    input_shapes: Mapping[str, tuple[int, ...]] | None = None

    @property
    def verified(self) -> bool:
        return self.status != "unverified"


@dataclass(frozen=True)
class DeviceRecord:
    """Where one stage runs and how its costs were obtained (``scaled``, ``profiled``, ``profile_file``)."""

    device: str
    method: str
    source: str
