"""A Triton Inference Server model repository from a split folder: one model per stage and an ensemble.

Why: Triton serves a pipeline of models as an *ensemble* whose steps name, for each composing model,
which ensemble tensor feeds each input (``input_map``) and which each output becomes (``output_map``).
The manifest already says all of it (the boundary contract: dtypes, shapes, batch axes, which stage
makes what), so the repository is written from the manifest alone:

    REPO/<name>/config.pbtxt                 the ensemble (platform "ensemble"), the model's inputs/outputs
    REPO/<name>_stage<i>/config.pbtxt        a stage: platform "onnxruntime_onnx", or backend "openvino"
    REPO/<name>_stage<i>/1/model.onnx        the stage file (and its weights file, under its own name)

``max_batch_size``: when every model input, model output and boundary tensor has its batch axis at 0
(``batch_axis`` in the manifest), Triton may batch requests: the dims listed leave that axis out and
``max_batch_size`` is the given one; else 0 and the full dims.  A dim that is not fixed is ``-1``.

Each config is checked before the repository counts as written: parsed with tritonclient's own
``ModelConfig`` protobuf (``pip install 'onnxpipe[triton]'``; without it only the next check runs), and
a data-flow check over the ensemble (every step input produced by the ensemble's inputs or an earlier
step, with the same dtype; every ensemble output produced exactly once).  No Triton server runs here:
what the checks cannot tell (a backend's own limits) shows when a server loads the repository.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from onnxpipe.core.choices import TritonPlatform
from onnxpipe.core.errors import ExportError, UsageError
from onnxpipe.core.options import opt
from onnxpipe.core.runtime_kinds import RuntimeKind
from onnxpipe.core.text import names_text
from onnxpipe.export.options import TritonOptions
from onnxpipe.export.outdir import normalized, staged_folder, writing
from onnxpipe.manifest import Manifest, load_manifest

TRITON_TYPES = {
    "float32": "TYPE_FP32", "float16": "TYPE_FP16", "float64": "TYPE_FP64", "bfloat16": "TYPE_BF16",
    "int64": "TYPE_INT64", "int32": "TYPE_INT32", "int16": "TYPE_INT16", "int8": "TYPE_INT8",
    "uint64": "TYPE_UINT64", "uint32": "TYPE_UINT32", "uint16": "TYPE_UINT16", "uint8": "TYPE_UINT8",
    "bool": "TYPE_BOOL", "object": "TYPE_STRING", "str": "TYPE_STRING",
}  # fmt: skip
"""numpy dtype names (as the manifest writes them) -> Triton's data types."""


@dataclass(frozen=True)
class TritonTensor:
    name: str
    data_type: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class TritonStep:
    """One ensemble step: the composing model, and stage tensor name -> ensemble tensor name maps."""

    model: str
    input_map: tuple[tuple[str, str], ...]
    output_map: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class TritonModel:
    """One ``config.pbtxt``: a stage (``backend``/``platform`` set) or the ensemble (``steps`` set)."""

    name: str
    platform: str | None
    backend: str | None
    max_batch_size: int
    inputs: tuple[TritonTensor, ...]
    outputs: tuple[TritonTensor, ...]
    instance_kind: str | None = None
    default_model_filename: str | None = None
    steps: tuple[TritonStep, ...] = ()

    def to_pbtxt(self) -> str:
        lines = [f"name: {_q(self.name)}"]
        for key in ("platform", "backend", "default_model_filename"):
            if getattr(self, key) is not None:
                lines.append(f"{key}: {_q(getattr(self, key))}")
        lines.append(f"max_batch_size: {self.max_batch_size}")
        for kind, tensors in (("input", self.inputs), ("output", self.outputs)):
            for t in tensors:
                dims = ", ".join(str(d) for d in t.dims)
                lines.append(
                    f"{kind} {{\n  name: {_q(t.name)}\n  data_type: {t.data_type}\n  dims: [ {dims} ]\n}}"
                )
        if self.instance_kind is not None:
            lines.append(f"instance_group {{\n  count: 1\n  kind: {self.instance_kind}\n}}")
        if self.steps:
            lines.append("ensemble_scheduling {")
            for step in self.steps:
                lines.append(f"  step {{\n    model_name: {_q(step.model)}\n    model_version: -1")
                for key, value in step.input_map:
                    lines.append(f"    input_map {{ key: {_q(key)} value: {_q(value)} }}")
                for key, value in step.output_map:
                    lines.append(f"    output_map {{ key: {_q(key)} value: {_q(value)} }}")
                lines.append("  }")
            lines.append("}")
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class TritonRepository:
    """What :func:`export_triton` wrote: the folder, the ensemble's name, every model's config, and
    whether the configs were also parsed with tritonclient's protobuf."""

    path: Path
    ensemble: str
    models: tuple[TritonModel, ...]
    parsed: bool
    notes: tuple[str, ...] = ()
    """What the repository does otherwise than the split asks: a batch it cannot batch, a runtime Triton
    has no backend for."""


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def model_name_of(manifest: Manifest) -> str:
    """The ensemble's name: the source's file stem, with what Triton's folder names cannot hold as ``_``."""
    stem = Path(manifest.source.file).stem or "model"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem)


