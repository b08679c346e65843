"""Reading a manifest back, one line per field: every field checked for presence, type and range by
:mod:`onnxpipe.core.jsonread`, a message naming the file and the field's JSON path.

Unknown keys are ignored (additive changes keep ``schema_version``, docs/manifest.md); the rules that
span fields are :mod:`onnxpipe.manifest.check`'s; :class:`~onnxpipe.manifest.manifest.Manifest`
puts the parts together.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Literal, cast

from onnxpipe.cluster.devicesfile import read_cluster
from onnxpipe.cluster.model import Cluster
from onnxpipe.core.choices import E, Ends, LinkModel, Phase, PhaseChoice, ScheduleKind, values
from onnxpipe.core.dims import Dim, Shape
from onnxpipe.core.errors import ManifestError, UsageError
from onnxpipe.core.inputfiles import InputRecord
from onnxpipe.core.iocontract import Binding, IOContract, Role
from onnxpipe.core.jsonread import Fields, Rule, Value
from onnxpipe.core.kv import KVPair
from onnxpipe.manifest.entries import (
    MODEL,
    MODEL_INPUT,
    MODEL_OUTPUT,
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    V1_MODEL_INPUT,
    VERIFICATION_STATUSES,
    DecoderModelRecord,
    DecoderRecord,
    DeviceRecord,
    ModelOutput,
    ModelTensor,
    NodeSplitRecord,
    PlanSummary,
    SameValue,
    SourceInfo,
    StageEntry,
    StageInput,
    StageOutput,
    VerificationRecord,
)
from onnxpipe.schedule.timeline import Step, StepKind, Timeline, Transfer


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


def _is_plain_file_name(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


# A stage file outside the folder would let a manifest make the runner load (and check_stage_files hash)
# any file on the machine; a malformed hash could never match, so it is refused here, not at load time.
_FILE_NAME = Rule(_is_plain_file_name, "a plain file name in the folder")
_SHA256 = Rule(_is_sha256, "a sha256 as 64 lowercase hex digits")
_STAGE_OR_MODEL_INPUT = f'a stage index or "{MODEL_INPUT}"'
_STAGE_OR_MODEL = 'a stage index or "model"'
_STAGE_OR_MODEL_OUTPUT = 'a stage index or "model_output"'
_V1_STAGE_OR = f'a stage index or "{V1_MODEL_INPUT}"'


def _dim(v: Value) -> Dim:
    d = v.raw
    if d is None or isinstance(d, str) or (isinstance(d, int) and not isinstance(d, bool) and d >= 0):
        return d
    raise v.expected("a dim (integer >= 0, symbolic name or null)")


def _shape(v: Value) -> Shape:
    return v.opt_list_of(_dim)


def _contract(f: Fields, shape: Shape) -> dict[str, Any]:
    """The optional boundary-contract fields of a tensor entry (schema 3): a concrete profiled shape of
    the declared rank, and a batch axis within it."""
    profiled = f.get("profiled_shape", None).opt_list_of(lambda v: v.integer())
    if profiled is not None and shape is not None and len(profiled) != len(shape):
        raise f["profiled_shape"].expected(f"{len(shape)} dims, as many as its shape")
    batch = f.get("batch_axis", None).opt_integer()
    rank = len(profiled) if profiled is not None else (len(shape) if shape is not None else None)
    if batch is not None and rank is not None and batch >= rank:
        raise f["batch_axis"].expected(f"an axis below its rank {rank}")
    return {"profiled_shape": profiled, "batch_axis": batch}


def _required_opsets(v: Value) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(v.dict_of(lambda x: x.integer(minimum=1)).items()))


def source(f: Fields) -> SourceInfo:
    return SourceInfo(
        file=f["file"].string(), path=f["path"].opt_string(), sha256=f["sha256"].string(_SHA256)
    )


def _tensor(f: Fields) -> dict[str, Any]:
    """What every tensor entry holds: name, dtype, shape and the boundary contract."""
    shape = _shape(f["shape"])
    return {"name": f["name"].string(), "dtype": f["dtype"].string(), "shape": shape, **_contract(f, shape)}


def model_tensor(f: Fields) -> ModelTensor:
    return ModelTensor(**_tensor(f))


def model_output(f: Fields, version: int) -> ModelOutput:
    """A model output; version 1 spelled a pass-through's ``produced_by`` ``"model input"``."""
    by = f["produced_by"]
    produced_by: int | Literal["model_input"]
    if version == 1:
        old = by.integer_or(V1_MODEL_INPUT, expected=_V1_STAGE_OR)
        produced_by = MODEL_INPUT if old == V1_MODEL_INPUT else int(old)
    else:
        produced_by = by.integer_or(MODEL_INPUT, expected=_STAGE_OR_MODEL_INPUT)
    return ModelOutput(produced_by=produced_by, **_tensor(f))


