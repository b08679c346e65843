"""Write a :class:`~onnxpipe.plan.Plan` as one valid ONNX file per stage, plus ``manifest.json``.

One pass over the already loaded model (:mod:`onnxpipe.stagebuild` copies each stage out of
``view.proto``; :mod:`onnxpipe.boundary` settles the types of the tensors between stages).  A stage
written with external data (``always``; ``auto`` for a source whose weights are in external files, or a
stage over ~1.8 GB) gets its weights copied into its own ``.data`` file in chunks, straight from the
source's files (:mod:`onnxpipe.weightfile`): memory holds the graph, whatever the size of the model.  An
inline stage is built with its weights and released before the next, so memory holds the graph plus
one stage.  Each stage is checked with ``onnx.checker`` and opened in onnxruntime before the export
counts as done.

The folder appears atomically (:mod:`onnxpipe.outdir`): a failure at any step leaves the user's old
folder as it was and no half-written one behind.

What export refuses, before writing anything (:func:`check_exportable`): a model with ``training_info``
(a training algorithm bound to the weights cannot be split across stages), an opset the installed
onnxruntime cannot run, an output folder that is not empty (without ``force``) or holds the source.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn

import onnx
import onnxruntime as ort
from onnx import helper

from onnxpipe.boundary import BoundaryTypes
from onnxpipe.core.errors import ExportError, ModelLoadError, UsageError, error_line
from onnxpipe.core.files import file_sha256
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.ir.external import is_external
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import (
    MANIFEST_NAME,
    MODEL,
    MODEL_INPUT,
    MODEL_OUTPUT,
    DeviceRecord,
    Manifest,
    ModelOutput,
    ModelTensor,
    PlanSummary,
    SameValue,
    SourceInfo,
    StageEntry,
    StageInput,
    StageOutput,
    write_manifest,
)
from onnxpipe.outdir import check_target, normalized, staged_folder, writing
from onnxpipe.plan.types import Plan, StageSpec
from onnxpipe.schedule.simulate import simulate
from onnxpipe.stagebuild import StageBuilder
from onnxpipe.weightfile import externalize

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
    be written (the old folder is left intact), or when a stage fails the checker or onnxruntime;
    :class:`ModelLoadError` for an opset onnxruntime cannot run (see :func:`check_exportable`).
    """
    if external_data not in EXTERNAL_DATA_MODES:
        raise UsageError(f"--external-data {external_data!r}: choose one of {', '.join(EXTERNAL_DATA_MODES)}")
    if microbatches < 1:
        raise UsageError(f"microbatches {microbatches}: give a positive number of micro-batches")
    out = normalized(out_dir)
    _check_plan(view, plan)
    check_exportable(view, out, force=force)
    specs = plan.stages
    with staged_folder(out, last=MANIFEST_NAME) as tmp:
        writer = _StageWriter(view, plan, tmp, out, external_data)
        writer.check_sizes(specs)
        written = [writer.write(spec) for spec in specs]
        shared = shared_weights(view, [writer.builder.weights_of(s) for s in specs])
        manifest = _build_manifest(view, plan, out, written, writer.types, shared, source_name, microbatches)
        with writing(out / MANIFEST_NAME, out):
            write_manifest(tmp / MANIFEST_NAME, manifest)
    return manifest


# --------------------------------------------------------------------------------------------------
# checks before anything is written


def check_exportable(view: ModelView, out_dir: str | Path | None = None, *, force: bool = False) -> None:
    """Refuse early what :func:`export_stages` would refuse after profiling and partitioning.

    A model with ``training_info`` (:class:`ExportError`); an opset or IR version the installed
    onnxruntime cannot run (:class:`ModelLoadError`); with ``out_dir``, an output folder that exists and
    is not empty (without ``force``) or that holds the source model (:class:`ExportError`).  Cheap: it
    reads no weights and opens onnxruntime on a one-node model.
    """
    where = _where(view)
    if len(view.proto.training_info):
        raise ExportError(
            f"{where}: carries training_info ({len(view.proto.training_info)} training algorithm(s) bound to "
            "its weights), which cannot be split across stages; save the model without it "
            "(del model.training_info[:]) and split that"
        )
    check_runtime_opsets(view)
    if out_dir is not None:
        check_target(normalized(out_dir), force=force, protected=(view.path, view.base_dir))