def export_triton(folder: str | Path, options: TritonOptions) -> TritonRepository:
    """Write the Triton model repository for the split in ``folder`` into ``options.out`` (see the module
    docstring and :class:`~onnxpipe.export.options.TritonOptions`).  Raises :class:`UsageError` for bad
    options, :class:`ExportError` for a folder that cannot be written or a repository that fails its
    checks."""
    if options.max_batch_size < 1:
        raise UsageError(f"{opt('max_batch_size', options.max_batch_size)}: give a positive number")
    src = Path(folder)
    manifest = load_manifest(src)
    ensemble = options.name or model_name_of(manifest)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", ensemble):
        raise UsageError(f"{opt('name', ensemble)}: use letters, digits, '_', '.' and '-' only")
    target = normalized(options.out)
    _check_target(target, options.force)
    models = plan_repository(manifest, ensemble, options.platform, options.max_batch_size)
    pb = model_config_module()
    with staged_folder(target, replaceable=_check_repository) as tmp:
        for st, model in zip(manifest.stages, models[1:], strict=True):
            version = tmp / model.name / "1"
            version.mkdir(parents=True)
            with writing(target / model.name / "1" / "model.onnx", target):
                shutil.copyfile(src / st.file, version / "model.onnx")
                if st.external_data is not None:  # the stage file names it: it keeps its name
                    shutil.copyfile(src / st.external_data, version / st.external_data)
        for model in models:
            text = model.to_pbtxt()
            if pb is not None:
                parse_config(pb, text, target / model.name / "config.pbtxt")
            (tmp / model.name).mkdir(exist_ok=True)
            with writing(target / model.name / "config.pbtxt", target):
                (tmp / model.name / "config.pbtxt").write_text(text, encoding="utf-8")
        check_data_flow(models[0], models[1:])
    notes = repository_notes(manifest, options.platform, options.max_batch_size)
    return TritonRepository(target, ensemble, tuple(models), parsed=pb is not None, notes=notes)