def _stage_input(f: Fields) -> StageInput:
    return StageInput(
        **_tensor(f),
        bytes_per_sample=f["bytes_per_sample"].integer(),
        source=f["source"].integer_or(MODEL, expected=_STAGE_OR_MODEL),
    )


def _stage_output(f: Fields) -> StageOutput:
    return StageOutput(
        **_tensor(f),
        bytes_per_sample=f["bytes_per_sample"].integer(),
        consumers=f["consumers"].list_of(
            lambda c: c.integer_or(MODEL_OUTPUT, expected=_STAGE_OR_MODEL_OUTPUT)
        ),
    )


def stage(f: Fields) -> StageEntry:
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
        recomputed_node_count=f.get("recomputed_node_count", 0).integer(),
        required_opsets=_required_opsets(f.get("required_opsets", {})),
        kv_layers=f.get("kv_layers", []).list_of(Value.integer),
        kv_cache_bytes=f.get("kv_cache_bytes", 0).integer(),
        estimated_phase_seconds=tuple(
            (Phase(p), t)
            for p, t in f.get("estimated_phase_seconds", {}).dict_of(lambda v: v.number()).items()
            if p in values(Phase)
        ),
    )


def _same_value(f: Fields) -> SameValue:
    return SameValue(name=f["name"].string(), same_as=f["same_as"].string())


def plan(f: Fields) -> PlanSummary:
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
        profiled_inputs=f.get("profiled_inputs", []).objects(InputRecord.read),
        node_splits=f.get("node_splits", []).objects(_node_split),
        link_model=_link_model(f.get("link_model", None)),
        decoder=_decoder(f.get("decoder", None)),
    )


def _node_split(f: Fields) -> NodeSplitRecord:
    parts = f["parts"].integer(minimum=2)
    stages = f["stages"].list_of(lambda v: v.integer(minimum=0))
    if len(stages) != parts or list(stages) != sorted(stages):
        raise f["stages"].fail(
            f"expected {parts} non-decreasing stage indices, one per part, got {list(stages)}"
        )
    bound = f["contiguous_bound_seconds"].number()
    best = f["contiguous_bottleneck_seconds"].number()
    return NodeSplitRecord(
        node=f["node"].string(),
        kind=f["kind"].string(),
        parts=parts,
        stages=tuple(stages),
        contiguous_bound_seconds=bound,
        contiguous_bottleneck_seconds=best,
    )


def _link_model(v: Value) -> LinkModel | None:
    """``plan.link_model`` (added in schema 3, optional): ``serial`` or ``overlap``."""
    if v.raw is None:
        return None
    return _choice(v, LinkModel)


def _decoder(v: Value) -> DecoderRecord | None:
    """``plan.decoder`` (added in schema 3; absent for other models and older files)."""
    if v.raw is None:
        return None
    f = v.fields()
    return DecoderRecord(
        layers=f["layers"].integer(minimum=1),
        layer_cuts=f["layer_cuts"].boolean(),
        ends=_choice(f["ends"], Ends),
        max_context=f["max_context"].integer(minimum=1),
        phase=_choice(f["phase"], PhaseChoice),
        phase_shapes=f.get("phase_shapes", []).objects(_phase_shape),
        io=_decoder_io(f.get("io", None)),
        model=_decoder_model(f.get("model", None)),
    )


