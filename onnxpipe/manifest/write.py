"""The manifest as JSON text: every float written with ``+inf`` as ``null``, short lists on one line."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from onnxpipe.core.dims import Dim, Shape
from onnxpipe.core.iocontract import Binding, IOContract
from onnxpipe.manifest.entries import (
    DecoderModelRecord,
    DecoderRecord,
    ModelOutput,
    ModelTensor,
    NodeSplitRecord,
    StageEntry,
    StageInput,
    StageOutput,
    VerificationRecord,
)
from onnxpipe.schedule.timeline import Timeline

if TYPE_CHECKING:  # annotations only: the manifest module calls this one
    from onnxpipe.manifest.manifest import Manifest


def num(x: float) -> float | None:
    if math.isnan(x):
        raise ValueError("NaN cannot be written to a manifest")
    if math.isinf(x):
        if x < 0:
            raise ValueError("-inf cannot be written to a manifest")
        return None
    return float(x)


def _shape_out(shape: Shape) -> list[Dim] | None:
    return None if shape is None else list(shape)


def _tensor_obj(t: ModelTensor | ModelOutput | StageInput | StageOutput) -> dict[str, Any]:
    """What every tensor entry holds: name, dtype, shape and the boundary contract."""
    return {"name": t.name, "dtype": t.dtype, "shape": _shape_out(t.shape), **contract(t)}


def contract(t: Any) -> dict[str, Any]:
    """The optional boundary-contract fields of a tensor entry (schema 3), written when known."""
    out: dict[str, Any] = {}
    if t.profiled_shape is not None:
        out["profiled_shape"] = list(t.profiled_shape)
    if t.batch_axis is not None:
        out["batch_axis"] = t.batch_axis
    return out


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


def manifest_obj(m: Manifest) -> dict[str, Any]:
    return {
        "schema_version": m.schema_version,
        "source": {"file": m.source.file, "path": m.source.path, "sha256": m.source.sha256},
        "model_inputs": [_tensor_obj(t) for t in m.model_inputs],
        "model_outputs": [{**_tensor_obj(t), "produced_by": t.produced_by} for t in m.model_outputs],
        "stages": [_stage_to_obj(s) for s in m.stages],
        "plan": {
            "objective": m.plan.objective,
            "k": m.plan.k,
            "bottleneck_seconds": num(m.plan.bottleneck_seconds),
            "lower_bound_seconds": num(m.plan.lower_bound_seconds),
            "ratio_to_lower_bound": num(m.plan.ratio_to_lower_bound),
            "cost_source": m.plan.cost_source,
            "threads": m.plan.threads,
            "bandwidth_bytes_per_s": num(m.plan.bandwidth_bytes_per_s),
            "profiled_input_shapes": {k: list(v) for k, v in m.plan.profiled_input_shapes.items()},
            "notes": list(m.plan.notes),
            "duplicated_param_bytes": m.plan.duplicated_param_bytes,
            **(
                {} if m.plan.workers is None else {"workers": m.plan.workers, "time_slack": m.plan.time_slack}
            ),
            **({} if m.plan.reference_seconds is None else {"reference_seconds": m.plan.reference_seconds}),
            **(
                {}
                if not m.plan.profiled_inputs
                else {"profiled_inputs": [r.to_obj() for r in m.plan.profiled_inputs]}
            ),
            **(
                {"node_splits": [_node_split_obj(r) for r in m.plan.node_splits]}
                if m.plan.node_splits
                else {}
            ),
            **({} if m.plan.link_model is None else {"link_model": m.plan.link_model}),
            **({} if m.plan.decoder is None else {"decoder": _decoder_obj(m.plan.decoder)}),
        },
        "schedule": timeline_obj(m.schedule, [s.device for s in m.stages]),
        "cluster": m.cluster.to_obj() if m.cluster is not None else None,
        "device_costs": [
            {"device": d.device, "method": d.method, "source": d.source} for d in m.device_costs
        ],
        **({} if m.verification is None else {"verification": verification_obj(m.verification)}),
    }


def verification_obj(v: VerificationRecord) -> dict[str, Any]:
    """``verification``: the status, and how it was reached once verified."""
    if not v.verified:
        return {"status": v.status}
    return {
        "status": v.status,
        "rtol": v.rtol,
        "atol": v.atol,
        "seed": v.seed,
        "runs": v.runs,
        "input_shapes": {k: list(d) for k, d in (v.input_shapes or {}).items()},
    }


def _node_split_obj(r: NodeSplitRecord) -> dict[str, Any]:
    return {
        "node": r.node,
        "kind": r.kind,
        "parts": r.parts,
        "stages": list(r.stages),
        "contiguous_bound_seconds": r.contiguous_bound_seconds,
        "contiguous_bottleneck_seconds": r.contiguous_bottleneck_seconds,
    }


def _decoder_obj(d: DecoderRecord) -> dict[str, Any]:
    return {
        "layers": d.layers,
        "layer_cuts": d.layer_cuts,
        "ends": d.ends,
        "max_context": d.max_context,
        "phase": d.phase,
        "phase_shapes": [{"phase": p, "new_tokens": n, "past_tokens": c} for p, n, c in d.phase_shapes],
        **({} if d.io is None else {"io": _decoder_io_obj(d.io)}),
        **({} if d.model is None else {"model": _decoder_model_obj(d.model)}),
    }


def _decoder_model_obj(m: DecoderModelRecord) -> dict[str, Any]:
    return {
        "vocab_size": m.vocab_size,
        "context_length": m.context_length,
        "bos_token_id": m.bos_token_id,
        "eos_token_ids": list(m.eos_token_ids),
        "pad_token_id": m.pad_token_id,
        "config": m.config,
        "files": list(m.files),
        "chat_template": m.chat_template,
    }


def _decoder_io_obj(io: IOContract) -> dict[str, Any]:
    """The IO contract: each model input and output a generation loop feeds or reads, with its role."""

    def bindings(of: tuple[Binding, ...]) -> list[dict[str, Any]]:
        return [
            {"tensor": b.tensor, "role": b.role, **({} if b.layer is None else {"layer": b.layer})}
            for b in of
        ]

    return {"inputs": bindings(io.inputs), "outputs": bindings(io.outputs)}


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
        **({"recomputed_node_count": s.recomputed_node_count} if s.recomputed_node_count else {}),
        **({"required_opsets": dict(s.required_opsets)} if s.required_opsets else {}),
        **({"kv_layers": list(s.kv_layers), "kv_cache_bytes": s.kv_cache_bytes} if s.kv_layers else {}),
        **(
            {"estimated_phase_seconds": {p: num(t) for p, t in s.estimated_phase_seconds}}
            if s.estimated_phase_seconds
            else {}
        ),
        "inputs": [
            {**_tensor_obj(t), "bytes_per_sample": t.bytes_per_sample, "source": t.source} for t in s.inputs
        ],
        "outputs": [
            {**_tensor_obj(t), "bytes_per_sample": t.bytes_per_sample, "consumers": list(t.consumers)}
            for t in s.outputs
        ],
        "estimated_compute_seconds": num(s.estimated_compute_seconds),
        "estimated_transfer_seconds": num(s.estimated_transfer_seconds),
        "param_bytes": s.param_bytes,
        "peak_activation_bytes": s.peak_activation_bytes,
        "shared_param_bytes": s.shared_param_bytes,
        "link_bytes_in": s.link_bytes_in,
    }


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
