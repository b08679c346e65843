"""The manifest's JSON layout, both ways: the text written (every record by :mod:`onnxpipe.core.codec` from
its fields, the schedule in its own compact form, floats with ``+inf`` as ``null``, short lists on one
line), and reading it back: the schema version first, the small explicit steps that bring an older file
to today's layout, and the two parts with formats of their own (the schedule, the devices).

Every record is read by :mod:`onnxpipe.core.codec` from its fields' types, each value checked with a
message naming the file and the field's JSON path.  Unknown keys are ignored (additive changes keep
``schema_version``, docs/manifest.md); the rules that span fields are :mod:`onnxpipe.manifest.manifest`'s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, cast

from onnxpipe.cluster.devicesfile import read_cluster
from onnxpipe.cluster.model import Cluster
from onnxpipe.core.choices import ScheduleKind
from onnxpipe.core.codec import Codec, Expected, Minimum
from onnxpipe.core.errors import ManifestError, UsageError
from onnxpipe.core.iocontract import IOContract
from onnxpipe.core.jsonread import Document, Fields, Value
from onnxpipe.core.kv import KVPair
from onnxpipe.manifest.entries import MODEL_INPUT, READABLE_VERSIONS, SCHEMA_VERSION, V1_MODEL_INPUT
from onnxpipe.schedule.timeline import Step, StepKind, Timeline, Transfer


def dumps(value: Any, indent: str = "") -> str:
    """JSON indented by two spaces, except that lists of plain values (shapes, steps) stay on one line."""
    inner = indent + "  "
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k)}: {dumps(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, list) and value and any(isinstance(v, dict | list) for v in value):
        if all(isinstance(v, list) and not any(isinstance(x, dict | list) for x in v) for v in value):
            rows = [f"{inner}{json.dumps(v, allow_nan=False)}" for v in value]
        else:
            rows = [f"{inner}{dumps(v, inner)}" for v in value]
        return "[\n" + ",\n".join(rows) + f"\n{indent}]"
    return json.dumps(value, allow_nan=False)


def schema_version(f: Fields) -> int:
    """The file's ``schema_version``, refused unless this onnxpipe reads it (checked before any other)."""
    version = f["schema_version"].integer(minimum=None)
    if version not in READABLE_VERSIONS:
        *earlier, last = (str(v) for v in READABLE_VERSIONS)
        readable = f"{', '.join(earlier)} and {last}" if earlier else last
        raise ManifestError(
            f"{f.doc.source}: schema_version {version} is not supported (this onnxpipe reads versions "
            f"{readable}, writes {SCHEMA_VERSION}); use the onnxpipe that wrote it or re-run onnxpipe split"
        )
    return version


def upgraded(obj: dict[str, Any], doc: Document) -> dict[str, Any]:
    """A parsed manifest of any readable version in today's layout (``obj`` is left as it is).

    One step per version that changed a field's meaning or spelling; a version that only added optional
    fields needs none (they read as their defaults):

    * 1 -> 2: a pass-through model output's ``produced_by`` was ``"model input"``, now ``"model_input"``;
    * 2 -> 3: added optional fields only (a device's ``runtime``, a decoder's ``kv_layers``, the
      boundary contract);
    * 3 -> 4: a decoder's ``plan.decoder.io`` named its token, mask, position and logits tensors and its
      layers' cache pairs; it is now the IO contract, each tensor with its role.
    """
    version = schema_version(doc.read(obj).fields())
    out = dict(obj)
    if version == 1:
        out["model_outputs"] = _v1_model_outputs(out.get("model_outputs"), doc)
    if version <= 3:
        out["plan"] = _v3_plan(out.get("plan"), doc)
    out["schema_version"] = SCHEMA_VERSION
    return out


def _v3_plan(plan: Any, doc: Document) -> Any:
    """Version 3's ``plan`` with its decoder's ``io`` as the IO contract of such a decoder (anything
    malformed is left to the reader)."""
    decoder = plan.get("decoder") if isinstance(plan, dict) else None
    io = decoder.get("io") if isinstance(decoder, dict) else None
    if not isinstance(plan, dict) or not isinstance(decoder, dict) or not isinstance(io, dict):
        return plan
    f = Value(io, "plan.decoder.io", doc).fields()
    contract = IOContract.of_decoder(
        f["input_ids"].string(),
        f.get("attention_mask", None).opt_string(),
        f.get("position_ids", None).opt_string(),
        f.get("logits", None).opt_string(),
        Codec().decode(tuple[KVPair, ...], f["kv"]),
    )
    return {**plan, "decoder": {**decoder, "io": Codec().encode(IOContract, contract)}}