def _decoder_model(v: Value) -> DecoderModelRecord | None:
    """``plan.decoder.model``: optional (a manifest written before it has none)."""
    if v.raw is None:
        return None
    f = v.fields()
    return DecoderModelRecord(
        vocab_size=f.get("vocab_size", None).opt_integer(minimum=1),
        context_length=f.get("context_length", None).opt_integer(minimum=1),
        bos_token_id=f.get("bos_token_id", None).opt_integer(),
        eos_token_ids=f.get("eos_token_ids", []).list_of(Value.integer),
        pad_token_id=f.get("pad_token_id", None).opt_integer(),
        config=f.get("config", None).opt_string(),
        files=f.get("files", []).list_of(lambda x: x.string(_FILE_NAME)),
        chat_template=f.get("chat_template", None).opt_string(_FILE_NAME),
    )


def _decoder_io(v: Value) -> IOContract | None:
    """``plan.decoder.io``, the split's IO contract: optional (a manifest written before it has none).
    Schema 3 wrote it as the names of the token, mask, position and logits tensors and the layers' cache
    pairs: read as the contract of such a decoder."""
    if v.raw is None:
        return None
    f = v.fields()
    if isinstance(v.raw, dict) and "inputs" not in v.raw:  # schema 3
        kv = f["kv"].objects(_kv_pair)
        ids = f["input_ids"].string()
        mask, positions = f.get("attention_mask", None).opt_string(), f.get("position_ids", None).opt_string()
        contract = IOContract.of_decoder(ids, mask, positions, f.get("logits", None).opt_string(), kv)
    else:
        contract = IOContract(f["inputs"].objects(_binding), f["outputs"].objects(_binding))
    problem = contract.problem()
    if problem is not None:
        raise v.fail(f"the IO contract is incomplete: {problem}")
    return contract


def _binding(f: Fields) -> Binding:
    return Binding(f["tensor"].string(), _choice(f["role"], Role), f.get("layer", None).opt_integer())


def _kv_pair(f: Fields) -> KVPair:
    return KVPair(
        layer=f["layer"].integer(),
        past_key=f["past_key"].string(),
        past_value=f.get("past_value", None).opt_string(),
        present_key=f["present_key"].string(),
        present_value=f.get("present_value", None).opt_string(),
    )


def _phase_shape(f: Fields) -> tuple[Phase, int, int]:
    return (_choice(f["phase"], Phase), f["new_tokens"].integer(minimum=1), f["past_tokens"].integer())


def _choice(v: Value, kind: type[E]) -> E:
    """A string field that must be one of ``kind``'s values."""
    text = v.string()
    if text not in values(kind):
        raise v.fail(f"expected one of {', '.join(values(kind))}, got {text!r}")
    return kind(text)


def _reference(v: Value) -> float | None:
    if v.raw is None:
        return None
    seconds = v.finite()
    if seconds <= 0:
        raise v.fail(f"expected a time above 0 seconds, got {seconds}")
    return seconds


def device_record(f: Fields) -> DeviceRecord:
    return DeviceRecord(device=f["device"].string(), method=f["method"].string(), source=f["source"].string())


def cluster(v: Value) -> Cluster | None:
    """The devices and links the plan was made for (``null`` for identical CPU workers).

    The devices file has its own reader (and raises ``UsageError``, which means a bad ``--devices``
    argument); inside a manifest the same fault is a bad manifest, so it becomes a ``ManifestError``.
    """
    if v.raw is None:
        return None
    try:
        return read_cluster(v.fields().raw, source=f"{v.doc.source}: cluster")
    except UsageError as e:
        raise ManifestError(str(e)) from e


