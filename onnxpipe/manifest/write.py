"""The manifest as JSON text: every record written by :mod:`onnxpipe.core.codec` from its fields, the
schedule in its own compact form, floats with ``+inf`` as ``null``, short lists on one line."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from onnxpipe.core.choices import ScheduleKind
from onnxpipe.core.codec import Codec, Expected, Minimum
from onnxpipe.schedule.timeline import StepKind, Timeline


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
