"""The manifest of a written split, made from the plan and what each stage file turned out to be.

Sources and consumers of every boundary tensor, their types (:mod:`onnxpipe.export.boundary`) and sizes
at the profiled shapes, the weights copied into several stages, the source's path relative to the
folder, and the plan's numbers.

The boundary contract (:class:`ContractMaker`) is what another runtime needs to know of every tensor
between stages.  Why: a runtime other than onnxruntime (OpenVINO, tract, a Triton server) binds stage
inputs and outputs by the manifest.  It cannot use exporters' private symbols (``unk__44``,
``p2o.DynamicDimension.0``) or the expression strings shape inference writes
(``floor(height/2 - 1/2) + 1``), and a shape the source declared may simply be wrong (an output declared
``[1, seqlen]`` that is really ``(16, 1, 8210)``).  So each boundary tensor and model input/output
carries in the manifest:

* ``shape``: its symbolic dims normalised to the model inputs' own symbols, an int where fixed, null
  otherwise (never another name, never an expression);
* ``profiled_shape``: its concrete shape at the profiled input shapes;
* ``batch_axis``: the axis carrying the batch dim the model inputs share at axis 0 (or none).

Concrete shapes come from the symbols where they can, and otherwise from one run of the source at the
profiled shapes (:meth:`ContractMaker.observe`); a second run with each input symbol grown by a step of
its own tells which unnamed dims follow which input symbol.  The first run also checks the declared
shapes: a declared shape that disagrees with the run is replaced by unknown dims of the observed rank (in
the stage files too, since this happens before they are written) and a plan note says so.  The run is
made only when some boundary dim is not settled by the symbols, and with onnxruntime's basic
optimizations: most splits (CNNs at fixed shapes) pay nothing for it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal, NamedTuple, cast

import numpy as np
import onnx

from onnxpipe.core.choices import SCALE_BYTES, BoundaryDtype, scale_name
from onnxpipe.core.dims import Shape
from onnxpipe.core.errors import ExportError, UsageError
from onnxpipe.core.options import opt
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.core.text import human_bytes
from onnxpipe.export.boundary import BoundaryTypes, clean, with_outputs
from onnxpipe.export.build import nodes_within
from onnxpipe.export.options import ExportOptions
from onnxpipe.ir.decoder import TIED_SHARE, tied_tables
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.model import ModelView, TensorInfo, dims_text
from onnxpipe.ir.shapes import resolve_input_shapes, symbol_sizes
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
from onnxpipe.planning.types import Plan, StageSpec
from onnxpipe.planning.wire import stage_boundary
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
    """The boundary tensors that cross compressed (:func:`onnxpipe.export.stages.compress_stage`)."""

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
        return {"dtype": dtype, **asdict(self.contract.entry(name, shape))}

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
            scalar = asdict(TensorContract((), (), None))
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


# --------------------------------------------------------------------------------------------------
# the boundary contract


@dataclass(frozen=True)
class TensorContract:
    """One tensor's entry in the contract (see the module docstring)."""

    shape: Shape
    profiled_shape: tuple[int, ...] | None
    batch_axis: int | None


def batch_symbol(view: ModelView) -> str | None:
    """The symbol at axis 0 of every model input (of rank 1 or more), if they all share one."""
    found = {shape[0] for name in view.inputs if (shape := view.tensor(name).shape)}
    only = found.pop() if len(found) == 1 else None
    return only if isinstance(only, str) else None