def _time_slack(v: Value) -> float:
    slack = v.finite()
    if slack < 0:
        raise v.fail(f"expected a share of 0 or more, got {slack}")
    return slack


# --------------------------------------------------------------------------------------------------
# the schedule


def timeline(v: Value) -> Timeline:
    """The ``schedule`` (what :func:`onnxpipe.manifest.write.timeline_obj` writes), read back."""
    f = v.fields()
    kind_value = f.need("kind", _AGAIN)
    kind = kind_value.raw
    if kind not in values(ScheduleKind):
        raise kind_value.fail(f"expected one of {', '.join(values(ScheduleKind))}, got {kind!r}")
    devices = f.need("devices", _AGAIN)
    stages = devices.list_of(lambda d: _device_steps(d, len(devices.raw)))
    workers = [w for _, w in stages]
    if any((w is None) != (workers[0] is None) for w in workers):
        odd = next(s for s, w in enumerate(workers) if w is None) if workers[0] is not None else 0
        raise v.doc.fail(f"{devices.path}[{odd}].worker", "give a worker for every stage or for none")
    return Timeline(
        kind=ScheduleKind(kind),
        microbatches=f.need("microbatches", _AGAIN).integer(1),
        stages=tuple(steps for steps, _ in stages),
        transfers=f.get("transfers", []).list_of(_transfer),
        makespan=f.need("makespan_seconds", _AGAIN).number(),
        steady_state_throughput_per_s=f.need("steady_state_throughput_per_s", _AGAIN).number(),
        workers=None if not workers or workers[0] is None else tuple(cast(list[int], workers)),
    )


_AGAIN = "re-run onnxpipe split"


def _device_steps(v: Value, count: int) -> tuple[tuple[Step, ...], int | None]:
    f = v.fields()
    stage = f.need("stage", _AGAIN)
    s = stage.integer()
    expected = int(v.path[v.path.rindex("[") + 1 : -1])
    if s != expected:
        raise stage.fail(f"expected {expected} (devices are listed in stage order)")
    worker = f.get("worker", None).opt_integer()
    return f.need("steps", _AGAIN).list_of(_step), worker


def _step(v: Value) -> Step:
    items = _items(v, 4, "[kind, microbatch, start, end]")
    return Step(_step_kind(items[0]), items[1].integer(), items[2].number(), items[3].number())


def _transfer(v: Value) -> Transfer:
    items = _items(v, 5, "[link, kind, microbatch, start, end]")
    return Transfer(
        items[0].integer(), _step_kind(items[1]), items[2].integer(), items[3].number(), items[4].number()
    )


def _items(v: Value, n: int, what: str) -> tuple[Value, ...]:
    items = v.list_of(lambda item: item)
    if len(items) != n:
        raise v.fail(f"expected {what}")
    return items


def _step_kind(v: Value) -> StepKind:
    if v.raw not in ("F", "B"):
        raise v.fail('expected "F" or "B"')
    return cast(StepKind, v.raw)


def verification(v: Value) -> VerificationRecord | None:
    """``verification`` (added in schema 3, optional): the status, and how once verified."""
    if v.raw is None:
        return None
    f = v.fields()
    status = f["status"].string()
    if status not in VERIFICATION_STATUSES:
        raise f["status"].fail(f"expected one of {', '.join(VERIFICATION_STATUSES)}, got {status!r}")
    if status == "unverified":
        return VerificationRecord(status)
    for key in ("rtol", "atol", "seed", "runs", "input_shapes"):
        f.need(key, "a verified manifest says how: rtol, atol, seed, runs and input_shapes")
    return VerificationRecord(
        status=status,
        rtol=f["rtol"].finite(),
        atol=f["atol"].finite(),
        seed=f["seed"].integer(minimum=None),
        runs=f["runs"].integer(minimum=1),
        input_shapes=MappingProxyType(
            {
                k: tuple(d)
                for k, d in f["input_shapes"].dict_of(lambda dims: dims.list_of(Value.integer)).items()
            }
        ),
    )
