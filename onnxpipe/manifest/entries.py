"""What ``manifest.json`` holds, entry by entry: frozen dataclasses and the words that stand for places.

The whole manifest is :class:`onnxpipe.manifest.manifest.Manifest`; these are its parts.  Nothing here
imports onnx: a runtime that only reads split folders needs none of the splitting machinery.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Literal, NamedTuple

from onnxpipe.core.choices import Ends, LinkModel, Phase, PhaseChoice
from onnxpipe.core.codec import Expected, FieldError, Finite, Minimum, json_name
from onnxpipe.core.inputfiles import InputRecord
from onnxpipe.core.jsonread import Rule
from onnxpipe.core.kv import KVPair

SCHEMA_VERSION = 3
"""Version 3 adds the fields a runner must honour (a device's ``runtime``, a decoder's ``kv_layers``)
and the boundary contract; version 2 spelled the place a pass-through model output comes from
``"model_input"`` (version 1: ``"model input"``).  All three are read (docs/manifest.md, versioning)."""
READABLE_VERSIONS = (1, 2, 3)
MANIFEST_NAME = "manifest.json"

MODEL: Literal["model"] = "model"
"""A stage input's ``source`` when the caller feeds it (a model input)."""
MODEL_INPUT: Literal["model_input"] = "model_input"
"""A model output's ``produced_by`` when it is a model input passed through."""
MODEL_OUTPUT: Literal["model_output"] = "model_output"
"""A stage output's consumer when the caller receives it (a model output)."""
V1_MODEL_INPUT = "model input"
"""How version 1 spelled :data:`MODEL_INPUT`."""


