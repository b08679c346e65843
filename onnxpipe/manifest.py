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
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from onnxpipe.cluster import Cluster
from onnxpipe.errors import ManifestError, UsageError
from onnxpipe.model import Dim, file_sha256
from onnxpipe.schedule import Timeline

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"

Shape = tuple[Dim, ...] | None
"""Dims as ints, symbolic names (``"batch"``) or ``None`` (unknown); ``None`` for an unknown rank."""

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
        return _Reader(source).manifest(obj)


# --------------------------------------------------------------------------------------------------
# files


def write_manifest(path: str | Path, manifest: Manifest) -> None:
    """Write ``manifest`` to ``path`` through a temporary file, so a reader never sees half of it."""
    p = Path(path)
    text = manifest.to_json()
    tmp = p.with_name(p.name + ".tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
# reading: every field checked for presence and type; messages name the field by its JSON path

T = TypeVar("T")


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, what: str) -> ManifestError:
        return ManifestError(f"{self.source}: {where}: {what}; re-run onnxpipe split")

    def field(self, obj: Mapping[str, Any], key: str, where: str) -> Any:
        if key not in obj:
            raise ManifestError(f"{self.source}: missing field '{_join(where, key)}'; re-run onnxpipe split")
        return obj[key]

    def as_obj(self, value: Any, where: str) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where or "manifest", f"expected an object, got {_describe(value)}")
        return value

    def as_list(self, value: Any, where: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(where, f"expected a list, got {_describe(value)}")
        return value

    def get_str(self, obj: Mapping[str, Any], key: str, where: str) -> str:
        v = self.field(obj, key, where)
        if not isinstance(v, str):
            raise self.fail(_join(where, key), f"expected a string, got {_describe(v)}")
        return v

    def get_opt_str(self, obj: Mapping[str, Any], key: str, where: str) -> str | None:
        v = self.field(obj, key, where)
        if v is not None and not isinstance(v, str):
            raise self.fail(_join(where, key), f"expected a string or null, got {_describe(v)}")
        return v

    def get_int(self, obj: Mapping[str, Any], key: str, where: str, *, minimum: int = 0) -> int:
        v = self.field(obj, key, where)
        return self.int_value(v, _join(where, key), minimum=minimum)

    def int_value(self, v: Any, where: str, *, minimum: int = 0) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(where, f"expected an integer, got {_describe(v)}")
        if v < minimum:
            raise self.fail(where, f"expected an integer >= {minimum}, got {v}")
        return v

    def get_float(self, obj: Mapping[str, Any], key: str, where: str) -> float:
        return self.float_value(self.field(obj, key, where), _join(where, key))

    def float_value(self, v: Any, where: str) -> float:
        if v is None:
            return math.inf
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.fail(where, f"expected a number or null (infinity), got {_describe(v)}")
        if v < 0:
            raise self.fail(where, f"expected a number >= 0, got {v}")
        return float(v)

    def items(
        self, obj: Mapping[str, Any], key: str, where: str, read: Callable[[Any, str], T]
    ) -> tuple[T, ...]:
        w = _join(where, key)
        values = self.as_list(self.field(obj, key, where), w)
        return tuple(read(v, f"{w}[{i}]") for i, v in enumerate(values))

    def shape(self, obj: Mapping[str, Any], where: str) -> Shape:
        v = self.field(obj, "shape", where)
        if v is None:
            return None
        dims = self.as_list(v, _join(where, "shape"))
        out: list[Dim] = []
        for i, d in enumerate(dims):
            if d is None or isinstance(d, str) or (isinstance(d, int) and not isinstance(d, bool) and d >= 0):
                out.append(d)
            else:
                raise self.fail(
                    f"{where}.shape[{i}]",
                    f"expected a dim (integer >= 0, symbolic name or null), got {_describe(d)}",
                )
        return tuple(out)

    def file_name(self, obj: Mapping[str, Any], key: str, where: str, *, optional: bool) -> str | None:
        v = self.get_opt_str(obj, key, where) if optional else self.get_str(obj, key, where)
        if v is not None and (v in ("", ".", "..") or "/" in v or "\\" in v):
            raise self.fail(_join(where, key), f"expected a plain file name in the folder, got {v!r}")
        return v

    def sha(self, obj: Mapping[str, Any], key: str, where: str, *, optional: bool = False) -> str | None:
        v = self.get_opt_str(obj, key, where) if optional else self.get_str(obj, key, where)
        if v is not None and (len(v) != 64 or any(c not in "0123456789abcdef" for c in v)):
            raise self.fail(_join(where, key), f"expected a sha256 as 64 lowercase hex digits, got {v!r}")
        return v

    # ----------------------------------------------------------------------------------------------

    def manifest(self, value: Any) -> Manifest:
        top = self.as_obj(value, "")
        version = self.field(top, "schema_version", "")
        if isinstance(version, bool) or not isinstance(version, int):
            raise self.fail("schema_version", f"expected an integer, got {_describe(version)}")
        if version != SCHEMA_VERSION:
            raise ManifestError(
                f"{self.source}: schema_version {version} is not supported (this onnxpipe reads version "
                f"{SCHEMA_VERSION}); use the onnxpipe that wrote it or re-run onnxpipe split"
            )
        src = self.as_obj(self.field(top, "source", ""), "source")
        source = SourceInfo(
            file=self.get_str(src, "file", "source"),
            path=self.get_opt_str(src, "path", "source"),
            sha256=self.sha(src, "sha256", "source") or "",
        )
        model_inputs = self.items(top, "model_inputs", "", self.model_tensor)
        model_outputs = self.items(top, "model_outputs", "", self.model_output)
        stages = self.items(top, "stages", "", self.stage)
        plan = self.plan(self.as_obj(self.field(top, "plan", ""), "plan"))
        schedule = Timeline.from_obj(self.field(top, "schedule", ""), "schedule", self.source)
        cluster = self.cluster(top.get("cluster"))
        device_costs = tuple(
            DeviceRecord(
                self.get_str(self.as_obj(d, f"device_costs[{i}]"), "device", f"device_costs[{i}]"),
                self.get_str(self.as_obj(d, f"device_costs[{i}]"), "method", f"device_costs[{i}]"),
                self.get_str(self.as_obj(d, f"device_costs[{i}]"), "source", f"device_costs[{i}]"),
            )
            for i, d in enumerate(self.as_list(top.get("device_costs", []), "device_costs"))
        )
        manifest = Manifest(
            source=source,
            model_inputs=model_inputs,
            model_outputs=model_outputs,
            stages=stages,
            plan=plan,
            schedule=schedule,
            schema_version=version,
            cluster=cluster,
            device_costs=device_costs,
        )
        self.check_consistency(manifest)
        return manifest

    def model_tensor(self, value: Any, where: str) -> ModelTensor:
        o = self.as_obj(value, where)
        return ModelTensor(
            self.get_str(o, "name", where), self.get_str(o, "dtype", where), self.shape(o, where)
        )

    def model_output(self, value: Any, where: str) -> ModelOutput:
        o = self.as_obj(value, where)
        by = self.field(o, "produced_by", where)
        produced_by: int | Literal["model input"]
        if by == MODEL_INPUT:
            produced_by = MODEL_INPUT
        else:
            if isinstance(by, bool) or not isinstance(by, int) or by < 0:
                raise self.fail(
                    f"{where}.produced_by", f'expected a stage index or "model input", got {_describe(by)}'
                )
            produced_by = by
        return ModelOutput(
            self.get_str(o, "name", where), self.get_str(o, "dtype", where), self.shape(o, where), produced_by
        )

    def stage_input(self, value: Any, where: str) -> StageInput:
        o = self.as_obj(value, where)
        src = self.field(o, "source", where)
        source: int | Literal["model"]
        if src == MODEL:
            source = MODEL
        else:
            if isinstance(src, bool) or not isinstance(src, int) or src < 0:
                raise self.fail(f"{where}.source", f'expected a stage index or "model", got {_describe(src)}')
            source = src
        return StageInput(
            name=self.get_str(o, "name", where),
            dtype=self.get_str(o, "dtype", where),
            shape=self.shape(o, where),
            bytes_per_sample=self.get_int(o, "bytes_per_sample", where),
            source=source,
        )

    def stage_output(self, value: Any, where: str) -> StageOutput:
        o = self.as_obj(value, where)
        raw = self.as_list(self.field(o, "consumers", where), f"{where}.consumers")
        consumers: list[int | Literal["model_output"]] = []
        for i, c in enumerate(raw):
            if c == MODEL_OUTPUT:
                consumers.append(MODEL_OUTPUT)
            elif isinstance(c, int) and not isinstance(c, bool) and c >= 0:
                consumers.append(c)
            else:
                raise self.fail(
                    f"{where}.consumers[{i}]",
                    f'expected a stage index or "model_output", got {_describe(c)}',
                )
        return StageOutput(
            name=self.get_str(o, "name", where),
            dtype=self.get_str(o, "dtype", where),
            shape=self.shape(o, where),
            bytes_per_sample=self.get_int(o, "bytes_per_sample", where),
            consumers=tuple(consumers),
        )

    def stage(self, value: Any, where: str) -> StageEntry:
        o = self.as_obj(value, where)
        return StageEntry(
            index=self.get_int(o, "index", where),
            file=self.file_name(o, "file", where, optional=False) or "",
            sha256=self.sha(o, "sha256", where) or "",
            external_data=self.file_name(o, "external_data", where, optional=True),
            external_data_sha256=self.sha(o, "external_data_sha256", where, optional=True),
            node_count=self.get_int(o, "node_count", where),
            constant_node_count=self.get_int(o, "constant_node_count", where),
            device=self.get_str(o, "device", where),
            inputs=self.items(o, "inputs", where, self.stage_input),
            outputs=self.items(o, "outputs", where, self.stage_output),
            estimated_compute_seconds=self.get_float(o, "estimated_compute_seconds", where),
            estimated_transfer_seconds=self.get_float(o, "estimated_transfer_seconds", where),
            param_bytes=self.get_int(o, "param_bytes", where),
            peak_activation_bytes=self.get_int(o, "peak_activation_bytes", where),
            shared_param_bytes=self.get_int(o, "shared_param_bytes", where),
            link_bytes_in=self.get_int(o, "link_bytes_in", where),
        )

    def plan(self, o: Mapping[str, Any]) -> PlanSummary:
        w = "plan"
        shapes_obj = self.as_obj(self.field(o, "profiled_input_shapes", w), "plan.profiled_input_shapes")
        shapes: dict[str, tuple[int, ...]] = {}
        for name, dims in shapes_obj.items():
            dw = f"plan.profiled_input_shapes.{name}"
            values = self.as_list(dims, dw)
            shapes[name] = tuple(self.int_value(d, f"{dw}[{i}]") for i, d in enumerate(values))
        notes = self.as_list(self.field(o, "notes", w), "plan.notes")
        for i, n in enumerate(notes):
            if not isinstance(n, str):
                raise self.fail(f"plan.notes[{i}]", f"expected a string, got {_describe(n)}")
        return PlanSummary(
            objective=self.get_str(o, "objective", w),
            k=self.get_int(o, "k", w, minimum=1),
            bottleneck_seconds=self.get_float(o, "bottleneck_seconds", w),
            lower_bound_seconds=self.get_float(o, "lower_bound_seconds", w),
            ratio_to_lower_bound=self.get_float(o, "ratio_to_lower_bound", w),
            cost_source=self.get_str(o, "cost_source", w),
            threads=self.get_int(o, "threads", w, minimum=1),
            bandwidth_bytes_per_s=self.get_float(o, "bandwidth_bytes_per_s", w),
            profiled_input_shapes=MappingProxyType(shapes),
            notes=tuple(notes),
            duplicated_param_bytes=self.get_int(o, "duplicated_param_bytes", w),
        )

    def cluster(self, value: Any) -> Cluster | None:
        """The devices and links the plan was made for (``null`` for identical CPU workers)."""
        if value is None:
            return None
        try:
            return Cluster.from_obj(self.as_obj(value, "cluster"), source=f"{self.source}: cluster")
        except UsageError as e:
            raise ManifestError(str(e)) from e

    def check_consistency(self, m: Manifest) -> None:
        """Cross-field rules: stages numbered in order, edges that point backwards, names that resolve."""
        k = len(m.stages)
        if k == 0:
            raise self.fail("stages", "expected at least one stage, got none")
        if m.plan.k != k:
            raise self.fail("plan.k", f"says {m.plan.k} stages but 'stages' lists {k}")
        if len(m.schedule.stages) != k:
            raise self.fail("schedule.devices", f"lists {len(m.schedule.stages)} stages, expected {k}")
        if m.cluster is not None:
            names = set(m.cluster.names)
            for i, st in enumerate(m.stages):
                if st.device not in names:
                    raise self.fail(f"stages[{i}].device", f"{st.device!r} is not a device of 'cluster'")
        files: set[str] = set()
        model_inputs = {t.name for t in m.model_inputs}
        produced: dict[str, int] = {}
        for i, st in enumerate(m.stages):
            w = f"stages[{i}]"
            if st.index != i:
                raise self.fail(f"{w}.index", f"expected {i} (stages are listed in order), got {st.index}")
            if (st.external_data is None) != (st.external_data_sha256 is None):
                raise self.fail(
                    f"{w}.external_data_sha256", "must be null exactly when external_data is null"
                )
            for name in (st.file, st.external_data):
                if name is None:
                    continue
                if name in files:
                    raise self.fail(w, f"file {name} is listed twice")
                files.add(name)
            for j, t in enumerate(st.inputs):
                if t.source == MODEL:
                    if t.name not in model_inputs:
                        raise self.fail(f"{w}.inputs[{j}].source", f"{t.name!r} is not a model input")
                elif produced.get(t.name) != t.source:
                    raise self.fail(
                        f"{w}.inputs[{j}].source",
                        f"says stage {t.source} produces {t.name!r}, but no earlier stage output matches",
                    )
            for j, out in enumerate(st.outputs):
                for c in out.consumers:
                    if c != MODEL_OUTPUT and not (i < c < k):
                        why = f"there are only {k} stages" if c >= k else f"it does not come after stage {i}"
                        raise self.fail(f"{w}.outputs[{j}].consumers", f"lists stage {c}, but {why}")
                produced[out.name] = i
        for j, o in enumerate(m.model_outputs):
            if o.produced_by == MODEL_INPUT:
                if o.name not in model_inputs:
                    raise self.fail(f"model_outputs[{j}].produced_by", f"{o.name!r} is not a model input")
            elif produced.get(o.name) != o.produced_by:
                raise self.fail(
                    f"model_outputs[{j}].produced_by",
                    f"says stage {o.produced_by} produces {o.name!r}, but that stage does not output it",
                )


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _describe(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f"string {v!r}"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return f"{type(v).__name__} {v!r}"