_OPSET_TOO_NEW = re.compile(r"Opset (\d+) is under development.*domain (\S+) is till opset (\d+)")


def check_runtime_opsets(view: ModelView) -> None:
    """Raise :class:`ModelLoadError` when onnxruntime refuses the model's opset imports or IR version.

    Opens a one-node model with the same imports and IR version, so nothing of the model is read.
    """
    src = view.proto
    probe = onnx.ModelProto()
    probe.ir_version = max(src.ir_version, 4)
    probe.opset_import.extend(src.opset_import)
    if not any(o.domain in ("", "ai.onnx") for o in src.opset_import):
        probe.opset_import.append(helper.make_opsetid("", 1))
    probe.graph.CopyFrom(
        helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "opset_probe",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        )
    )
    options = session_options(level="ORT_DISABLE_ALL", log_severity=4)
    try:
        open_session(probe.SerializeToString(), options)
    except Exception as e:
        text = str(e)
        too_new = _OPSET_TOO_NEW.search(text)
        where = _where(view)
        if too_new:
            version, domain, newest = too_new.groups()
            raise ModelLoadError(
                f"{where}: opset {version} of domain {domain} is newer than onnxruntime {ort.__version__} "
                f"runs (up to {newest}); re-export the model at opset {newest} or lower, or upgrade "
                "onnxruntime"
            ) from e
        imports = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in src.opset_import)
        raise ModelLoadError(
            f"{where}: onnxruntime {ort.__version__} cannot run a model with IR version {src.ir_version} "
            f"and opsets {imports} ({error_line(e)}); re-export the model for this onnxruntime or "
            "upgrade onnxruntime"
        ) from e


def _where(view: ModelView) -> str:
    return str(view.path) if view.path is not None else "model"


def _check_plan(view: ModelView, plan: Plan) -> None:
    specs = plan.stages
    where = view.path.name if view.path else "model"
    if plan.model_sha256 != view.sha256:
        raise ExportError(
            f"{where}: the plan was made for another model (sha256 {plan.model_sha256[:12]}..., this "
            f"model {view.sha256[:12]}...); make the plan from this model"
        )
    if not specs:
        raise ExportError(f"{where}: the plan has no stages; make a plan with at least one stage")
    by_name = view.node_by_name
    seen: dict[str, int] = {}
    for spec in specs:
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
        if not set(spec.skipped_nodes) <= set(spec.node_names):
            raise ExportError(
                f"{where}: stage {spec.index} skips a node it does not hold; make the plan from this model"
            )
        made = set(spec.inputs) | {t for n in spec.file_node_names for t in by_name[n].outputs}
        for alias in spec.aliases:
            if alias.same_as not in made:
                raise ExportError(
                    f"{where}: stage {spec.index} remakes {alias.name!r} from {alias.same_as!r}, which it "
                    "neither receives nor makes; make the plan from this model"
                )
    missing = [n.name for n in view.compute_nodes if n.name not in seen]
    if missing:
        raise ExportError(
            f"{where}: node {missing[0]!r} is in no stage ({len(missing)} nodes unplaced); "
            "make the plan from this model"
        )
    made = {t for s in specs for t in s.outputs} | set(view.inputs)
    for t in view.outputs:
        if t not in made:
            raise ExportError(
                f"{where}: model output {t!r} is produced by no stage; the plan is inconsistent with the "
                "model; make the plan from this model"
            )


# --------------------------------------------------------------------------------------------------
# writing and checking one stage


@dataclass(frozen=True)
class _Written:
    spec: StageSpec
    file: str
    sha256: str
    external_data: str | None
    external_data_sha256: str | None
    constant_node_count: int