def _is_plain_file_name(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


# A stage file outside the folder would let a manifest make the runner load (and check_stage_files hash)
# any file on the machine; a malformed hash could never match, so it is refused when read, not at load.
FileName = Annotated[str, Rule(_is_plain_file_name, "a plain file name in the folder")]
Sha256 = Annotated[str, Rule(_is_sha256, "a sha256 as 64 lowercase hex digits")]
Shape = (
    tuple[Annotated[int | str | None, Expected("a dim (integer >= 0, symbolic name or null)")], ...] | None
)
"""A tensor's shape as the manifest keeps it (:data:`onnxpipe.core.dims.Shape`), each dim checked."""
StageOrModel = Annotated[int | Literal["model"], Expected('a stage index or "model"')]
StageOrModelInput = Annotated[int | Literal["model_input"], Expected('a stage index or "model_input"')]
StageOrModelOutput = Annotated[int | Literal["model_output"], Expected('a stage index or "model_output"')]
Positive = Annotated[int, Minimum(1)]


def _check_contract(shape: Shape, profiled_shape: tuple[int, ...] | None, batch_axis: int | None) -> None:
    """The boundary contract of a tensor entry (schema 3): a concrete profiled shape of the declared rank,
    and a batch axis within it."""
    if profiled_shape is not None and shape is not None and len(profiled_shape) != len(shape):
        raise FieldError(
            "profiled_shape", f"expected {len(shape)} dims, as many as its shape, got {len(profiled_shape)}"
        )
    rank = len(profiled_shape) if profiled_shape is not None else (len(shape) if shape is not None else None)
    if batch_axis is not None and rank is not None and batch_axis >= rank:
        raise FieldError("batch_axis", f"expected an axis below its rank {rank}, got {batch_axis}")


@dataclass(frozen=True)
class SourceInfo:
    """The model that was split: its file name, where it is, and its content hash.

    ``path`` is relative to the folder holding ``manifest.json`` (POSIX separators), absolute when no
    relative path exists, or ``None`` when the model was never a file.
    """

    file: str
    path: str | None
    sha256: Sha256


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

    def __post_init__(self) -> None:
        _check_contract(self.shape, self.profiled_shape, self.batch_axis)


@dataclass(frozen=True)
class ModelOutput:
    """A model output and the stage that produces it (``"model_input"`` for a pass-through input)."""

    name: str
    dtype: str
    shape: Shape
    produced_by: StageOrModelInput
    profiled_shape: tuple[int, ...] | None = None
    """Its concrete shape when the model ran at ``plan.profiled_input_shapes`` (observed, or worked out
    from the model inputs' symbols); None when neither could tell (added in schema 3)."""
    batch_axis: int | None = None
    """The axis that carries the model inputs' batch dim; None when it has none (added in schema 3)."""

    def __post_init__(self) -> None:
        _check_contract(self.shape, self.profiled_shape, self.batch_axis)


@dataclass(frozen=True)
class StageInput:
    """A tensor a stage receives; ``source`` is ``"model"`` or the index of the stage producing it."""

    name: str
    dtype: str
    shape: Shape
    bytes_per_sample: int
    source: StageOrModel
    profiled_shape: tuple[int, ...] | None = None
    """Its concrete shape when the model ran at ``plan.profiled_input_shapes`` (observed, or worked out
    from the model inputs' symbols); None when neither could tell (added in schema 3)."""
    batch_axis: int | None = None
    """The axis that carries the model inputs' batch dim; None when it has none (added in schema 3)."""

    def __post_init__(self) -> None:
        _check_contract(self.shape, self.profiled_shape, self.batch_axis)


@dataclass(frozen=True)
class StageOutput:
    """A tensor a stage emits; ``consumers`` are later stage indices and/or ``"model_output"``."""

    name: str
    dtype: str
    shape: Shape
    bytes_per_sample: int
    consumers: tuple[StageOrModelOutput, ...]
    profiled_shape: tuple[int, ...] | None = None
    """Its concrete shape when the model ran at ``plan.profiled_input_shapes`` (observed, or worked out
    from the model inputs' symbols); None when neither could tell (added in schema 3)."""
    batch_axis: int | None = None
    """The axis that carries the model inputs' batch dim; None when it has none (added in schema 3)."""

    def __post_init__(self) -> None:
        _check_contract(self.shape, self.profiled_shape, self.batch_axis)


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
    file: FileName
    sha256: Sha256
    external_data: FileName | None
    external_data_sha256: Sha256 | None
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
    required_opsets: tuple[tuple[str, Positive], ...] = ()
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
    parts: Annotated[int, Minimum(2)]
    stages: tuple[int, ...]
    contiguous_bound_seconds: float
    """``max(total / K, largest node)``: the bound no contiguous split beats, which this split passed."""
    contiguous_bottleneck_seconds: float

    def __post_init__(self) -> None:
        if len(self.stages) != self.parts or list(self.stages) != sorted(self.stages):
            raise FieldError(
                "stages",
                f"expected {self.parts} non-decreasing stage indices, one per part, got {list(self.stages)}",
            )


@dataclass(frozen=True)
class DecoderIORecord:
    """``plan.decoder.io``: what a generation loop feeds and reads (optional; a manifest written before
    it lacks it, and ``onnxpipe generate`` then asks for a fresh split)."""

    ids_input: str = field(metadata=json_name("input_ids"))
    mask_input: str | None = field(metadata=json_name("attention_mask"))
    positions_input: str | None = field(metadata=json_name("position_ids"))
    logits_output: str | None = field(metadata=json_name("logits"))
    kv: tuple[KVPair, ...]
    """Each layer's past and present tensors, as :func:`onnxpipe.ir.decoder.find_decoder` found them."""

    def __post_init__(self) -> None:
        if not self.kv:
            raise FieldError("kv", "expected at least one layer's cache tensors")

    def past_to_present(self) -> dict[str, str]:
        """Each past input's present output (the next step's past)."""
        return {p: q for r in self.kv for p, q in zip(r.pasts, r.presents, strict=True)}


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
    io: DecoderIORecord | None = None
    """The tensors a generation loop feeds and reads."""
    model: DecoderModelRecord | None = None
    """The model's limits and token ids, and the tokenizer files in the folder (written by the export)."""


@dataclass(frozen=True)
class PlanSummary:
    """The numbers that justify the partition (made by :meth:`onnxpipe.planning.types.Plan.summary`)."""

    objective: str
    k: Positive
    bottleneck_seconds: float
    lower_bound_seconds: float
    ratio_to_lower_bound: float
    cost_source: str
    threads: Positive
    bandwidth_bytes_per_s: float
    profiled_input_shapes: Mapping[str, tuple[int, ...]]
    notes: tuple[str, ...]
    duplicated_param_bytes: int = 0
    workers: Positive | None = None
    """How many workers run the stages (``k`` unless the split is interleaved; ``None``: ``k``)."""
    time_slack: Annotated[float, Finite()] = 0.0
    """An interleaved split's accepted slowdown for weight balance (see ``onnxpipe split --time-slack``)."""
    reference_seconds: Annotated[float, Finite()] | None = None
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

    def __post_init__(self) -> None:
        if self.time_slack < 0:
            raise FieldError("time_slack", f"expected a share of 0 or more, got {self.time_slack}")
        if self.reference_seconds is not None and self.reference_seconds <= 0:
            raise FieldError(
                "reference_seconds", f"expected a time above 0 seconds, got {self.reference_seconds}"
            )


VerificationStatus = Literal["unverified", "passed", "failed"]
"""``verification.status``: not (yet) compared with the model, or compared and found to match or not."""


@dataclass(frozen=True)
class VerificationRecord:
    """Whether and how the stages were compared with the model (``verification``, added in schema 3).

    ``split`` writes ``unverified`` with the stages and the result once its verification ends, so that
    a folder whose verification was interrupted (Ctrl-C) says so; ``onnxpipe verify`` writes its result.
    ``rtol``, ``atol``, ``seed``, ``runs`` and ``input_shapes`` say how (None while unverified)."""

    status: VerificationStatus
    rtol: Annotated[float, Finite()] | None = None
    atol: Annotated[float, Finite()] | None = None
    seed: Annotated[int, Minimum(None)] | None = None
    runs: Positive | None = None
    input_shapes: Mapping[str, tuple[int, ...]] | None = None

    def __post_init__(self) -> None:
        if self.verified:
            for key in ("rtol", "atol", "seed", "runs", "input_shapes"):
                if getattr(self, key) is None:
                    raise FieldError(
                        key, "missing; a verified manifest says how: rtol, atol, seed, runs and input_shapes"
                    )

    @property
    def verified(self) -> bool:
        return self.status != "unverified"


@dataclass(frozen=True)
class DeviceRecord:
    """Where one stage runs and how its costs were obtained (``scaled``, ``profiled``, ``profile_file``)."""

    device: str
    method: str
    source: str
