"""The stages as GenAI's ``decoder.pipeline``: each stage's file, its tensors and its session options (from
its device), in order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from onnxpipe.cluster.model import Device
from onnxpipe.core.options import opt
from onnxpipe.export.genai.config import (
    PipelineModel,
    ProviderOptions,
    SessionOptions,
    TensorNames,
    Unsupported,
)
from onnxpipe.manifest import Manifest, StageEntry

_PROVIDERS: Mapping[str, str] = {
    "CUDAExecutionProvider": "cuda",
    "DmlExecutionProvider": "dml",
    "QNNExecutionProvider": "qnn",
    "OpenVINOExecutionProvider": "OpenVINO",
    "WebGpuExecutionProvider": "webgpu",
    "VitisAIExecutionProvider": "VitisAI",
    "NvTensorRTRTXExecutionProvider": "NvTensorRtRtx",
}
"""onnxruntime's execution provider names as GenAI's ``provider_options`` spell them.  The CPU provider is
GenAI's default and gets no entry (GenAI refuses a CPU entry with options)."""


def session_options_of(device: Device) -> SessionOptions | Unsupported:
    """A stage's session options from its device: its threads and its execution provider."""
    e = device.engine
    if not e.kind.genai:
        return Unsupported(f"device {device.name!r} runs {e.kind.name}, which GenAI cannot run")
    if e.kind.takes_openvino_device:
        options = (("device_type", e.openvino_device), *e.openvino_config)
        return SessionOptions(e.threads, (ProviderOptions("OpenVINO", options),))
    if e.provider == "CPUExecutionProvider":
        return SessionOptions(e.threads)
    name = _PROVIDERS.get(e.provider, e.provider.removesuffix("ExecutionProvider"))
    return SessionOptions(e.threads, (ProviderOptions(name, e.provider_options),))


def pipeline_of(manifest: Manifest, names: TensorNames) -> tuple[PipelineModel, ...] | Unsupported:
    """One :class:`PipelineModel` per stage, in order, from the manifest (files, inputs, outputs, devices).

    Refused (:class:`Unsupported`) when one layer's cache is split over two stages, or a stage's device
    runs where GenAI cannot."""
    torn = _torn_cache(manifest)
    if torn is not None:
        return torn
    by_device = {d.name: d for d in manifest.cluster.devices} if manifest.cluster is not None else {}
    models = []
    for s in manifest.stages:
        model = _pipeline_model(s, by_device.get(s.device), names)
        if isinstance(model, Unsupported):
            return model
        models.append(model)
    return tuple(models)


def _torn_cache(manifest: Manifest) -> Unsupported | None:
    """Why GenAI cannot feed the cache when a layer's presents are made in two stages (GenAI feeds a file
    the cache of the layers it lists); None when every layer's cache lies in one stage."""
    io = manifest.plan.decoder.io if manifest.plan.decoder is not None else None
    if io is None:
        return None
    where: dict[int, set[int]] = {}
    for s in manifest.stages:
        made = {o.name for o in s.outputs}
        for r in io.kv:
            if any(t in made for t in r.presents):
                where.setdefault(r.layer, set()).add(s.index)
    torn = sorted(layer for layer, stages in where.items() if len(stages) > 1)
    if not torn:
        return None
    return Unsupported(
        f"layer {torn[0]}'s cache is split over stages {sorted(where[torn[0]])} ({opt('layer_cuts', False)})"
    )


def _pipeline_model(
    stage: StageEntry, device: Device | None, names: TensorNames
) -> PipelineModel | Unsupported:
    """The stage as GenAI runs it, with its device's session options (none without a device)."""
    options: SessionOptions | None = None
    if device is not None:
        found = session_options_of(device)
        if isinstance(found, Unsupported):
            return Unsupported(f"stage {stage.index}'s {found.reason}")
        options = found
    return PipelineModel(
        model_id=f"stage_{stage.index}",
        filename=stage.file,
        inputs=tuple(i.name for i in stage.inputs),
        outputs=tuple(o.name for o in stage.outputs),
        is_lm_head=_only_head(stage, names),
        session_options=options,
    )


def _only_head(stage: StageEntry, names: TensorNames) -> bool:
    """Whether the stage makes the logits and holds no layer (nothing but the LM head, ``--ends own``)."""
    makes_logits = any(o.name == names.logits for o in stage.outputs)
    return makes_logits and not stage.kv_layers


def primary_options(pipeline: Sequence[PipelineModel]) -> SessionOptions | None:
    """The decoder's own session options when every stage runs on one execution provider: GenAI keeps the
    managed tensors (cache, logits) on that device.  With stages on different providers (or the CPU) the
    primary device stays the CPU, which every stage can read from."""
    providers = {p.session_options.providers if p.session_options else None for p in pipeline}
    if len(providers) != 1:
        return None
    (only,) = providers
    if not only:
        return None
    return SessionOptions(providers=only)