class _StageWriter:
    """Builds, writes, checks and hashes each stage in turn; remembers the boundary types it learns."""

    def __init__(self, view: ModelView, plan: Plan, tmp: Path, out: Path, external_data: str) -> None:
        self.view = view
        self.plan = plan
        self.tmp = tmp
        self.out = out
        self.mode = external_data
        self.types = BoundaryTypes(view)
        self.builder = StageBuilder(view, self.types)
        src = view.proto.graph
        self.source_external = any(is_external(t) for t in src.initializer) or any(
            is_external(sp.values) or is_external(sp.indices) for sp in src.sparse_initializer
        )

    def _build(self, spec: StageSpec, weights: bool, untyped: frozenset[str]) -> onnx.ModelProto:
        return self.builder.build(spec, weights=weights, untyped=untyped, keep_external=True)

    def check_sizes(self, specs: Sequence[StageSpec]) -> None:
        """With ``external_data="never"``, refuse a stage whose weights alone pass protobuf's limit
        before any weight is read."""
        if self.mode != "never":
            return
        for spec in specs:
            size = sum(self.view.initializers.get(t, 0) for t in self.builder.weights_of(spec))
            if size > PROTOBUF_LIMIT:
                self._too_big(spec.index, size)

    def _too_big(self, i: int, size: float) -> NoReturn:
        raise ExportError(
            f"{self.out / stage_file_name(i)}: stage {i} holds {size / 1e9:.2f} GB, over protobuf's 2 GB "
            "limit; use --external-data auto or always"
        )

    def stage_bytes(self, spec: StageSpec) -> int:
        """About the bytes of the stage file with its weights inside, from dims: no weight is read."""
        weights = sum(self.view.initializers.get(t, 0) for t in self.builder.weights_of(spec))
        nodes = self.view.proto.graph.node
        names = spec.file_node_names + spec.constant_nodes
        return weights + sum(int(nodes[self.builder.by_name[n].index].ByteSize()) for n in names)

    def write(self, spec: StageSpec) -> _Written:
        """Build, write, check and hash one stage.

        With external data the stage's weights go straight from the source (its external files, or the
        loaded model) into the stage's own ``.data`` file (:mod:`onnxpipe.weightfile`); the model proto
        never holds them.  Inline, the stage is built with its weights and saved as one file.
        """
        i = spec.index
        self.types.resolve(
            spec, self._build, self.tmp, self.plan.input_shapes, can_run_source=not self.source_external
        )
        size = self.stage_bytes(spec)
        external = self.mode == "always" or (
            self.mode == "auto" and (self.source_external or size > AUTO_EXTERNAL_BYTES)
        )
        if not external and size > PROTOBUF_LIMIT:
            self._too_big(i, size)
        name, data_name = stage_file_name(i), stage_data_name(i)
        path, data_path = self.tmp / name, self.tmp / data_name
        model = self.builder.build(spec, weights=True, keep_external=external)
        data_sha: str | None = None
        if external:
            with writing(self.out / data_name, self.out):
                data_sha = externalize(model, data_path, self.view.base_dir, EXTERNAL_THRESHOLD)
        with writing(self.out / name, self.out):
            onnx.save_model(model, str(path))
        del model
        self._check(spec, path)
        with writing(self.out / name, self.out):
            return _Written(
                spec=spec,
                file=name,
                sha256=file_sha256(path),
                external_data=data_name if data_sha is not None else None,
                external_data_sha256=data_sha,
                constant_node_count=len(spec.constant_nodes),
            )

    def _check(self, spec: StageSpec, path: Path) -> None:
        """The checker and onnxruntime must both accept the written stage.

        onnxruntime opens it without graph optimizations: loading resolves every kernel and type, which
        is what can fail; optimizing a 100,000-node graph would cost several times as long, and
        ``onnxpipe verify`` runs the stages at deployment settings anyway.
        """
        i = spec.index
        try:
            onnx.checker.check_model(str(path))
        except (onnx.checker.ValidationError, ValueError) as e:
            raise ExportError(
                f"{self.out / path.name}: stage {i} fails the ONNX checker{self._node_in(spec, str(e))}: "
                f"{self._error_line(e)}; please report this with the model"
            ) from e
        options = session_options(
            level="ORT_DISABLE_ALL",
            threads=1,
            config={"session.disable_prepacking": "1"},  # no second copy of weights
        )

        def does_not_load(e: Exception) -> ExportError:
            return ExportError(
                f"{self.out / path.name}: stage {i} does not load in onnxruntime{self._node_in(spec, str(e))}"
                f": {self._error_line(e)}; check that the model itself loads in onnxruntime, "
                "else please report this with the model"
            )

        session = open_session(path, options, fail=does_not_load)
        del session

    def _error_line(self, e: BaseException) -> str:
        """The error's first line, naming files by where they will be, not the temporary folder."""
        return error_line(e).replace(str(self.tmp), str(self.out))

    def _node_in(self, spec: StageSpec, message: str) -> str:
        """`` at node 'name'`` for the node an error message is about: by name, else by op type."""
        names = [n for n in spec.node_names + spec.constant_nodes if n and n in message]
        if names:
            return f" at node {max(names, key=len)!r}"
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message))
        for name in spec.node_names:
            info = self.builder.by_name[name]
            if info.op_type in words:
                return f" at node {name!r} ({info.op_type})"
        return ""


