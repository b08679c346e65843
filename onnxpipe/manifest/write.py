"""The manifest as JSON text: every record written by :mod:`onnxpipe.core.codec` from its fields, the
schedule in its own compact form, floats with ``+inf`` as ``null``, short lists on one line."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from onnxpipe.core.codec import number
from onnxpipe.schedule.timeline import Timeline

num = number
"""A float as the manifest writes it: ``+inf`` as ``null``; NaN and ``-inf`` are refused."""


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


def timeline_obj(tl: Timeline, device_names: Sequence[str] | None = None) -> dict[str, Any]:
    """The manifest's ``schedule``: per device the ordered ``[kind, micro-batch, start, end]`` steps.

    ``inf`` (the throughput of stages that take no time) is written as ``null``, as everywhere in the
    manifest.
    """
    names = list(device_names) if device_names is not None else [f"stage{s}" for s in range(tl.k)]
    if len(names) != tl.k:
        raise ValueError(f"{len(names)} device names for {tl.k} stages")
    busy = tl.busy
    return {
        "kind": tl.kind,
        "microbatches": tl.microbatches,
        "makespan_seconds": num(tl.makespan),
        "steady_state_throughput_per_s": num(tl.steady_state_throughput_per_s),
        "bubble_fraction": num(tl.bubble_fraction),
        "devices": [
            {
                "stage": s,
                "device": names[s],
                **({} if tl.workers is None else {"worker": tl.workers[s]}),
                "busy_seconds": num(busy[s]),
                "steps": [[st.kind, st.microbatch, num(st.start), num(st.end)] for st in steps],
            }
            for s, steps in enumerate(tl.stages)
        ],
        "transfers": [[t.link, t.kind, t.microbatch, num(t.start), num(t.end)] for t in tl.transfers],
    }