def plan_repository(
    manifest: Manifest, ensemble: str, platform: TritonPlatform, max_batch_size: int
) -> list[TritonModel]:
    """The ensemble's config first, then one per stage (nothing written)."""
    batched = not _unbatched(manifest)
    batch = max_batch_size if batched else 0
    passthrough = [o.name for o in manifest.model_outputs if not isinstance(o.produced_by, int)]
    if passthrough:
        raise ExportError(
            f"model output {passthrough[0]!r} is a model input passed through, which a Triton ensemble "
            "cannot map; split a model whose outputs are computed"
        )

    def tensor(name: str, dtype: str, shape: Sequence[object] | None) -> TritonTensor:
        kind = TRITON_TYPES.get(dtype)
        if kind is None:
            raise ExportError(f"tensor {name!r} has dtype {dtype}, which Triton has no type for")
        if shape is None:
            raise ExportError(
                f"tensor {name!r} has no known rank; Triton needs its dims (split it with "
                f"{opt('static', True)})"
            )
        dims = [d if isinstance(d, int) else -1 for d in shape]
        return TritonTensor(name, kind, tuple(dims[1:] if batched else dims))

    stages: list[TritonModel] = []
    steps: list[TritonStep] = []
    kinds = _stage_kinds(manifest)
    for st in manifest.stages:
        model = f"{ensemble}_stage{st.index}"
        # the backend of the stage's runtime, else onnxruntime's, which also serves a runtime Triton has no
        # backend for (tract)
        own = kinds[st.index].triton_backend if st.index in kinds else None
        runtime = (own or "onnxruntime") if platform == TritonPlatform.AUTO else platform.value
        gpu = st.device.lower().startswith(("cuda", "gpu"))
        stages.append(
            TritonModel(
                name=model,
                platform="onnxruntime_onnx" if runtime != "openvino" else None,
                backend="openvino" if runtime == "openvino" else None,
                default_model_filename="model.onnx" if runtime == "openvino" else None,
                max_batch_size=batch,
                inputs=tuple(tensor(t.name, t.dtype, t.shape) for t in st.inputs),
                outputs=tuple(tensor(t.name, t.dtype, t.shape) for t in st.outputs),
                instance_kind="KIND_GPU" if gpu and runtime != "openvino" else "KIND_CPU",
            )
        )
        steps.append(
            TritonStep(
                model=model,
                input_map=tuple((t.name, t.name) for t in st.inputs),
                output_map=tuple((t.name, t.name) for t in st.outputs),
            )
        )
    top = TritonModel(
        name=ensemble,
        platform="ensemble",
        backend=None,
        max_batch_size=batch,
        inputs=tuple(tensor(t.name, t.dtype, t.shape) for t in manifest.model_inputs),
        outputs=tuple(tensor(t.name, t.dtype, t.shape) for t in manifest.model_outputs),
        steps=tuple(steps),
    )
    return [top, *stages]


def repository_notes(manifest: Manifest, platform: TritonPlatform, max_batch_size: int) -> tuple[str, ...]:
    """Why the configs say ``max_batch_size: 0`` (the tensors that carry no batch at axis 0), and which
    stages a runtime without a Triton backend (tract) leaves to onnxruntime."""
    notes: list[str] = []
    unbatched = _unbatched(manifest)
    if unbatched:
        where = names_text([repr(n) for n in unbatched], 3)
        notes.append(
            f"max_batch_size 0 instead of {max_batch_size}: {where} "
            f"carr{'ies' if len(unbatched) == 1 else 'y'} "
            "no batch at axis 0, so Triton cannot batch requests; the configs list every dim"
        )
    if platform == TritonPlatform.AUTO:
        unserved = {i: kind.name for i, kind in _stage_kinds(manifest).items() if kind.triton_backend is None}
        for name in dict.fromkeys(unserved.values()):
            listed = [str(i) for i, n in unserved.items() if n == name]
            notes.append(
                f"stage(s) {', '.join(listed)} run on {name} in the split, which Triton has no backend "
                "for: onnxruntime_onnx serves them"
            )
    return tuple(notes)


def _unbatched(manifest: Manifest) -> list[str]:
    """The tensors (model inputs and outputs, boundary tensors) that carry no batch at axis 0, sorted."""
    tensors = [*manifest.model_inputs, *manifest.model_outputs]
    tensors += [t for st in manifest.stages for t in (*st.inputs, *st.outputs)]
    return sorted({t.name for t in tensors if t.batch_axis != 0})


def _stage_kinds(manifest: Manifest) -> dict[int, RuntimeKind]:
    """Each stage's runtime, that of its device in the manifest's cluster (the devices file's); none for a
    split made without devices."""
    devices = manifest.cluster.devices if manifest.cluster is not None else ()
    kinds = {d.name: d.engine.kind for d in devices}
    return {st.index: kinds[st.device] for st in manifest.stages if st.device in kinds}


