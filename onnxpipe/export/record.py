"""The manifest of a written split, made from the plan and what each stage file turned out to be.

Sources and consumers of every boundary tensor, their types (:mod:`onnxpipe.export.boundary`) and sizes
at the profiled shapes, the weights copied into several stages, the source's path relative to the
folder, and the plan's numbers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, NamedTuple, cast

from onnxpipe.core.choices import SCALE_BYTES, BoundaryDtype, scale_name
from onnxpipe.core.errors import ExportError
from onnxpipe.core.options import opt
from onnxpipe.core.text import human_bytes
from onnxpipe.export.boundary import BoundaryTypes
from onnxpipe.export.contract import ContractMaker
from onnxpipe.export.options import ExportOptions
from onnxpipe.ir.embedding import TIED_SHARE, tied_tables
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapes import symbol_sizes
from onnxpipe.manifest import (
    MODEL,
    MODEL_INPUT,
    MODEL_OUTPUT,
    DeviceRecord,
    Manifest,
    ModelOutput,
    ModelTensor,
    SourceInfo,
    StageEntry,
    StageInput,
    StageOutput,
    VerificationRecord,
)
from onnxpipe.manifest.entries import WireDtype
from onnxpipe.planning.types import Plan, StageSpec, stage_boundary
from onnxpipe.schedule.simulate import stream
from onnxpipe.schedule.timeline import Timeline


@dataclass(frozen=True)
class SharedWeights:
    """Weights copied into more than one stage.

    ``per_stage[i]``: bytes of stage ``i``'s weights that some other stage also holds;
    ``duplicated``: bytes held more than once over the workers (each weight's size times the workers
    beyond the first that hold it; stages of one worker count once), what splitting adds to the memory;
    ``notes``: where a large shared weight (a tied embedding and LM head) is held, once or not.
    """

    per_stage: tuple[int, ...]
    duplicated: int
    notes: tuple[str, ...] = ()
    per_worker: tuple[int, ...] = ()
    """Each worker's weight bytes, every tensor of its stages once."""


def shared_weights(
    view: ModelView, weights_per_stage: Sequence[Sequence[str]], workers: Sequence[int] | None = None
) -> SharedWeights:
    """Count the weights held by several stages (``weights_per_stage[i]``: initializer names of stage i)
    and by several workers (``workers[i]``: stage i's; default a worker per stage)."""
    holders: dict[str, list[int]] = {}
    for s, names in enumerate(weights_per_stage):
        for t in dict.fromkeys(names):
            holders.setdefault(t, []).append(s)
    worker = list(workers) if workers is not None else list(range(len(weights_per_stage)))
    size = view.initializers
    per_stage = tuple(
        sum(size.get(t, 0) for t in set(names) if len(holders[t]) > 1) for names in weights_per_stage
    )
    held = {t: sorted({worker[s] for s in stages}) for t, stages in holders.items()}
    duplicated = sum(size.get(t, 0) * (len(w) - 1) for t, w in held.items())
    per_worker = tuple(
        sum(size.get(t, 0) for t, ws in held.items() if w in ws) for w in range(max(worker, default=-1) + 1)
    )
    large, tied = TIED_SHARE * view.param_bytes, tied_tables(view)
    notes = tuple(
        _shared_note(t, size[t], holders[t], held[t], len(weights_per_stage), max(worker) + 1, t in tied)
        for t in sorted(holders, key=lambda t: -size.get(t, 0))
        if len(holders[t]) > 1 and size.get(t, 0) >= large
    )
    return SharedWeights(per_stage, duplicated, notes, per_worker)


def _shared_note(
    tensor: str, nbytes: int, stages: Sequence[int], workers: Sequence[int], k: int, w: int, at_ends: bool
) -> str:
    """Where a weight several stages read is held, and, for a table read at both ends of the model only
    (a tied embedding and LM head) by the first and the last stage, how to hold it once."""
    read = f"weight {tensor} ({human_bytes(nbytes)}) is read by stages {', '.join(map(str, stages))}"
    if len(workers) == 1:
        return f"{read}, all on worker {workers[0]}: held once"
    hint = ""
    if at_ends and tuple(stages) == (0, k - 1):  # the first and last stages: put them on one worker
        hint = (
            f"; {opt('stages', k + 1)} {opt('workers', w)} deals the last stage back "
            "to worker 0 with the first, which then holds it once"
        )
    return (
        f"{read} on workers {', '.join(map(str, workers))}: held {len(workers)} times "
        f"({human_bytes(nbytes * (len(workers) - 1))} more), each worker loading its own stages{hint}"
    )


