"""The manifest of a split folder: frozen dataclasses, written as JSON, validated field by field on read.

``manifest.json`` says which stage files make up the pipeline, what flows between them, where the
source model is, what the plan estimated and how a stream of micro-batches moves through the stages.
``docs/manifest.md`` documents every field; :data:`SCHEMA_VERSION` is bumped on any change a reader of
the previous version would misread (see the versioning policy there).

JSON has no infinity: every float field writes ``+inf`` as ``null`` and reads ``null`` back as
``math.inf`` (an infinite bandwidth, the throughput of stages that take no time).  NaN is refused.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from onnxpipe.cluster import Cluster
from onnxpipe.core.dims import Dim, Shape
from onnxpipe.core.errors import ManifestError, UsageError
from onnxpipe.core.files import file_sha256, write_text_atomic
from onnxpipe.core.jsonread import Document, Fields, Rule, Value
from onnxpipe.schedule import Timeline

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"

MODEL_INPUT: Literal["model input"] = "model input"
MODEL: Literal["model"] = "model"
MODEL_OUTPUT: Literal["model_output"] = "model_output"


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
    """A model input: name, numpy dtype name, shape with symbolic dims kept."""

    name: str
    dtype: str
    shape: Shape


@dataclass(frozen=True)
class ModelOutput:
    """A model output and the stage that produces it (``"model input"`` for a pass-through input)."""

    name: str
    dtype: str
    shape: Shape
    produced_by: int | Literal["model input"]


@dataclass(frozen=True)
class StageInput:
    """A tensor a stage receives; ``source`` is ``"model"`` or the index of the stage producing it."""

    name: str
    dtype: str
    shape: Shape
    bytes_per_sample: int
    source: int | Literal["model"]


@dataclass(frozen=True)
class StageOutput:
    """A tensor a stage emits; ``consumers`` are later stage indices and/or ``"model_output"``."""

    name: str
    dtype: str
    shape: Shape
    bytes_per_sample: int
    consumers: tuple[int | Literal["model_output"], ...]


@dataclass(frozen=True)
class SameValue:
    """A tensor a stage's nodes read under ``name`` and that it receives as the equal input ``same_as``
    (an ``Identity`` node in the stage file makes one from the other)."""

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


@dataclass(frozen=True)
class PlanSummary:
    """The numbers that justify the partition (copied from :class:`onnxpipe.plan.Plan`)."""

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


@dataclass(frozen=True)
class DeviceRecord:
    """Where one stage runs and how its costs were obtained (``scaled``, ``profiled``, ``profile_file``)."""

    device: str
    method: str
    source: str


@dataclass(frozen=True)
class Manifest:
    """Everything ``manifest.json`` holds; build it with :func:`onnxpipe.export.export_stages`."""

    source: SourceInfo
    model_inputs: tuple[ModelTensor, ...]
    model_outputs: tuple[ModelOutput, ...]
    stages: tuple[StageEntry, ...]
    plan: PlanSummary
    schedule: Timeline
    schema_version: int = field(default=SCHEMA_VERSION)
    cluster: Cluster | None = None
    device_costs: tuple[DeviceRecord, ...] = ()

    @property
    def k(self) -> int:
        return len(self.stages)

    @property
    def workers(self) -> int:
        """How many workers run the stages: ``k``, or fewer for an interleaved split."""
        return self.plan.workers if self.plan.workers is not None else self.k

    def worker_of(self, stage: int) -> int:
        """The worker that runs ``stage`` (the stage's own index in a split that is not interleaved)."""
        w = self.stages[stage].worker
        return stage if w is None else w

    def stages_of(self, worker: int) -> tuple[int, ...]:
        """The stages ``worker`` runs, in pipeline order."""
        return tuple(s for s in range(self.k) if self.worker_of(s) == worker)

    def to_json(self) -> str:
        """The manifest as indented JSON text (ends with a newline)."""
        return _dumps(_manifest_to_obj(self)) + "\n"

    @staticmethod
    def from_json(text: str, source: str = MANIFEST_NAME) -> Manifest:
        """Parse and validate ``text``; ``source`` names the file in error messages."""
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise ManifestError(
                f"{source}: not valid JSON ({e.msg} at line {e.lineno}); re-run onnxpipe split"
            ) from e
        return _read_manifest(obj, source)


# --------------------------------------------------------------------------------------------------
# files


def write_manifest(path: str | Path, manifest: Manifest) -> None:
    """Write ``manifest`` to ``path`` through a temporary file, so a reader never sees half of it."""
    write_text_atomic(Path(path), manifest.to_json())


def load_manifest(directory: str | Path, *, check_files: bool = True) -> Manifest:
    """Read and validate ``<directory>/manifest.json``.

    With ``check_files`` every stage file (and its external data file) must exist and hash to the
    sha256 recorded at export, so a runner never chains stages that were edited or mixed up.
    """
    d = Path(directory)
    path = d / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(
            f"{path}: no such file; give a folder written by 'onnxpipe split'"
            if d.is_dir()
            else f"{d}: no such folder; give a folder written by 'onnxpipe split'"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ManifestError(f"{path}: cannot be read ({e}); re-run onnxpipe split") from e
    manifest = Manifest.from_json(text, source=str(path))
    if check_files:
        check_stage_files(d, manifest)
    return manifest


def check_stage_files(directory: Path, manifest: Manifest) -> None:
    """Raise :class:`ManifestError` unless every stage file is present and unchanged."""
    where = directory / MANIFEST_NAME
    for st in manifest.stages:
        files = [(st.file, st.sha256)]
        if st.external_data is not None and st.external_data_sha256 is not None:
            files.append((st.external_data, st.external_data_sha256))
        for name, sha in files:
            p = directory / name
            if not p.is_file():
                raise ManifestError(
                    f"{where}: stage {st.index} file {name} is missing; re-run onnxpipe split"
                )
            if file_sha256(p) != sha:
                raise ManifestError(
                    f"{where}: stage {st.index} file {name} changed after export (sha256 mismatch); "
                    "re-run onnxpipe split"
                )


# --------------------------------------------------------------------------------------------------
# writing


def _num(x: float) -> float | None:
    if math.isnan(x):
        raise ValueError("NaN cannot be written to a manifest")
    if math.isinf(x):
        if x < 0:
            raise ValueError("-inf cannot be written to a manifest")
        return None
    return float(x)


def _shape_out(shape: Shape) -> list[Dim] | None:
    return None if shape is None else list(shape)


def _dumps(value: Any, indent: str = "") -> str:
    """JSON indented by two spaces, except that lists of plain values (shapes, steps) stay on one line."""
    inner = indent + "  "
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k)}: {_dumps(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, list) and value and any(isinstance(v, dict | list) for v in value):
        if all(isinstance(v, list) and not any(isinstance(x, dict | list) for x in v) for v in value):
            rows = [f"{inner}{json.dumps(v, allow_nan=False)}" for v in value]
        else:
            rows = [f"{inner}{_dumps(v, inner)}" for v in value]
        return "[\n" + ",\n".join(rows) + f"\n{indent}]"
    return json.dumps(value, allow_nan=False)


def _manifest_to_obj(m: Manifest) -> dict[str, Any]:
    return {
        "schema_version": m.schema_version,
        "source": {"file": m.source.file, "path": m.source.path, "sha256": m.source.sha256},
        "model_inputs": [
            {"name": t.name, "dtype": t.dtype, "shape": _shape_out(t.shape)} for t in m.model_inputs
        ],
        "model_outputs": [
            {"name": t.name, "dtype": t.dtype, "shape": _shape_out(t.shape), "produced_by": t.produced_by}
            for t in m.model_outputs
        ],
        "stages": [_stage_to_obj(s) for s in m.stages],
        "plan": {
            "objective": m.plan.objective,
            "k": m.plan.k,
            "bottleneck_seconds": _num(m.plan.bottleneck_seconds),
            "lower_bound_seconds": _num(m.plan.lower_bound_seconds),
            "ratio_to_lower_bound": _num(m.plan.ratio_to_lower_bound),
            "cost_source": m.plan.cost_source,
            "threads": m.plan.threads,
            "bandwidth_bytes_per_s": _num(m.plan.bandwidth_bytes_per_s),
            "profiled_input_shapes": {k: list(v) for k, v in m.plan.profiled_input_shapes.items()},
            "notes": list(m.plan.notes),
            "duplicated_param_bytes": m.plan.duplicated_param_bytes,
            **(
                {} if m.plan.workers is None else {"workers": m.plan.workers, "time_slack": m.plan.time_slack}
            ),
            **({} if m.plan.reference_seconds is None else {"reference_seconds": m.plan.reference_seconds}),
        },
        "schedule": m.schedule.to_obj([s.device for s in m.stages]),
        "cluster": m.cluster.to_obj() if m.cluster is not None else None,
        "device_costs": [
            {"device": d.device, "method": d.method, "source": d.source} for d in m.device_costs
        ],
    }


def _stage_to_obj(s: StageEntry) -> dict[str, Any]:
    return {
        "index": s.index,
        "file": s.file,
        "sha256": s.sha256,
        "external_data": s.external_data,
        "external_data_sha256": s.external_data_sha256,
        "node_count": s.node_count,
        "constant_node_count": s.constant_node_count,
        "device": s.device,
        **({} if s.worker is None else {"worker": s.worker}),
        **({"skipped_node_count": s.skipped_node_count} if s.skipped_node_count else {}),
        **(
            {"same_values": [{"name": a.name, "same_as": a.same_as} for a in s.same_values]}
            if s.same_values
            else {}
        ),
        "inputs": [
            {
                "name": t.name,
                "dtype": t.dtype,
                "shape": _shape_out(t.shape),
                "bytes_per_sample": t.bytes_per_sample,
                "source": t.source,
            }
            for t in s.inputs
        ],
        "outputs": [
            {
                "name": t.name,
                "dtype": t.dtype,
                "shape": _shape_out(t.shape),
                "bytes_per_sample": t.bytes_per_sample,
                "consumers": list(t.consumers),
            }
            for t in s.outputs
        ],
        "estimated_compute_seconds": _num(s.estimated_compute_seconds),
        "estimated_transfer_seconds": _num(s.estimated_transfer_seconds),
        "param_bytes": s.param_bytes,
        "peak_activation_bytes": s.peak_activation_bytes,
        "shared_param_bytes": s.shared_param_bytes,
        "link_bytes_in": s.link_bytes_in,
    }


# --------------------------------------------------------------------------------------------------
# reading: every field checked for presence, type and range by onnxpipe.jsonread, one line per field;
# a message names the file and the field's JSON path.  Unknown keys are ignored (additive changes keep
# schema_version, see docs/manifest.md); then _check_consistency applies the rules that span fields.


def _read_manifest(value: Any, source: str) -> Manifest:
    doc = Document(source, ManifestError, "re-run onnxpipe split", root="manifest")
    top = doc.read(value).fields()
    version = top["schema_version"].integer(minimum=None)
    if version != SCHEMA_VERSION:
        raise ManifestError(
            f"{source}: schema_version {version} is not supported (this onnxpipe reads version "
            f"{SCHEMA_VERSION}); use the onnxpipe that wrote it or re-run onnxpipe split"
        )
    manifest = Manifest(
        source=top["source"].object(_source),
        model_inputs=top["model_inputs"].objects(_model_tensor),
        model_outputs=top["model_outputs"].objects(_model_output),
        stages=top["stages"].objects(_stage),
        plan=top["plan"].object(_plan),
        schedule=Timeline.from_obj(top["schedule"].raw, "schedule", source),
        schema_version=version,
        cluster=_cluster(top.get("cluster", None)),
        device_costs=top.get("device_costs", []).objects(_device_record),
    )
    _check_consistency(manifest, doc)
    return manifest


def _is_plain_file_name(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


# A stage file outside the folder would let a manifest make the runner load (and check_stage_files hash)
# any file on the machine; a malformed hash could never match, so it is refused here, not at load time.
_FILE_NAME = Rule(_is_plain_file_name, "a plain file name in the folder")
_SHA256 = Rule(_is_sha256, "a sha256 as 64 lowercase hex digits")
_STAGE_OR_MODEL_INPUT = 'a stage index or "model input"'
_STAGE_OR_MODEL = 'a stage index or "model"'
_STAGE_OR_MODEL_OUTPUT = 'a stage index or "model_output"'


def _dim(v: Value) -> Dim:
    d = v.raw
    if d is None or isinstance(d, str) or (isinstance(d, int) and not isinstance(d, bool) and d >= 0):
        return d
    raise v.expected("a dim (integer >= 0, symbolic name or null)")


def _shape(v: Value) -> Shape:
    return v.opt_list_of(_dim)


def _source(f: Fields) -> SourceInfo:
    return SourceInfo(
        file=f["file"].string(), path=f["path"].opt_string(), sha256=f["sha256"].string(_SHA256)
    )


def _model_tensor(f: Fields) -> ModelTensor:
    return ModelTensor(name=f["name"].string(), dtype=f["dtype"].string(), shape=_shape(f["shape"]))


def _model_output(f: Fields) -> ModelOutput:
    return ModelOutput(
        name=f["name"].string(),
        dtype=f["dtype"].string(),
        shape=_shape(f["shape"]),
        produced_by=f["produced_by"].integer_or(MODEL_INPUT, expected=_STAGE_OR_MODEL_INPUT),
    )


def _stage_input(f: Fields) -> StageInput:
    return StageInput(
        name=f["name"].string(),
        dtype=f["dtype"].string(),
        shape=_shape(f["shape"]),
        bytes_per_sample=f["bytes_per_sample"].integer(),
        source=f["source"].integer_or(MODEL, expected=_STAGE_OR_MODEL),
    )


def _stage_output(f: Fields) -> StageOutput:
    return StageOutput(
        name=f["name"].string(),
        dtype=f["dtype"].string(),
        shape=_shape(f["shape"]),
        bytes_per_sample=f["bytes_per_sample"].integer(),
        consumers=f["consumers"].list_of(
            lambda c: c.integer_or(MODEL_OUTPUT, expected=_STAGE_OR_MODEL_OUTPUT)
        ),
    )


def _stage(f: Fields) -> StageEntry:
    return StageEntry(
        index=f["index"].integer(),
        file=f["file"].string(_FILE_NAME),
        sha256=f["sha256"].string(_SHA256),
        external_data=f["external_data"].opt_string(_FILE_NAME),
        external_data_sha256=f["external_data_sha256"].opt_string(_SHA256),
        node_count=f["node_count"].integer(),
        constant_node_count=f["constant_node_count"].integer(),
        device=f["device"].string(),
        inputs=f["inputs"].objects(_stage_input),
        outputs=f["outputs"].objects(_stage_output),
        estimated_compute_seconds=f["estimated_compute_seconds"].number(),
        estimated_transfer_seconds=f["estimated_transfer_seconds"].number(),
        param_bytes=f["param_bytes"].integer(),
        peak_activation_bytes=f["peak_activation_bytes"].integer(),
        shared_param_bytes=f["shared_param_bytes"].integer(),
        link_bytes_in=f["link_bytes_in"].integer(),
        worker=f.get("worker", None).opt_integer(),
        skipped_node_count=f.get("skipped_node_count", 0).integer(),
        same_values=f.get("same_values", []).objects(_same_value),
    )


def _same_value(f: Fields) -> SameValue:
    return SameValue(name=f["name"].string(), same_as=f["same_as"].string())


def _plan(f: Fields) -> PlanSummary:
    return PlanSummary(
        objective=f["objective"].string(),
        k=f["k"].integer(minimum=1),
        bottleneck_seconds=f["bottleneck_seconds"].number(),
        lower_bound_seconds=f["lower_bound_seconds"].number(),
        ratio_to_lower_bound=f["ratio_to_lower_bound"].number(),
        cost_source=f["cost_source"].string(),
        threads=f["threads"].integer(minimum=1),
        bandwidth_bytes_per_s=f["bandwidth_bytes_per_s"].number(),
        profiled_input_shapes=MappingProxyType(
            f["profiled_input_shapes"].dict_of(lambda dims: dims.list_of(Value.integer))
        ),
        notes=f["notes"].list_of(Value.string),
        duplicated_param_bytes=f["duplicated_param_bytes"].integer(),
        workers=f.get("workers", None).opt_integer(minimum=1),
        time_slack=_time_slack(f.get("time_slack", 0.0)),
        reference_seconds=_reference(f.get("reference_seconds", None)),
    )


def _reference(v: Value) -> float | None:
    if v.raw is None:
        return None
    seconds = v.finite()
    if seconds <= 0:
        raise v.fail(f"expected a time above 0 seconds, got {seconds}")
    return seconds


def _device_record(f: Fields) -> DeviceRecord:
    return DeviceRecord(device=f["device"].string(), method=f["method"].string(), source=f["source"].string())


def _cluster(v: Value) -> Cluster | None:
    """The devices and links the plan was made for (``null`` for identical CPU workers).

    The devices file has its own reader (and raises ``UsageError``, which means a bad ``--devices``
    argument); inside a manifest the same fault is a bad manifest, so it becomes a ``ManifestError``.
    """
    if v.raw is None:
        return None
    try:
        return Cluster.from_obj(v.fields().raw, source=f"{v.doc.source}: cluster")
    except UsageError as e:
        raise ManifestError(str(e)) from e


def _time_slack(v: Value) -> float:
    slack = v.finite()
    if slack < 0:
        raise v.fail(f"expected a share of 0 or more, got {slack}")
    return slack


def _check_workers(m: Manifest, doc: Document) -> None:
    """Every stage has a worker exactly when ``plan.workers`` is given, each worker runs a stage, and
    stage ``s`` runs on worker ``s % workers`` (the only assignment the planner makes)."""
    fail = doc.fail
    given = [st.worker is not None for st in m.stages]
    if m.plan.workers is None:
        if any(given):
            raise fail(f"stages[{given.index(True)}].worker", "is given but plan.workers is not")
        if m.plan.time_slack != 0.0:
            raise fail("plan.time_slack", "is given but plan.workers is not")
        if m.schedule.workers is not None:
            raise fail("schedule.devices[0].worker", "is given but plan.workers is not")
        return
    workers = m.plan.workers
    if workers > m.k or m.k % workers:
        raise fail("plan.workers", f"{workers} workers cannot each run the same number of the {m.k} stages")
    for i, st in enumerate(m.stages):
        if st.worker is None:
            raise fail(f"stages[{i}].worker", "missing; plan.workers says the stages share workers")
        if st.worker != i % workers:
            raise fail(
                f"stages[{i}].worker", f"expected {i % workers} (stage s runs on worker s % {workers})"
            )
    sched = m.schedule.workers
    if sched is None:
        raise fail("schedule.devices[0].worker", "missing; plan.workers says the stages share workers")
    for i, w in enumerate(sched):
        if w != i % workers:
            raise fail(f"schedule.devices[{i}].worker", f"expected {i % workers}, the worker of stages[{i}]")


def _check_consistency(m: Manifest, doc: Document) -> None:
    """Cross-field rules: stages numbered in order, edges that point backwards, names that resolve."""
    fail = doc.fail
    k = len(m.stages)
    if k == 0:
        raise fail("stages", "expected at least one stage, got none")
    if m.plan.k != k:
        raise fail("plan.k", f"says {m.plan.k} stages but 'stages' lists {k}")
    if len(m.schedule.stages) != k:
        raise fail("schedule.devices", f"lists {len(m.schedule.stages)} stages, expected {k}")
    _check_workers(m, doc)
    if m.cluster is not None:
        names = set(m.cluster.names)
        for i, st in enumerate(m.stages):
            if st.device not in names:
                raise fail(f"stages[{i}].device", f"{st.device!r} is not a device of 'cluster'")
    files: set[str] = set()
    model_inputs = {t.name for t in m.model_inputs}
    produced: dict[str, int] = {}
    for i, st in enumerate(m.stages):
        w = f"stages[{i}]"
        if st.index != i:
            raise fail(f"{w}.index", f"expected {i} (stages are listed in order), got {st.index}")
        if (st.external_data is None) != (st.external_data_sha256 is None):
            raise fail(f"{w}.external_data_sha256", "must be null exactly when external_data is null")
        for name in (st.file, st.external_data):
            if name is None:
                continue
            if name in files:
                raise fail(w, f"file {name} is listed twice")
            files.add(name)
        for j, t in enumerate(st.inputs):
            if t.source == MODEL:
                if t.name not in model_inputs:
                    raise fail(f"{w}.inputs[{j}].source", f"{t.name!r} is not a model input")
            elif produced.get(t.name) != t.source:
                raise fail(
                    f"{w}.inputs[{j}].source",
                    f"says stage {t.source} produces {t.name!r}, but no earlier stage output matches",
                )
        received = {t.name for t in st.inputs}
        for j, a in enumerate(st.same_values):
            if a.same_as not in received:
                raise fail(f"{w}.same_values[{j}].same_as", f"{a.same_as!r} is not an input of this stage")
            if a.name in received:
                raise fail(f"{w}.same_values[{j}].name", f"{a.name!r} is an input of this stage already")
        for j, out in enumerate(st.outputs):
            for c in out.consumers:
                if c != MODEL_OUTPUT and not (i < c < k):
                    why = f"there are only {k} stages" if c >= k else f"it does not come after stage {i}"
                    raise fail(f"{w}.outputs[{j}].consumers", f"lists stage {c}, but {why}")
            produced[out.name] = i
    for j, o in enumerate(m.model_outputs):
        if o.produced_by == MODEL_INPUT:
            if o.name not in model_inputs:
                raise fail(f"model_outputs[{j}].produced_by", f"{o.name!r} is not a model input")
        elif produced.get(o.name) != o.produced_by:
            raise fail(
                f"model_outputs[{j}].produced_by",
                f"says stage {o.produced_by} produces {o.name!r}, but that stage does not output it",
            )
