"""What ``manifest.json`` holds, entry by entry: frozen dataclasses and the words that stand for places.

The whole manifest is :class:`onnxpipe.manifest.manifest.Manifest`; these are its parts that say what
was written: files, tensors, the verification.  The plan's own records (its numbers, a decoder's, the
values a stage remakes) are :mod:`onnxpipe.planning.records`', held here as they are.  Nothing here
imports onnx: a runtime that only reads split folders needs none of the splitting machinery.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Literal

from onnxpipe.core.choices import Phase
from onnxpipe.core.codec import Expected, FieldError, Finite, Minimum
from onnxpipe.core.files import FileName, Sha256
from onnxpipe.planning.records import Positive, SameValue

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


Shape = (
    tuple[Annotated[int | str | None, Expected("a dim (integer >= 0, symbolic name or null)")], ...] | None
)
"""A tensor's shape as the manifest keeps it (:data:`onnxpipe.core.dims.Shape`), each dim checked."""
StageOrModel = Annotated[int | Literal["model"], Expected('a stage index or "model"')]
StageOrModelInput = Annotated[int | Literal["model_input"], Expected('a stage index or "model_input"')]
StageOrModelOutput = Annotated[int | Literal["model_output"], Expected('a stage index or "model_output"')]


@dataclass(frozen=True)
class _Tensor:
    """What every tensor entry says: name, numpy dtype name, shape with its symbolic dims (the model's
    own names), and its boundary contract (added in schema 3)."""

    name: str
    dtype: str
    shape: Shape
    profiled_shape: tuple[int, ...] | None = field(default=None, kw_only=True)
    """Its concrete shape when the model ran at ``plan.profiled_input_shapes`` (observed, or worked out
    from the model inputs' symbols); None when neither could tell."""
    batch_axis: int | None = field(default=None, kw_only=True)
    """The axis that carries the model inputs' batch dim; None when it has none."""

    def __post_init__(self) -> None:
        """The contract: a concrete profiled shape of the declared rank, and a batch axis within it."""
        shape, profiled = self.shape, self.profiled_shape
        if profiled is not None and shape is not None and len(profiled) != len(shape):
            raise FieldError(
                "profiled_shape", f"expected {len(shape)} dims, as many as its shape, got {len(profiled)}"
            )
        rank = len(profiled) if profiled is not None else (len(shape) if shape is not None else None)
        if self.batch_axis is not None and rank is not None and self.batch_axis >= rank:
            raise FieldError("batch_axis", f"expected an axis below its rank {rank}, got {self.batch_axis}")


@dataclass(frozen=True)
class SourceInfo:
    """The model that was split: its file name, where it is, and its content hash.

    ``path`` is relative to the folder holding ``manifest.json`` (POSIX separators), absolute when no
    relative path exists, or ``None`` when the model was never a file.
    """

    file: str
    path: str | None
    sha256: Sha256
    embedding: str | None = None
    """The embedding model joined ahead of a text model that takes ``inputs_embeds`` (``split
    --embedding``; :mod:`onnxpipe.ir.joined`), relative as ``path`` is: the stages take token ids, and
    whatever runs the source model runs the two joined."""


@dataclass(frozen=True)
class ModelTensor(_Tensor):
    """A model input."""


@dataclass(frozen=True)
class ModelOutput(_Tensor):
    """A model output and the stage that produces it (``"model_input"`` for a pass-through input)."""

    produced_by: StageOrModelInput


@dataclass(frozen=True)
class StageInput(_Tensor):
    """A tensor a stage receives; ``source`` is ``"model"`` or the index of the stage producing it."""

    bytes_per_sample: int
    source: StageOrModel


@dataclass(frozen=True)
class StageOutput(_Tensor):
    """A tensor a stage emits; ``consumers`` are later stage indices and/or ``"model_output"``."""

    bytes_per_sample: int
    consumers: tuple[StageOrModelOutput, ...]


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
    boundary_dtype: WireDtype = "float32"
    """What the float32 activations this stage receives from earlier stages travel as (``--boundary-dtype``):
    ``float16``/``bfloat16`` (cast), ``int8`` (with a ``<name>/onnxpipe_scale``), or as they are; its
    ``inputs`` name them as they cross (``<name>/onnxpipe_<dtype>``)."""


WireDtype = Literal["float32", "float16", "bfloat16", "int8"]
"""``boundary_dtype``: what compressed boundary tensors travel as
(:class:`~onnxpipe.core.choices.BoundaryDtype`)."""


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
