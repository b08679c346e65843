"""The manifest of a written split, made from the plan and what each stage file turned out to be.

Sources and consumers of every boundary tensor, their types (:mod:`onnxpipe.export.boundary`) and sizes
at the profiled shapes, the weights copied into several stages, the source's path relative to the
folder, and the plan's numbers.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from onnxpipe.core.errors import ExportError
from onnxpipe.export.boundary import BoundaryTypes
from onnxpipe.export.contract import ContractMaker
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
from onnxpipe.planning.types import Plan, StageSpec
from onnxpipe.schedule.simulate import stream


@dataclass(frozen=True)
class Written:
    """One stage as written: its plan entry, its file and weights file with their hashes."""

    spec: StageSpec
    file: str
    sha256: str
    external_data: str | None
    external_data_sha256: str | None
    constant_node_count: int
    required_opsets: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class SharedWeights:
    """Weights copied into more than one stage.

    ``per_stage[i]``: bytes of stage ``i``'s weights that some other stage also holds;
    ``duplicated``: bytes written more than once over all stages (each weight's size times its copies
    beyond the first), what splitting adds to the model's size.
    """

    per_stage: tuple[int, ...]
    duplicated: int


def shared_weights(view: ModelView, weights_per_stage: Sequence[Sequence[str]]) -> SharedWeights:
    """Count the weights held by several stages (``weights_per_stage[i]``: initializer names of stage i)."""
    copies: dict[str, int] = {}
    for names in weights_per_stage:
        for t in set(names):
            copies[t] = copies.get(t, 0) + 1
    size = view.initializers
    per_stage = tuple(sum(size.get(t, 0) for t in set(names) if copies[t] > 1) for names in weights_per_stage)
    duplicated = sum(size.get(t, 0) * (n - 1) for t, n in copies.items())
    return SharedWeights(per_stage=per_stage, duplicated=duplicated)


def build_manifest(
    view: ModelView,
    plan: Plan,
    out: Path,
    written: Sequence[Written],
    types: BoundaryTypes,
    shared: SharedWeights,
    source_name: str | None,
    microbatches: int,
    contract: ContractMaker | None = None,
) -> Manifest:
    k = len(written)
    producer: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    for w in written:
        for t in w.spec.outputs:
            producer.setdefault(t, w.spec.index)
        for t in w.spec.inputs:
            readers.setdefault(t, []).append(w.spec.index)
    model_outputs = set(view.outputs)
    symbols = symbol_sizes(view, plan.input_shapes)

    def nbytes(name: str) -> int:
        if name in plan.tensor_bytes:
            value = int(plan.tensor_bytes[name])
        else:
            info = types.types.get(name)
            value = info.nbytes(symbols) if info is not None else 0
        return max(0, value)  # a dim written as -1 ("any") can make a product negative

    if contract is None:
        contract = ContractMaker(view, plan.input_shapes)

    def described(name: str) -> dict[str, Any]:
        """dtype, normalised shape, profiled shape and batch axis of a tensor (the boundary contract)."""
        dtype, shape = types.describe(name)
        c = contract.entry(name, shape)
        return {
            "dtype": dtype,
            "shape": c.shape,
            "profiled_shape": c.profiled_shape,
            "batch_axis": c.batch_axis,
        }

    entries: list[StageEntry] = []
    for w in written:
        s = w.spec
        inputs: list[StageInput] = []
        for t in s.inputs:
            source: int | Literal["model"]
            if t in view.inputs:
                source = MODEL
            elif producer.get(t, k) < s.index:
                source = producer[t]
            else:
                raise ExportError(
                    f"stage {s.index} reads {t!r}, which neither the model inputs nor an earlier stage "
                    "provide; the plan is inconsistent with the model"
                )
            inputs.append(StageInput(t, bytes_per_sample=nbytes(t), source=source, **described(t)))
        outputs: list[StageOutput] = []
        for t in s.outputs:
            consumers: list[int | Literal["model_output"]] = [r for r in readers.get(t, []) if r > s.index]
            if t in model_outputs:
                consumers.append(MODEL_OUTPUT)
            outputs.append(
                StageOutput(t, bytes_per_sample=nbytes(t), consumers=tuple(consumers), **described(t))
            )
        entries.append(
            StageEntry(
                index=s.index,
                file=w.file,
                sha256=w.sha256,
                external_data=w.external_data,
                external_data_sha256=w.external_data_sha256,
                node_count=len(s.file_node_names),
                skipped_node_count=len(s.skipped_nodes),
                same_values=tuple(a for a in s.aliases if a.same_as in s.inputs),
                recomputed_node_count=len(s.recomputed_nodes),
                required_opsets=w.required_opsets,
                constant_node_count=w.constant_node_count,
                device=s.device,
                inputs=tuple(inputs),
                outputs=tuple(outputs),
                estimated_compute_seconds=s.compute_seconds,
                estimated_transfer_seconds=s.transfer_seconds,
                param_bytes=max(0, s.param_bytes),
                peak_activation_bytes=max(0, s.peak_activation_bytes),
                shared_param_bytes=shared.per_stage[s.index],
                link_bytes_in=s.link_bytes_in,
                worker=s.worker,
                kv_layers=s.kv_layers,
                kv_cache_bytes=s.kv_cache_bytes,
                estimated_phase_seconds=s.phase_seconds,
            )
        )

    outs: list[ModelOutput] = []
    for t in view.outputs:
        by: int | Literal["model_input"] = producer.get(t, MODEL_INPUT)
        outs.append(ModelOutput(t, produced_by=by, **described(t)))

    shared_workers = [s.index % plan.workers for s in plan.stages] if plan.workers is not None else None
    timeline = plan.timeline or stream(
        [s.cost_seconds for s in plan.stages], microbatches, workers=shared_workers
    )
    return Manifest(
        source=_source_info(view, out, source_name),
        model_inputs=tuple(ModelTensor(t, **described(t)) for t in view.inputs),
        model_outputs=tuple(outs),
        stages=tuple(entries),
        cluster=plan.cluster,
        device_costs=tuple(DeviceRecord(d.device, d.method, d.source) for d in plan.device_costs),
        verification=VerificationRecord("unverified"),  # until a verification records its result
        plan=plan.summary(shared.duplicated, contract.notes),
        schedule=timeline,
    )


def _source_info(view: ModelView, out: Path, source_name: str | None) -> SourceInfo:
    """The source's path relative to the manifest's folder, so that moving both together keeps it valid.

    Absolute when the two share no folder below the filesystem root (or lie on different drives).
    """
    path: str | None = None
    if view.path is not None:
        target = view.path.resolve()
        folder = out.resolve()
        try:
            common = Path(os.path.commonpath([target, folder]))
            relative = common != Path(common.anchor)
        except ValueError:  # another drive on Windows
            relative = False
        path = Path(os.path.relpath(target, folder)).as_posix() if relative else target.as_posix()
    name = source_name or view.file_name or "model.onnx"
    return SourceInfo(file=name, path=path, sha256=view.sha256)
