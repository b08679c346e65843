"""The whole ``genai_config.json`` of a written split: the graph's names and dims, the source config's ids
and context, the manifest's stages as GenAI's ``decoder.pipeline`` (each stage's file, its tensors and its
session options, from its device), put together (:mod:`onnxpipe.export.model_files` writes it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from onnxpipe.cluster.model import Device
from onnxpipe.core.model_config import GENAI_CONFIG_NAME, SourceConfig, TokenIds
from onnxpipe.core.options import opt
from onnxpipe.export.genai.config import (
    DEFAULT_BOS,
    DEFAULT_EOS,
    DEFAULT_PAD,
    ConfigDims,
    GenAIConfig,
    PipelineModel,
    ProviderOptions,
    SessionOptions,
    TensorNames,
    Unsupported,
)
from onnxpipe.export.genai.graph import check_source_fits, model_facts
from onnxpipe.ir.decoder import DecoderInfo
from onnxpipe.ir.decoder_dims import DecoderDims
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import Manifest, StageEntry


def genai_config(
    view: ModelView, dec: DecoderInfo, manifest: Manifest, source: SourceConfig | None = None
) -> GenAIConfig | Unsupported:
    """The ``genai_config.json`` of a written split of the decoder ``view``, or why GenAI cannot run it.

    The context is the smallest of the plan's ``max_context`` (the KV memory was checked for it), the
    source config's context, and the model's position table.  Token ids come from the source config, else
    :data:`DEFAULT_BOS`, :data:`DEFAULT_EOS`, :data:`DEFAULT_PAD`.
    """
    facts = model_facts(view, dec)
    if isinstance(facts, Unsupported):
        return facts
    names, graph = facts
    if source is not None:
        check_source_fits(source, graph)
    dims = _written_dims(graph, source)
    if isinstance(dims, Unsupported):
        return dims
    pipeline = pipeline_of(manifest, names)
    if isinstance(pipeline, Unsupported):
        return pipeline
    context = _context_length(manifest, graph, source)
    if context is None:
        return Unsupported(f"no context length is known (give {opt('genai_config')})")
    tokens = _token_ids(source)
    if max(tokens.bos, *tokens.eos, tokens.pad) >= dims.vocab_size:  # a given config's were checked
        return Unsupported(f"the default token ids lie outside the vocabulary of {dims.vocab_size}")
    return GenAIConfig(
        dims=dims,
        names=names,
        tokens=tokens,
        context_length=context,
        attention_heads=_attention_heads(dims, graph, source),
        pipeline=pipeline,
        session_options=primary_options(pipeline) if manifest.cluster is not None else None,
        base=source.document if source is not None else {},
    )


def _written_dims(graph: DecoderDims, source: SourceConfig | None) -> ConfigDims | Unsupported:
    """The graph's dims, the head count and size taken from the source config where the past tensors leave
    them symbolic."""
    head_size = graph.head_size or (source.dims.head_size if source is not None else None)
    kv_heads = graph.kv_heads or (source.dims.kv_heads if source is not None else None)
    if head_size is None or kv_heads is None:
        return Unsupported(
            f"the past tensors' head count or head size is symbolic (give {opt('genai_config')})"
        )
    assert graph.vocab_size is not None  # model_facts refused a graph that does not say it
    return ConfigDims(graph.layers, kv_heads, head_size, graph.vocab_size, graph.hidden_size)


def _context_length(manifest: Manifest, graph: DecoderDims, source: SourceConfig | None) -> int | None:
    """The smallest context any of the plan, the source config and the position table allows; None when
    none says one."""
    planned = manifest.plan.decoder.max_context if manifest.plan.decoder is not None else None
    limits = (planned, source.context_length if source else None, graph.position_rows)
    return min((n for n in limits if n is not None), default=None)


def _token_ids(source: SourceConfig | None) -> TokenIds:
    """The source config's token ids, else the defaults."""
    if source is not None and source.tokens is not None:
        return source.tokens
    return TokenIds(DEFAULT_BOS, (DEFAULT_EOS,), DEFAULT_PAD)


def _attention_heads(dims: ConfigDims, graph: DecoderDims, source: SourceConfig | None) -> int | None:
    """The query heads: the source config's, else an attention op's, else the hidden size over the head
    size (the usual layout); None when nothing tells."""
    heads = source.dims.attention_heads if source is not None else None
    heads = heads or graph.attention_heads
    if heads is None and dims.hidden_size is not None and dims.hidden_size % dims.head_size == 0:
        heads = dims.hidden_size // dims.head_size
    return heads


def describe_written(config: GenAIConfig, source: SourceConfig | None) -> str:
    """The plan note that says the config was written, and where its token ids came from (the model's
    config, or the defaults: said so, with what to give for the model's own)."""
    defaults = f"default token ids bos {DEFAULT_BOS}, eos {DEFAULT_EOS}, pad {DEFAULT_PAD}"
    if source is not None and source.tokens is not None:
        origin = f"token ids from {source.path.name}"
    elif source is not None:
        origin = f"{defaults}: {source.path.name} states none"
    else:
        origin = f"{defaults}: give {opt('genai_config')} with the model's config.json for its own"
    return (
        f"{GENAI_CONFIG_NAME}: an ONNX Runtime GenAI decoder-pipeline of {len(config.pipeline)} stages, "
        f"context {config.context_length} ({origin})"
    )


# --------------------------------------------------------------------------------------------------
# the stages as GenAI's pipeline


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
    return not stage.kv_layers and any(o.name == names.logits for o in stage.outputs)


def primary_options(pipeline: Sequence[PipelineModel]) -> SessionOptions | None:
    """The decoder's own session options when every stage runs on one execution provider: GenAI keeps the
    managed tensors (cache, logits) on that device.  With stages on different providers (or the CPU) the
    primary device stays the CPU, which every stage can read from."""
    providers = {p.session_options.providers if p.session_options else None for p in pipeline}
    only = providers.pop() if len(providers) == 1 else None
    return SessionOptions(providers=only) if only else None