class ContractMaker:
    """Builds :class:`TensorContract` entries for one export; :meth:`observe` first, when it can run."""

    def __init__(self, view: ModelView, input_shapes: Mapping[str, Sequence[int]]) -> None:
        self.view = view
        self.input_shapes = dict(input_shapes)
        self.symbols = frozenset(
            d for name in view.inputs for d in (view.tensor(name).shape or ()) if isinstance(d, str)
        )
        resolved: Mapping[str, Sequence[int]]
        try:  # a plan made without shapes (static costs in tests) profiled at the defaults
            resolved = resolve_input_shapes(view, input_shapes or None)
        except UsageError:  # an input of unknown rank: nothing to size the symbols by
            resolved = input_shapes
        self.sizes = symbol_sizes(view, resolved)
        self.batch = batch_symbol(view)
        self.observed: dict[str, tuple[int, ...]] = {}
        self.symbols_seen: dict[str, tuple[str | None, ...]] = {}
        """Per observed tensor, the input symbol each dim followed when the inputs grew (or None)."""
        self.notes: list[str] = []

    def normalized(self, shape: Shape) -> Shape:
        """``shape`` with every dim that is neither an int nor a model input's symbol as unknown."""
        if shape is None:
            return None
        return tuple(d if isinstance(d, int) or d in self.symbols else None for d in clean(shape) or ())

    def settled(self, shape: Shape) -> tuple[int, ...] | None:
        """The concrete dims of ``shape`` at the profiled input shapes, when the symbols settle them."""
        shape = self.normalized(shape)
        if shape is None:
            return None
        dims: list[int] = []
        for d in shape:
            if isinstance(d, int):
                dims.append(d)
            elif isinstance(d, str) and d in self.sizes:
                dims.append(self.sizes[d])
            else:
                return None
        return tuple(dims)

    def observe(self, names: Iterable[str], types: BoundaryTypes) -> None:
        """Run the source once at the profiled shapes, if some tensor of ``names`` is not settled by the
        symbols, and keep every one's observed shape; fix declared shapes the run contradicts.

        Best effort: a model that does not run here keeps the symbols' answer (null where they have
        none), as the stage checks report what is really wrong.
        """
        wanted = [n for n in dict.fromkeys(names) if n not in types.other]
        if not wanted or all(self.settled(types.describe(n)[1]) is not None for n in wanted):
            return
        data = with_outputs(self.view.proto, wanted)
        try:
            shapes = resolve_input_shapes(self.view, self.input_shapes or None)
            feeds = random_feeds(self.view, shapes, seed=0)
            # log_severity 4: a probe that fails is expected and handled, not an error for the user to read
            session = open_session(data, session_options(level="ORT_ENABLE_BASIC", log_severity=4))
            values = session.run(wanted, feeds)
        except Exception:  # noqa: BLE001 - best effort, see the docstring
            return
        for name, value in zip(wanted, values, strict=True):
            if isinstance(value, np.ndarray):
                self.observed[name] = tuple(int(d) for d in value.shape)
        self._check_declared(types)
        self._vary(session, wanted, shapes)

    def _vary(self, session: Any, wanted: list[str], shapes: Mapping[str, Sequence[int]]) -> None:
        """Run once more with each input symbol grown by a step of its own (1, 2, ...): a dim that was
        the symbol's size and grew by its step is that symbol (a made-up ``unk__7`` that is the batch).
        Best effort: a model that does not run at those sizes keeps null dims."""
        steps = {sym: i + 1 for i, sym in enumerate(sorted(self.symbols))}
        if not steps:
            return
        grown: dict[str, list[int]] = {}
        for name in self.view.inputs:
            declared = self.view.tensor(name).shape or ()
            dims = list(shapes[name])
            for axis, d in enumerate(declared):
                if isinstance(d, str) and d in steps and axis < len(dims):
                    dims[axis] += steps[d]
            grown[name] = dims
        try:
            values = session.run(wanted, random_feeds(self.view, grown, seed=0))
        except Exception:  # noqa: BLE001 - best effort, see the docstring
            return
        for name, value in zip(wanted, values, strict=True):
            first = self.observed.get(name)
            if not isinstance(value, np.ndarray) or first is None or len(first) != value.ndim:
                continue
            found: list[str | None] = []
            for before, after in zip(first, value.shape, strict=True):
                match = [
                    sym
                    for sym, step in steps.items()
                    if self.sizes.get(sym) == before and after - before == step
                ]
                found.append(match[0] if len(match) == 1 else None)
            self.symbols_seen[name] = tuple(found)

    def _check_declared(self, types: BoundaryTypes) -> None:
        """Declared shapes the run contradicts become unknown dims of the observed rank."""
        for name, seen in self.observed.items():
            info = types.types.get(name)
            if info is None or info.shape is None:
                continue
            declared = clean(info.shape) or ()
            wrong = len(declared) != len(seen) or any(
                (isinstance(d, int) and d != v)
                or (isinstance(d, str) and d in self.sizes and self.sizes[d] != v)
                for d, v in zip(declared, seen, strict=False)
            )
            if wrong:
                types.types[name] = TensorInfo(name, info.elem_type, (None,) * len(seen))
                self.notes.append(
                    f"tensor {name!r} is declared {dims_text(declared)} but is {seen} at the profiled "
                    "shapes: declared with unknown dims instead"
                )

    def entry(self, name: str, shape: Shape) -> TensorContract:
        """The contract of ``name``, whose declared (described) shape is ``shape``."""
        normal = self.normalized(shape)
        seen = self.symbols_seen.get(name)
        if normal is not None and seen is not None and len(seen) == len(normal):
            normal = tuple(d if d is not None else s for d, s in zip(normal, seen, strict=True))
        profiled = self.observed.get(name) or self.settled(shape)
        if profiled is not None and normal is not None and len(profiled) != len(normal):
            profiled = None
        axis = None
        if self.batch is not None and normal is not None and self.batch in normal:
            axis = normal.index(self.batch)
        return TensorContract(normal, profiled, axis)


def required_opsets(model: onnx.ModelProto) -> tuple[tuple[str, int], ...]:
    """``(domain, version)`` of every op domain the model's nodes use, bodies and local functions
    included, with the version the model imports; sorted."""
    local = {(f.domain, f.name) for f in model.functions}
    used = {
        "" if n.domain == "ai.onnx" else n.domain
        for nodes in (model.graph.node, *(f.node for f in model.functions))
        for n in nodes_within(nodes)
        if (n.domain, n.op_type) not in local
    }
    versions = {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in model.opset_import}
    for f in model.functions:
        for o in f.opset_import:
            versions.setdefault("" if o.domain == "ai.onnx" else o.domain, int(o.version))
    return tuple(sorted((d, versions.get(d, 1)) for d in used))
