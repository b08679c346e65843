"""Write a :class:`~onnxpipe.plan.Plan` as one valid ONNX file per stage, plus ``manifest.json``.

One pass over the already loaded model: each stage's nodes are copied out of ``view.proto`` by index
(constant producers first, a ``Shape`` of a static tensor becoming a ``Constant``), with only the weights
its nodes read, bodies of If/Loop/Scan included.  Weights kept in external files are read one tensor at
a time while their stage is written, so memory holds about one stage.  Each stage is checked with
``onnx.checker`` and opened in onnxruntime before the export counts as done.

The folder appears atomically: everything is written into a temporary folder next to ``out_dir`` and
renamed into place at the end; with ``force`` the old folder is moved aside first and deleted last, so a
failure at any step leaves the user's old folder as it was and no half-written one behind.

Stage files keep the source's tensor names (stages connect by name), ``ir_version`` (raised to 4 for
IR-3 sources, whose initializers must otherwise also be graph inputs), every ``opset_import``, the
model metadata and the local functions the stage calls.
"""

from __future__ import annotations

import errno
import math
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
import onnxruntime as ort
from google.protobuf.message import EncodeError, Message
from onnx import helper, numpy_helper
from onnx.external_data_helper import load_external_data_for_tensor

from onnxpipe.errors import ExportError, UsageError
from onnxpipe.feeds import random_feeds, resolve_input_shapes
from onnxpipe.manifest import (
    MANIFEST_NAME,
    MODEL,
    MODEL_INPUT,
    MODEL_OUTPUT,
    Manifest,
    ModelOutput,
    ModelTensor,
    PlanSummary,
    Schedule,
    ScheduleStep,
    Shape,
    SourceInfo,
    StageEntry,
    StageInput,
    StageOutput,
    StageSchedule,
    write_manifest,
)
from onnxpipe.model import ModelView, NodeInfo, TensorInfo, dtype_name, file_sha256
from onnxpipe.plan import Plan, StageSpec, stream_schedule

EXTERNAL_DATA_MODES = ("auto", "never", "always")
AUTO_EXTERNAL_BYTES = 1_800_000_000
"""``external_data="auto"``: a stage above this size gets a weights side file (protobuf stops at 2 GB)."""
PROTOBUF_LIMIT = 2_000_000_000
EXTERNAL_THRESHOLD = 1024
"""Tensors smaller than this stay inside the ``.onnx`` file even when weights go to a ``.data`` file."""
DEFAULT_MICROBATCHES = 8


def stage_file_name(index: int) -> str:
    return f"stage_{index}.onnx"


def stage_data_name(index: int) -> str:
    return f"stage_{index}.onnx.data"


def export_stages(
    view: ModelView,
    plan: Plan,
    out_dir: str | Path,
    *,
    force: bool = False,
    external_data: str = "auto",
    source_name: str | None = None,
    microbatches: int = DEFAULT_MICROBATCHES,
) -> Manifest:
    """Write ``plan``'s stages of ``view`` and their manifest into ``out_dir``; return the manifest.

    ``external_data``: ``"never"`` keeps weights inside each ``stage_<i>.onnx``; ``"always"`` writes
    each stage's weights to its own ``stage_<i>.onnx.data``; ``"auto"`` does so only for a stage over
    ~1.8 GB or when the source kept its weights in external files.  ``source_name`` is the file name
    recorded for the source (default: the model's file name).  ``microbatches`` sizes the stream
    schedule recorded in the manifest.

    Raises :class:`ExportError` when ``out_dir`` is not empty (without ``force``), when a file cannot
    be written (the old folder is left intact), or when a stage fails the checker or onnxruntime.
    """
    if external_data not in EXTERNAL_DATA_MODES:
        raise UsageError(f"--external-data {external_data!r}: choose one of {', '.join(EXTERNAL_DATA_MODES)}")
    if microbatches < 1:
        raise UsageError(f"microbatches {microbatches}: give a positive number of micro-batches")
    out = Path(out_dir)
    if out.name in ("", ".", ".."):
        out = Path(os.path.abspath(out))  # a folder that can be renamed
    _check_plan(view, plan)
    _check_target(view, out, force)

    created = _make_parents(out.parent)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.onnxpipe-tmp-", dir=out.parent))
    except OSError as e:
        _remove_empty(created)
        raise ExportError(
            f"{out.parent}: cannot create a temporary folder ({_reason(e)}){_hint(e, 'choose another --out')}"
        ) from e
    try:
        writer = _StageWriter(view, plan, tmp, out, external_data)
        entries = [writer.write(spec) for spec in plan.stages]
        manifest = _build_manifest(view, plan, out, entries, writer, source_name, microbatches)
        with _writing(out / MANIFEST_NAME, out):
            write_manifest(tmp / MANIFEST_NAME, manifest)
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(created)
        raise
    return manifest