# --------------------------------------------------------------------------------------------------
# shared weights


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


# --------------------------------------------------------------------------------------------------
# the manifest


def _build_manifest(
    view: ModelView,
    plan: Plan,
    out: Path,
    written: Sequence[_Written],
    types: BoundaryTypes,
    shared: SharedWeights,
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
            info = types.types.get(name)
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
            inputs.append(StageInput(t, *types.describe(t), nbytes(t), source))
        outputs: list[StageOutput] = []
        for t in s.outputs:
            consumers: list[int | Literal["model_output"]] = [r for r in readers.get(t, []) if r > s.index]
            if t in model_outputs:
                consumers.append(MODEL_OUTPUT)
            outputs.append(StageOutput(t, *types.describe(t), nbytes(t), tuple(consumers)))
        entries.append(
            StageEntry(
                index=s.index,
                file=w.file,
                sha256=w.sha256,
                external_data=w.external_data,
                external_data_sha256=w.external_data_sha256,
                node_count=len(s.file_node_names),
                skipped_node_count=len(s.skipped_nodes),
                same_values=tuple(SameValue(a.name, a.same_as) for a in s.aliases if a.same_as in s.inputs),
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
            )
        )

    outs: list[ModelOutput] = []
    for t in view.outputs:
        by: int | Literal["model_input"] = producer.get(t, MODEL_INPUT)
        outs.append(ModelOutput(t, *types.describe(t), by))

    shared_workers = [s.index % plan.workers for s in plan.stages] if plan.workers is not None else None
    timeline = plan.timeline or simulate(
        "stream", [s.cost_seconds for s in plan.stages], None, [0.0] * plan.k, microbatches, shared_workers
    )
    return Manifest(
        source=_source_info(view, out, source_name),
        model_inputs=tuple(ModelTensor(t, *types.describe(t)) for t in view.inputs),
        model_outputs=tuple(outs),
        stages=tuple(entries),
        cluster=plan.cluster,
        device_costs=tuple(DeviceRecord(d.device, d.method, d.source) for d in plan.device_costs),
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
            duplicated_param_bytes=shared.duplicated,
            workers=plan.workers,
            time_slack=plan.time_slack,
            reference_seconds=plan.reference_seconds,
        ),
        schedule=timeline,
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
    "SharedWeights",
    "check_exportable",
    "check_runtime_opsets",
    "export_stages",
    "shared_weights",
    "stage_data_name",
    "stage_file_name",
]