def _v1_model_outputs(outputs: Any, doc: Document) -> Any:
    """Version 1's model outputs in version 2's spelling: ``"model input"`` becomes ``"model_input"``,
    which version 1 never wrote (so it is refused there); anything malformed is left to the reader."""
    if not isinstance(outputs, list):
        return outputs
    fixed: list[Any] = []
    for i, o in enumerate(outputs):
        if isinstance(o, dict) and o.get("produced_by") == MODEL_INPUT:
            by = Value(MODEL_INPUT, f"model_outputs[{i}].produced_by", doc)
            raise by.expected(f'a stage index or "{V1_MODEL_INPUT}"')
        if isinstance(o, dict) and o.get("produced_by") == V1_MODEL_INPUT:
            o = {**o, "produced_by": MODEL_INPUT}
        fixed.append(o)
    return fixed


def cluster(v: Value) -> Cluster:
    """The devices and links the plan was made for (``null``, read before this, for identical CPUs).

    The devices file has its own reader (and raises ``UsageError``, which means a bad ``--devices``
    argument); inside a manifest the same fault is a bad manifest, so it becomes a ``ManifestError``.
    """
    try:
        return read_cluster(v.fields().raw, source=f"{v.doc.source}: cluster")
    except UsageError as e:
        raise ManifestError(str(e)) from e


# --------------------------------------------------------------------------------------------------
# the schedule


StepRow = Annotated[tuple[StepKind, int, float, float], Expected("[kind, microbatch, start, end]")]
TransferRow = Annotated[
    tuple[int, StepKind, int, float, float], Expected("[link, kind, microbatch, start, end]")
]


@dataclass(frozen=True)
class DeviceRow:
    """One device of the manifest's ``schedule``: the stage it runs (``stage``, in stage order) and its
    steps in the order it runs them."""

    stage: int
    device: str | None = field(default=None, kw_only=True)
    worker: int | None = field(default=None, kw_only=True)
    busy_seconds: float | None = field(default=None, kw_only=True)
    steps: tuple[StepRow, ...]


@dataclass(frozen=True)
class ScheduleRecord:
    """The manifest's ``schedule``: a :class:`Timeline` in a compact form of its own, each step and
    transfer a list (a manifest holds thousands) rather than an object."""

    kind: ScheduleKind
    microbatches: Annotated[int, Minimum(1)]
    makespan_seconds: float
    steady_state_throughput_per_s: float
    bubble_fraction: float | None = field(default=None, kw_only=True)
    devices: tuple[DeviceRow, ...]
    transfers: tuple[TransferRow, ...]


def timeline_obj(tl: Timeline, device_names: Sequence[str] | None = None) -> dict[str, Any]:
    """The manifest's ``schedule`` (:class:`ScheduleRecord`), each device named (default ``stage<s>``)."""
    names = list(device_names) if device_names is not None else [f"stage{s}" for s in range(tl.k)]
    if len(names) != tl.k:
        raise ValueError(f"{len(names)} device names for {tl.k} stages")
    busy = tl.busy
    devices = tuple(
        DeviceRow(
            s,
            device=names[s],
            worker=None if tl.workers is None else tl.workers[s],
            busy_seconds=busy[s],
            steps=tuple((st.kind, st.microbatch, st.start, st.end) for st in steps),
        )
        for s, steps in enumerate(tl.stages)
    )
    transfers = tuple((t.link, t.kind, t.microbatch, t.start, t.end) for t in tl.transfers)
    record = ScheduleRecord(
        tl.kind,
        tl.microbatches,
        tl.makespan,
        tl.steady_state_throughput_per_s,
        bubble_fraction=tl.bubble_fraction,
        devices=devices,
        transfers=transfers,
    )
    obj: dict[str, Any] = Codec().encode(ScheduleRecord, record)
    return obj


def timeline(v: Value) -> Timeline:
    """The ``schedule`` (:class:`ScheduleRecord`), read back."""
    r: ScheduleRecord = Codec().decode(ScheduleRecord, v)
    for i, d in enumerate(r.devices):
        if d.stage != i:
            raise v.doc.fail(
                f"{v.path}.devices[{i}].stage", f"expected {i} (devices are listed in stage order)"
            )
    workers = [d.worker for d in r.devices]
    if any((w is None) != (workers[0] is None) for w in workers):
        odd = next(s for s, w in enumerate(workers) if w is None) if workers[0] is not None else 0
        raise v.doc.fail(f"{v.path}.devices[{odd}].worker", "give a worker for every stage or for none")
    return Timeline(
        kind=r.kind,
        microbatches=r.microbatches,
        stages=tuple(tuple(Step(*row) for row in d.steps) for d in r.devices),
        transfers=tuple(Transfer(*row) for row in r.transfers),
        makespan=r.makespan_seconds,
        steady_state_throughput_per_s=r.steady_state_throughput_per_s,
        workers=None if not workers or workers[0] is None else tuple(cast(list[int], workers)),
    )