# --------------------------------------------------------------------------------------------------
# checks before anything is written


def _check_plan(view: ModelView, plan: Plan) -> None:
    where = view.path.name if view.path else "model"
    if plan.model_sha256 != view.sha256:
        raise ExportError(
            f"{where}: the plan was made for another model (sha256 {plan.model_sha256[:12]}..., this "
            f"model {view.sha256[:12]}...); make the plan from this model"
        )
    if not plan.stages:
        raise ExportError(f"{where}: the plan has no stages; make a plan with at least one stage")
    by_name = {n.name: n for n in view.nodes}
    seen: dict[str, int] = {}
    for spec in plan.stages:
        for name in spec.node_names + spec.constant_nodes:
            if name not in by_name:
                raise ExportError(
                    f"{where}: stage {spec.index} names node {name!r}, which the model does not have; "
                    "make the plan from this model"
                )
        for name in spec.node_names:
            if name in seen:
                raise ExportError(
                    f"{where}: node {name!r} is in stage {seen[name]} and in stage {spec.index}; "
                    "each node must be in exactly one stage"
                )
            seen[name] = spec.index
    missing = [n.name for n in view.compute_nodes if n.name not in seen]
    if missing:
        raise ExportError(
            f"{where}: node {missing[0]!r} is in no stage ({len(missing)} nodes unplaced); "
            "make the plan from this model"
        )
    made = {t for s in plan.stages for t in s.outputs} | set(view.inputs)
    for t in view.outputs:
        if t not in made:
            raise ExportError(
                f"{where}: model output {t!r} is produced by no stage; this model cannot be split by "
                "onnxpipe (an output that is an initializer is not supported)"
            )


def _check_target(view: ModelView, out: Path, force: bool) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ExportError(f"{out}: exists and is not a folder; choose another --out")
    if not out.exists():
        return
    if any(out.iterdir()):
        if not force:
            raise ExportError(f"{out}: exists and is not empty; choose another --out or pass --force")
        root = out.resolve()
        for p in (view.path, view.base_dir):
            if p is not None and p.resolve().is_relative_to(root):
                raise ExportError(
                    f"{out}: holds the source model {p.name}; --force would delete it; choose another --out"
                )


def _make_parents(parent: Path) -> list[Path]:
    """Create ``parent`` (and its missing parents); return what was created, deepest first."""
    created: list[Path] = []
    p = parent
    while not p.exists():
        created.append(p)
        p = p.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _remove_empty(created)
        raise ExportError(
            f"{parent}: cannot create the folder ({_reason(e)}){_hint(e, 'choose another --out')}"
        ) from e
    return created


def _remove_empty(folders: Iterable[Path]) -> None:
    for f in folders:
        try:
            f.rmdir()
        except OSError:
            return


def _reason(e: OSError) -> str:
    text = e.strerror or str(e) or type(e).__name__
    return f"{text}: disk full" if e.errno == errno.ENOSPC else text


def _hint(e: OSError, otherwise: str) -> str:
    if e.errno == errno.ENOSPC:
        return "; free some space or choose another --out"
    return f"; {otherwise}" if otherwise else ""