def build_manifest(
    view: ModelView,
    plan: Plan,
    out: Path,
    written: Sequence[StageFile],
    types: BoundaryTypes,
    shared: SharedWeights,
    contract: ContractMaker,
    options: ExportOptions,
) -> Manifest:
    """The manifest of ``plan`` as written to ``out``: each stage's file and the tensors it receives and
    emits (:func:`_stage_entry`), the model's inputs and outputs, the plan's numbers
    (:meth:`Plan.summary`) and the stream schedule (:func:`_schedule`); unverified, until a verification
    records its result.  ``written``: each stage's files; ``contract`` says what a boundary tensor is at
    the profiled shapes."""
    tensors = _Tensors(
        types, contract, plan.tensor_bytes, symbol_sizes(view, plan.input_shapes), plan.boundary_dtypes
    )
    flow = _Flow.of(view, plan.stages)
    stages = tuple(
        _stage_entry(s, f, flow, tensors, shared.per_stage[s.index])
        for s, f in zip(plan.stages, written, strict=True)
    )
    outputs = tuple(
        ModelOutput(t, produced_by=flow.producer.get(t, MODEL_INPUT), **tensors.described(t))
        for t in view.outputs
    )
    return Manifest(
        source=_source_info(view, out, options.source_name),
        model_inputs=tuple(ModelTensor(t, **tensors.described(t)) for t in view.inputs),
        model_outputs=outputs,
        stages=stages,
        cluster=plan.cluster,
        device_costs=tuple(DeviceRecord(d.device, d.method, d.source) for d in plan.device_costs),
        verification=VerificationRecord("unverified"),  # until a verification records its result
        plan=replace(
            plan.summary(shared.duplicated, (*contract.notes, *shared.notes)),
            worker_param_bytes=shared.per_worker if plan.workers is not None else None,
        ),
        schedule=_schedule(plan, options.microbatches),
    )


@dataclass(frozen=True)
class _Tensors:
    """How the manifest describes a tensor: its type as the stage files declare it (``types``), its
    contract (``contract``) and its bytes per sample (the plan's, else its type's at ``symbols``)."""

    types: BoundaryTypes
    contract: ContractMaker
    tensor_bytes: Mapping[str, int]
    symbols: Mapping[str, int]
    wire: Mapping[str, BoundaryDtype]
    """The boundary tensors that cross compressed (:mod:`onnxpipe.export.wire`)."""

    def nbytes(self, name: str) -> int:
        if name in self.tensor_bytes:
            value = int(self.tensor_bytes[name])
        else:
            info = self.types.types.get(name)
            value = info.nbytes(self.symbols) if info is not None else 0
        return max(0, value)  # a dim written as -1 ("any") can make a product negative

    def described(self, name: str) -> dict[str, Any]:
        """dtype, normalised shape, profiled shape and batch axis of a tensor (the boundary contract)."""
        dtype, shape = self.types.describe(name)
        c = self.contract.entry(name, shape)
        return {
            "dtype": dtype,
            "shape": c.shape,
            "profiled_shape": c.profiled_shape,
            "batch_axis": c.batch_axis,
        }

    def crossing(self, name: str) -> list[dict[str, Any]]:
        """What crosses a cut for ``name``: the tensor with its bytes per sample, or compressed, its wire
        tensor (and an int8 one's scale)."""
        sized = {"name": name, "bytes_per_sample": self.nbytes(name), **self.described(name)}
        dtype = self.wire.get(name)
        if dtype is None:
            return [sized]
        scale = SCALE_BYTES if dtype == BoundaryDtype.INT8 else 0
        wire_bytes = dtype.wire_bytes(sized["bytes_per_sample"]) - scale
        sent = [
            {**sized, "name": dtype.wire_name(name), "dtype": dtype.value, "bytes_per_sample": wire_bytes}
        ]
        if scale:
            scalar = {"shape": (), "profiled_shape": (), "batch_axis": None}
            sent.append({"name": scale_name(name), "dtype": "float32", "bytes_per_sample": scale, **scalar})
        return sent