def check_data_flow(ensemble: TritonModel, stages: Sequence[TritonModel]) -> None:
    """Every step input is an ensemble input or an earlier step's output, of the dtype the consuming
    model declares; every ensemble output comes from exactly one step, of its declared dtype; step maps
    name only the composing model's own inputs and outputs."""
    by_name = {m.name: m for m in stages}
    types = {t.name: t.data_type for t in ensemble.inputs}
    made: set[str] = set()
    for i, step in enumerate(ensemble.steps):
        model = by_name.get(step.model)
        if model is None:
            raise ExportError(f"ensemble step {i} names model {step.model!r}, which the repository lacks")
        own_in = {t.name: t.data_type for t in model.inputs}
        own_out = {t.name: t.data_type for t in model.outputs}
        if {k for k, _ in step.input_map} != set(own_in):
            raise ExportError(f"ensemble step {i} ({step.model}) does not map exactly the model's inputs")
        for key, value in step.input_map:
            if value not in types:
                raise ExportError(
                    f"ensemble step {i} ({step.model}) reads {value!r}, which nothing before it makes"
                )
            if types[value] != own_in[key]:
                raise ExportError(
                    f"ensemble step {i} ({step.model}) reads {value!r} as {own_in[key]}, "
                    f"made as {types[value]}"
                )
        for key, value in step.output_map:
            if key not in own_out:
                raise ExportError(f"ensemble step {i} ({step.model}) maps {key!r}, not one of its outputs")
            if value in types:
                raise ExportError(f"ensemble tensor {value!r} is made twice (again by step {i})")
            types[value] = own_out[key]
            made.add(value)
    for t in ensemble.outputs:
        if t.name not in made:
            raise ExportError(f"ensemble output {t.name!r} is made by no step")
        if types[t.name] != t.data_type:
            raise ExportError(
                f"ensemble output {t.name!r} is declared {t.data_type}, made as {types[t.name]}"
            )


def _check_target(out: Path, force: bool) -> None:
    """An absent or empty folder; with ``force`` also an earlier repository (each subfolder a model)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ExportError(f"{out}: exists and is not a folder; choose another {opt('TritonOptions.out')}")
    if not out.exists() or not any(out.iterdir()):
        return
    if not force:
        raise ExportError(
            f"{out}: exists and is not empty; choose another {opt('TritonOptions.out')} or pass "
            f"{opt('TritonOptions.force', True)}"
        )
    _check_repository(out)


def _check_repository(out: Path) -> None:
    """Refuse to replace a folder that is not an earlier repository (each subfolder a model)."""
    if not all(p.is_dir() and (p / "config.pbtxt").is_file() for p in out.iterdir()):
        raise ExportError(
            f"{out}: is not empty and is not a Triton repository (a config.pbtxt in every folder); "
            f"{opt('TritonOptions.force', True)} replaces only an earlier repository; choose another "
            f"{opt('TritonOptions.out')}"
        )


def model_config_module() -> ModuleType | None:
    """tritonclient's ``model_config_pb2``, loaded by its file: importing ``tritonclient.grpc`` needs
    grpc, which a client that only reads configs does not; None when tritonclient is not installed."""
    spec = importlib.util.find_spec("tritonclient")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "grpc" / "model_config_pb2.py"
        if path.is_file():
            loader_spec = importlib.util.spec_from_file_location("_onnxpipe_triton_model_config_pb2", path)
            if loader_spec is None or loader_spec.loader is None:
                return None
            module = importlib.util.module_from_spec(loader_spec)
            try:
                loader_spec.loader.exec_module(module)
            except Exception:  # noqa: BLE001 - a tritonclient whose protobuf does not load: no parse check
                return None
            return module
    return None


def parse_config(pb: ModuleType, text: str, where: Path | str = "config.pbtxt") -> Any:
    """``text`` parsed into tritonclient's ``ModelConfig``; one that does not parse is an
    :class:`ExportError` naming ``where`` (the file it is written to)."""
    from google.protobuf import text_format

    try:
        return text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as e:
        raise ExportError(f"{where}: Triton's model config does not parse ({e}); please report this") from e


__all__ = [
    "TritonModel",
    "TritonPlatform",
    "TritonRepository",
    "TritonStep",
    "TritonTensor",
    "check_data_flow",
    "export_triton",
    "model_config_module",
    "parse_config",
    "plan_repository",
]