@contextmanager
def _writing(final: Path, out: Path) -> Iterator[None]:
    """Turn an OSError while writing ``final`` into an ExportError that names it."""
    try:
        yield
    except OSError as e:
        raise ExportError(
            f"{final}: cannot be written ({_reason(e)}); {out} is left as it was{_hint(e, '')}"
        ) from e
    except ValueError as e:  # onnx refuses protos over 2 GB with a ValueError
        raise ExportError(f"{final}: cannot be written: {e}") from e


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` is moved aside first and deleted last."""
    if not out.exists():
        with _writing(out, out):
            os.rename(tmp, out)
        return
    old = out.parent / f".{out.name}.onnxpipe-old-{uuid.uuid4().hex[:8]}"
    with _writing(out, out):
        os.rename(out, old)
    try:
        os.rename(tmp, out)
    except OSError as e:
        os.rename(old, out)
        raise ExportError(f"{out}: cannot be replaced ({_reason(e)}); {out} is left as it was") from e
    shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# building and writing one stage


@dataclass(frozen=True)
class _Written:
    spec: StageSpec
    file: str
    sha256: str
    external_data: str | None
    external_data_sha256: str | None
    constant_node_count: int


class _StageWriter:
    """Builds each stage from ``view.proto`` and writes, checks and loads it; remembers boundary types."""

    def __init__(self, view: ModelView, plan: Plan, tmp: Path, out: Path, external_data: str) -> None:
        self.view = view
        self.plan = plan
        self.tmp = tmp
        self.out = out
        self.mode = external_data
        src = view.proto
        self.by_name: dict[str, NodeInfo] = {n.name: n for n in view.nodes}
        self.functions = {(f.domain, f.name, _overload(f)): f for f in src.functions}
        self.value_info = {vi.name: vi for vi in src.graph.value_info}
        self.types: dict[str, TensorInfo] = dict(view.tensors)
        # sequences, maps, optionals: their whole type, as the source or shape inference wrote it
        self.other_types: dict[str, onnx.TypeProto] = {
            vi.name: vi.type
            for vi in [*src.graph.value_info, *src.graph.input, *src.graph.output]
            if vi.type.WhichOneof("value") not in (None, "tensor_type")
        }
        self.source_external = any(_is_external(t) for t in src.graph.initializer) or any(
            _is_external(sp.values) or _is_external(sp.indices) for sp in src.graph.sparse_initializer
        )

    # ----------------------------------------------------------------------------------------------

    def write(self, spec: StageSpec) -> _Written:
        i = spec.index
        self._resolve_output_types(spec)
        model = self.build(spec, weights=True)
        size = _serialized_size(model)
        external = self.mode == "always" or (
            self.mode == "auto" and (self.source_external or size > AUTO_EXTERNAL_BYTES)
        )
        name, data_name = stage_file_name(i), stage_data_name(i)
        path, data_path = self.tmp / name, self.tmp / data_name
        if not external and size > PROTOBUF_LIMIT:
            raise ExportError(
                f"{self.out / name}: stage {i} holds {size / 1e9:.2f} GB, over protobuf's 2 GB limit; "
                "use --external-data auto or always"
            )
        with _writing(self.out / name, self.out):
            if external:
                onnx.save_model(
                    model,
                    str(path),
                    save_as_external_data=True,
                    all_tensors_to_one_file=True,
                    location=data_name,
                    size_threshold=EXTERNAL_THRESHOLD,
                    convert_attribute=False,
                )
            else:
                onnx.save_model(model, str(path))
        del model
        self._check(spec, path)
        with _writing(self.out / name, self.out):
            has_data = data_path.exists()
            return _Written(
                spec=spec,
                file=name,
                sha256=file_sha256(path),
                external_data=data_name if has_data else None,
                external_data_sha256=file_sha256(data_path) if has_data else None,
                constant_node_count=len(spec.constant_nodes),
            )

    def _check(self, spec: StageSpec, path: Path) -> None:
        """The checker and onnxruntime must both accept the written stage."""
        i = spec.index
        try:
            onnx.checker.check_model(str(path))
        except (onnx.checker.ValidationError, ValueError) as e:
            raise ExportError(
                f"{self.out / path.name}: stage {i} fails the ONNX checker{self._node_in(spec, str(e))}: "
                f"{self._first_line(e)}; please report this with the model"
            ) from e
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        options.add_session_config_entry("session.disable_prepacking", "1")  # no second copy of weights
        try:
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as e:
            where = self._node_in(spec, str(e))
            raise ExportError(
                f"{self.out / path.name}: stage {i} does not load in onnxruntime{where}: "
                f"{self._first_line(e)}; check that the model itself loads in onnxruntime, "
                "else please report this with the model"
            ) from e
        del session

    def _first_line(self, e: BaseException) -> str:
        """The error's first line, naming files by where they will be, not the temporary folder."""
        return _first_line(e).replace(str(self.tmp), str(self.out))

    def _node_in(self, spec: StageSpec, message: str) -> str:
        """`` at node 'name'`` for the node an error message is about: by name, else by op type."""
        names = [n for n in spec.node_names + spec.constant_nodes if n and n in message]
        if names:
            return f" at node {max(names, key=len)!r}"
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message))
        for name in spec.node_names:
            info = self.by_name[name]
            if info.op_type in words:
                return f" at node {name!r} ({info.op_type})"
        return ""

    # ----------------------------------------------------------------------------------------------

    def build(
        self, spec: StageSpec, *, weights: bool, untyped: frozenset[str] = frozenset()
    ) -> onnx.ModelProto:
        """The stage as a model; without ``weights`` large initializers keep only dims (for inference)."""
        src = self.view.proto
        model = onnx.ModelProto()
        model.ir_version = max(src.ir_version, 4)
        model.opset_import.extend(src.opset_import)
        model.producer_name = src.producer_name
        model.producer_version = src.producer_version
        model.domain = src.domain
        model.model_version = src.model_version
        model.doc_string = src.doc_string
        model.metadata_props.extend(src.metadata_props)
        graph = model.graph
        graph.name = f"{src.graph.name or 'graph'}_stage{spec.index}"

        reads: dict[str, None] = {}
        for info in self._constants_in_order(spec.constant_nodes):
            if info.op_type == "Shape":
                graph.node.append(self._shape_as_constant(spec, info))
                continue
            graph.node.add().CopyFrom(src.graph.node[info.index])
            reads.update(dict.fromkeys(info.reads))
        produced: set[str] = set()
        for name in spec.node_names:
            info = self.by_name[name]
            graph.node.add().CopyFrom(src.graph.node[info.index])
            reads.update(dict.fromkeys(info.reads))
            produced.update(info.outputs)

        for t in src.graph.initializer:
            if t.name in reads:
                self._copy_tensor(t, graph.initializer.add(), spec, weights)
        for sp in src.graph.sparse_initializer:
            if sp.values.name in reads:
                new = graph.sparse_initializer.add()
                new.dims.extend(sp.dims)
                self._copy_tensor(sp.values, new.values, spec, weights)
                self._copy_tensor(sp.indices, new.indices, spec, weights)

        for t in spec.inputs:
            graph.input.append(self._value_info(t, spec))
        for t in spec.outputs:
            if t in untyped:
                graph.output.append(helper.make_empty_tensor_value_info(t))
            else:
                graph.output.append(self._value_info(t, spec))
        boundary = set(spec.inputs) | set(spec.outputs)
        for t in sorted(produced - boundary):
            vi = self.value_info.get(t)
            if vi is not None:
                graph.value_info.append(vi)

        model.functions.extend(self._functions_used(graph.node))
        return model

    def _constants_in_order(self, names: Iterable[str]) -> list[NodeInfo]:
        """The constant producers in the view's order, each after the constants it reads.

        The view may place a constant producer after its readers (it is copied wherever it is read, so
        its position does not matter to the partition); a graph must list producers first.
        """
        infos = sorted((self.by_name[n] for n in names), key=lambda n: n.position)
        maker = {o: info for info in infos for o in info.outputs}

        def deps(info: NodeInfo) -> list[NodeInfo]:
            if info.op_type == "Shape":  # becomes a Constant: reads nothing
                return []
            return [maker[t] for t in info.reads if t in maker and maker[t] is not info]

        order: list[NodeInfo] = []
        seen: set[str] = set()
        for root in infos:
            stack: list[tuple[NodeInfo, bool]] = [(root, False)]
            while stack:
                info, expanded = stack.pop()
                if expanded:
                    order.append(info)
                    continue
                if info.name in seen:
                    continue
                seen.add(info.name)
                stack.append((info, True))
                stack.extend((d, False) for d in reversed(deps(info)) if d.name not in seen)
        return order

    def _shape_as_constant(self, spec: StageSpec, info: NodeInfo) -> onnx.NodeProto:
        """``Shape`` of a static tensor as a ``Constant`` holding that shape (``start``/``end`` honoured)."""
        proto = self.view.proto.graph.node[info.index]
        shape = self.view.tensor(info.inputs[0]).shape if info.inputs else None
        if shape is None or not all(isinstance(d, int) for d in shape):
            raise ExportError(
                f"stage {spec.index}: node {info.name!r} (Shape) reads {info.inputs[:1]} whose shape is not "
                "static; please report this with the model"
            )
        rank = len(shape)
        start, end = 0, rank
        for attr in proto.attribute:
            if attr.name == "start":
                start = int(attr.i)
            elif attr.name == "end":
                end = int(attr.i)
        start = min(max(start + rank if start < 0 else start, 0), rank)
        end = min(max(end + rank if end < 0 else end, 0), rank)
        value = np.array([int(d) for d in shape[start:end] if isinstance(d, int)], dtype=np.int64)
        return helper.make_node(
            "Constant", [], [proto.output[0]], name=info.name, value=numpy_helper.from_array(value)
        )

    def _copy_tensor(
        self, src: onnx.TensorProto, dst: onnx.TensorProto, spec: StageSpec, weights: bool
    ) -> None:
        if not weights and (_is_external(src) or src.ByteSize() > 1024):
            dst.name = src.name
            dst.data_type = src.data_type
            dst.dims.extend(src.dims)
            return
        dst.CopyFrom(src)
        if _is_external(dst):
            base = self.view.base_dir
            if base is None:
                raise ExportError(
                    f"stage {spec.index}: initializer {src.name!r} is stored in an external file but the "
                    "model's folder is unknown; load the model with onnxpipe.load_model(path)"
                )
            try:
                load_external_data_for_tensor(dst, str(base))
            except (OSError, ValueError) as e:
                raise ExportError(
                    f"{base}: cannot read the external data of initializer {src.name!r} "
                    f"({_first_line(e)}); keep the model's .data file next to it"
                ) from e
            dst.data_location = onnx.TensorProto.DEFAULT
            del dst.external_data[:]

    def _known(self, name: str) -> bool:
        return name in self.other_types or _complete(self.types.get(name))

    def describe(self, name: str) -> tuple[str, Shape]:
        """dtype text and shape of a boundary tensor, for the manifest."""
        other = self.other_types.get(name)
        if other is not None:
            return _type_text(other), None
        info = self.types.get(name) or TensorInfo(name, 0, None)
        return info.dtype, _clean(info.shape)

    def _value_info(self, name: str, spec: StageSpec) -> onnx.ValueInfoProto:
        other = self.other_types.get(name)
        if other is not None:
            vi = onnx.ValueInfoProto(name=name)
            vi.type.CopyFrom(other)
            return vi
        info = self.types.get(name)
        if info is None or info.elem_type == 0 or info.shape is None:
            raise ExportError(
                f"stage {spec.index}: the type or rank of tensor {name!r} at the stage boundary is unknown "
                "(neither ONNX shape inference nor onnxruntime could tell); choose another number of stages"
            )
        return helper.make_tensor_value_info(name, info.elem_type, list(_clean(info.shape) or ()))

    def _functions_used(self, nodes: Iterable[onnx.NodeProto]) -> list[onnx.FunctionProto]:
        """Local functions the nodes call, transitively, in the source's order."""
        used: set[tuple[str, str, str]] = set()
        stack = list(_calls(nodes))
        while stack:
            key = stack.pop()
            f = self.functions.get(key)
            if f is None or key in used:
                continue
            used.add(key)
            stack.extend(_calls(f.node))
        return [f for f in self.view.proto.functions if (f.domain, f.name, _overload(f)) in used]

    # ----------------------------------------------------------------------------------------------

    def _resolve_output_types(self, spec: StageSpec) -> None:
        """Fill in types of boundary tensors that the model's shape inference left unknown.

        Three tries, each only for what the previous left open: ONNX shape inference on the stage alone
        (weights left out); onnxruntime's inference, by opening the stage with those outputs untyped;
        and, where onnxruntime cannot tell a scalar from an unknown rank, one run of the source model
        on random inputs.  What an earlier stage learned serves the later stages that receive it.
        """
        missing = frozenset(t for t in spec.outputs if not self._known(t))
        if missing:
            self._infer_with_onnx(spec, missing)
            missing = frozenset(t for t in missing if not self._known(t))
        if missing:
            unsure_rank = self._infer_with_ort(spec, missing)
            if unsure_rank:
                self._observe_ranks(spec, unsure_rank)

    def _infer_with_onnx(self, spec: StageSpec, missing: frozenset[str]) -> None:
        light = self.build(spec, weights=False, untyped=missing)
        try:
            inferred = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False)
        except Exception:  # noqa: BLE001 - best effort; onnxruntime is asked next
            return
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            if vi.name not in missing:
                continue
            info = _tensor_info(vi)
            if info is not None and _complete(info):
                self.types[vi.name] = info
            elif vi.type.WhichOneof("value") not in (None, "tensor_type"):
                self.other_types[vi.name] = vi.type

    def _infer_with_ort(self, spec: StageSpec, missing: frozenset[str]) -> set[str]:
        """Types onnxruntime infers; returns the tensors it shows as rank 0 (which may mean unknown)."""
        probe = self.build(spec, weights=True, untyped=missing)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        probe_dir = Path(tempfile.mkdtemp(prefix="probe-", dir=self.tmp))
        unsure: set[str] = set()
        try:
            if _serialized_size(probe) < PROTOBUF_LIMIT:
                session = ort.InferenceSession(
                    probe.SerializeToString(), options, providers=["CPUExecutionProvider"]
                )
            else:
                path = probe_dir / "probe.onnx"
                with _writing(self.out / stage_file_name(spec.index), self.out):
                    onnx.save_model(probe, str(path), save_as_external_data=True, location="probe.data")
                session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            for o in session.get_outputs():
                if o.name in missing:
                    info = _from_ort(o.name, o.type, o.shape)
                    if info is not None:
                        self.types[o.name] = info
                        if info.shape == ():
                            unsure.add(o.name)
            del session
        except ExportError:
            raise
        except Exception:  # noqa: BLE001 - the checker and the real load below report the failure
            pass
        finally:
            shutil.rmtree(probe_dir, ignore_errors=True)
        return unsure

    def _observe_ranks(self, spec: StageSpec, names: set[str]) -> None:
        """Run the source model once, with ``names`` as extra outputs, and keep their ranks (dims unknown).

        Skipped for a source with external weights (it would have to be loaded whole); the scalar
        shape onnxruntime reported stays, and the stage checks below say whether it holds.
        """
        src = self.view.proto
        if self.source_external:
            return
        added = [n for n in sorted(names) if n not in {o.name for o in src.graph.output}]
        try:
            for n in added:
                src.graph.output.append(helper.make_empty_tensor_value_info(n))
            data = src.SerializeToString()
        finally:
            del src.graph.output[len(src.graph.output) - len(added) :]
        try:
            shapes = resolve_input_shapes(self.view, self.plan.input_shapes or None)
            feeds = random_feeds(self.view, shapes, seed=0)
            options = ort.SessionOptions()
            options.log_severity_level = 3
            session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
            values = session.run(sorted(names), feeds)
        except Exception:  # noqa: BLE001 - the stage checks report what stays wrong
            return
        for n, v in zip(sorted(names), values, strict=True):
            if isinstance(v, np.ndarray):
                self.types[n] = TensorInfo(n, self.types[n].elem_type, (None,) * v.ndim)


def _serialized_size(model: onnx.ModelProto) -> float:
    """About the bytes of ``model`` serialized; protobuf's ``ByteSize`` fails above 2 GB, so sum the parts.

    ``inf`` when a single part is already too large to measure.
    """
    graph = model.graph
    parts: list[Iterable[Message]] = [
        graph.node,
        graph.initializer,
        graph.sparse_initializer,
        graph.input,
        graph.output,
        graph.value_info,
        model.functions,
    ]
    total = 0
    try:
        for part in parts:
            total += sum(p.ByteSize() for p in part)
    except EncodeError:
        return math.inf
    return float(total)


def _type_text(t: onnx.TypeProto) -> str:
    """``seq(map(int64,tensor(float32)))``: onnxruntime's notation with numpy dtype names."""
    kind = t.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({dtype_name(t.tensor_type.elem_type)})"
    if kind == "sparse_tensor_type":
        return f"sparse_tensor({dtype_name(t.sparse_tensor_type.elem_type)})"
    if kind == "sequence_type":
        return f"seq({_type_text(t.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({_type_text(t.optional_type.elem_type)})"
    if kind == "map_type":
        return f"map({dtype_name(t.map_type.key_type)},{_type_text(t.map_type.value_type)})"
    return "undefined"


def _clean(shape: Shape) -> Shape:
    """Negative dims (``-1``, which some exporters write for "any") as unknown dims."""
    if shape is None:
        return None
    return tuple(None if isinstance(d, int) and d < 0 else d for d in shape)


def _complete(info: TensorInfo | None) -> bool:
    return info is not None and info.elem_type != 0 and info.shape is not None


def _tensor_info(vi: onnx.ValueInfoProto) -> TensorInfo | None:
    if not vi.type.HasField("tensor_type"):
        return None
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return TensorInfo(vi.name, tt.elem_type, None)
    dims: list[int | str | None] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return TensorInfo(vi.name, tt.elem_type, tuple(dims))


def _from_ort(name: str, type_text: str, shape: Sequence[object] | None) -> TensorInfo | None:
    """``tensor(float)`` and onnxruntime's dims -> TensorInfo; ``None`` for non-tensors."""
    if not type_text.startswith("tensor(") or not type_text.endswith(")"):
        return None
    try:
        elem = int(onnx.TensorProto.DataType.Value(type_text[len("tensor(") : -1].upper()))
    except ValueError:
        return None
    dims: list[int | str | None] = []
    for d in shape or ():
        dims.append(d if isinstance(d, int | str) else None)
    return TensorInfo(name, elem, tuple(dims))


def _is_external(t: onnx.TensorProto) -> bool:
    return t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL


def _overload(f: onnx.FunctionProto) -> str:
    return getattr(f, "overload", "")


def _calls(nodes: Iterable[onnx.NodeProto]) -> Iterator[tuple[str, str, str]]:
    """(domain, op_type, overload) of every node, inside subgraph bodies too."""
    for n in nodes:
        yield (n.domain, n.op_type, getattr(n, "overload", ""))
        for attr in n.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _calls(attr.g.node)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _calls(g.node)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# --------------------------------------------------------------------------------------------------
# the manifest


def _build_manifest(
    view: ModelView,
    plan: Plan,
    out: Path,
    written: Sequence[_Written],
    writer: _StageWriter,
    source_name: str | None,
    microbatches: int,
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
    symbols = _profiled_symbols(view, plan.input_shapes)

    def nbytes(name: str) -> int:
        if name in plan.tensor_bytes:
            value = int(plan.tensor_bytes[name])
        else:
            info = writer.types.get(name)
            value = info.nbytes(symbols) if info is not None else 0
        return max(0, value)  # a dim written as -1 ("any") can make a product negative

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
            inputs.append(StageInput(t, *writer.describe(t), nbytes(t), source))
        outputs: list[StageOutput] = []
        for t in s.outputs:
            consumers: list[int | Literal["model_output"]] = [r for r in readers.get(t, []) if r > s.index]
            if t in model_outputs:
                consumers.append(MODEL_OUTPUT)
            outputs.append(StageOutput(t, *writer.describe(t), nbytes(t), tuple(consumers)))
        entries.append(
            StageEntry(
                index=s.index,
                file=w.file,
                sha256=w.sha256,
                external_data=w.external_data,
                external_data_sha256=w.external_data_sha256,
                node_count=len(s.node_names),
                constant_node_count=w.constant_node_count,
                device="cpu",
                inputs=tuple(inputs),
                outputs=tuple(outputs),
                estimated_compute_seconds=s.compute_seconds,
                estimated_transfer_seconds=s.transfer_seconds,
                param_bytes=max(0, s.param_bytes),
                peak_activation_bytes=max(0, s.peak_activation_bytes),
            )
        )

    outs: list[ModelOutput] = []
    for t in view.outputs:
        by: int | Literal["model input"] = producer.get(t, MODEL_INPUT)
        outs.append(ModelOutput(t, *writer.describe(t), by))

    sched = stream_schedule([s.cost_seconds for s in plan.stages], microbatches)
    return Manifest(
        source=_source_info(view, out, source_name),
        model_inputs=tuple(ModelTensor(t, *writer.describe(t)) for t in view.inputs),
        model_outputs=tuple(outs),
        stages=tuple(entries),
        plan=PlanSummary(
            objective=plan.objective,
            k=plan.k,
            bottleneck_seconds=plan.bottleneck_seconds,
            lower_bound_seconds=plan.lower_bound_seconds,
            ratio_to_lower_bound=plan.ratio_to_lower_bound,
            cost_source=plan.cost_source,
            threads=plan.threads,
            bandwidth_bytes_per_s=plan.bandwidth_bytes_per_s,
            profiled_input_shapes={n: tuple(int(d) for d in v) for n, v in plan.input_shapes.items()},
            notes=tuple(plan.notes),
        ),
        schedule=Schedule(
            kind="stream",
            microbatches=sched.microbatches,
            steady_state_throughput_per_s=sched.steady_state_throughput_per_s,
            latency_first_seconds=sched.latency_first_seconds,
            makespan_seconds=sched.makespan_seconds,
            stages=tuple(
                StageSchedule(s, tuple(ScheduleStep(j, a, b) for j, a, b in steps))
                for s, steps in enumerate(sched.steps)
            ),
        ),
    )


def _profiled_symbols(view: ModelView, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    dims: dict[str, int] = {}
    for name, shape in shapes.items():
        declared = view.tensor(name).shape or ()
        for d, v in zip(declared, shape, strict=False):
            if isinstance(d, str):
                dims.setdefault(d, int(v))
    return dims


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
    name = source_name or (view.path.name if view.path is not None else "model.onnx")
    return SourceInfo(file=name, path=path, sha256=view.sha256)


__all__ = [
    "AUTO_EXTERNAL_BYTES",
    "EXTERNAL_DATA_MODES",
    "export_stages",
    "stage_data_name",
    "stage_file_name",
]