@dataclass(frozen=True)
class _Flow:
    """Where each boundary tensor comes from and goes: the model's inputs and outputs, the stage that
    first emits it (``producer``) and the stages that receive it (``readers``, in order)."""

    model_inputs: frozenset[str]
    model_outputs: frozenset[str]
    producer: Mapping[str, int]
    readers: Mapping[str, tuple[int, ...]]

    @staticmethod
    def of(view: ModelView, specs: Sequence[StageSpec]) -> _Flow:
        producer: dict[str, int] = {}
        readers: dict[str, list[int]] = {}
        for s in specs:
            for t in s.outputs:
                producer.setdefault(t, s.index)
            for t in s.inputs:
                readers.setdefault(t, []).append(s.index)
        return _Flow(
            frozenset(view.inputs),
            frozenset(view.outputs),
            producer,
            {t: tuple(r) for t, r in readers.items()},
        )

    def source(self, tensor: str, stage: int) -> int | Literal["model"]:
        """Where ``stage`` receives ``tensor`` from: the caller, or the earlier stage that emits it."""
        if tensor in self.model_inputs:
            return MODEL
        if tensor in self.producer and self.producer[tensor] < stage:
            return self.producer[tensor]
        raise ExportError(
            f"stage {stage} reads {tensor!r}, which neither the model inputs nor an earlier stage "
            "provide; the plan is inconsistent with the model"
        )

    def consumers(self, tensor: str, stage: int) -> tuple[int | Literal["model_output"], ...]:
        """Who receives ``tensor`` from ``stage``: the later stages that read it, and the caller."""
        later = tuple(r for r in self.readers.get(tensor, ()) if r > stage)
        return (*later, MODEL_OUTPUT) if tensor in self.model_outputs else later


class StageFile(NamedTuple):
    """What writing one stage made: its file, its weights file, their hashes and the op domains it uses."""

    file: str
    sha256: str
    external_data: str | None
    external_data_sha256: str | None
    required_opsets: tuple[tuple[str, int], ...]


def _stage_entry(
    s: StageSpec, written: StageFile, flow: _Flow, tensors: _Tensors, shared_param_bytes: int
) -> StageEntry:
    """A stage's entry: the file written, the tensors it receives and emits (as they cross), what the plan
    estimated for it and its weights other stages hold."""
    inputs = tuple(
        StageInput(source=flow.source(t, s.index), **sent) for t in s.inputs for sent in tensors.crossing(t)
    )
    outputs = tuple(
        StageOutput(consumers=flow.consumers(t, s.index), **sent)
        for t in s.outputs
        for sent in tensors.crossing(t)
    )
    return StageEntry(
        index=s.index,
        **written._asdict(),
        node_count=len(s.file_node_names),
        skipped_node_count=len(s.skipped_nodes),
        same_values=tuple(a for a in s.aliases if a.same_as in s.inputs),
        recomputed_node_count=len(s.recomputed_nodes),
        constant_node_count=len(s.constant_nodes),
        device=s.device,
        inputs=inputs,
        outputs=outputs,
        estimated_compute_seconds=s.compute_seconds,
        estimated_transfer_seconds=s.transfer_seconds,
        param_bytes=max(0, s.param_bytes),
        peak_activation_bytes=max(0, s.peak_activation_bytes),
        shared_param_bytes=shared_param_bytes,
        link_bytes_in=s.link_bytes_in,
        worker=s.worker,
        kv_layers=s.kv_layers,
        kv_cache_bytes=s.kv_cache_bytes,
        estimated_phase_seconds=s.phase_seconds,
        boundary_dtype=cast(WireDtype, stage_boundary(tensors.wire, s).value),
    )


def _schedule(plan: Plan, microbatches: int) -> Timeline:
    """The plan's own timeline, else a stream of ``microbatches`` through its stages (on its workers)."""
    if plan.timeline is not None:
        return plan.timeline
    shared_workers = [s.index % plan.workers for s in plan.stages] if plan.workers is not None else None
    return stream([s.cost_seconds for s in plan.stages], microbatches, workers=shared_workers)


def _source_info(view: ModelView, out: Path, source_name: str | None) -> SourceInfo:
    """The source's path (and its joined embedding model's) relative to the manifest's folder, so that
    moving both together keeps it valid."""
    path = _relative(view.path, out) if view.path is not None else None
    embedding = _relative(view.embedding, out) if view.embedding is not None else None
    name = source_name or view.file_name or "model.onnx"
    return SourceInfo(file=name, path=path, sha256=view.sha256, embedding=embedding)


def _relative(path: Path, out: Path) -> str:
    """``path`` relative to ``out``; absolute when the two share no folder below the filesystem root (or
    lie on different drives)."""
    target = path.resolve()
    folder = out.resolve()
    try:
        common = Path(os.path.commonpath([target, folder]))
        relative = common != Path(common.anchor)
    except ValueError:  # another drive on Windows
        relative = False
    return Path(os.path.relpath(target, folder)).as_posix() if relative else target.as_posix()
