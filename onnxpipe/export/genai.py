"""``genai_config.json``: the split folder as an ONNX Runtime GenAI ``decoder-pipeline``.

ONNX Runtime GenAI runs a decoder LLM split into several ONNX files when its config says
``"type": "decoder-pipeline"`` and lists the files under ``model.decoder.pipeline``, in order, each with
the tensors it takes and makes.  GenAI itself owns the *managed* tensors (token ids, attention mask,
position ids, each layer's past and present key and value, the logits): it feeds each file those of
them its ``inputs`` name and takes those its ``outputs`` name; every other output goes into a store
from which any later file's input of that name is fed.  So a split folder runs in GenAI as it is when:

* each layer's past and present key and value lie in one stage (GenAI feeds a file the cache of the
  layers it lists; ``--layer-cuts on`` guarantees it, and the stages take only their own layers' past);
* the cache names follow one ``%d`` template per role (``past_key_values.%d.key``...), as GenAI finds
  layer ``i``'s tensors by formatting a template, and key and value are separate tensors;
* the model takes nothing GenAI cannot make (ids, mask, positions and the cache only).

The dims GenAI sizes its buffers with come from the graph (head size and key/value heads from the past
tensors' shapes, the vocabulary from the logits, the hidden size from the embedding table), the
context from the plan's ``--max-context`` (and the model's position table, when it has one); what the
graph cannot tell (token ids, sampling defaults) comes from the user's own config when one is given
(``split --genai-config FILE``: a GenAI ``genai_config.json`` or a Hugging Face ``config.json``), else
from documented defaults.  A config given that contradicts the graph (another layer count, head size,
vocabulary) belongs to another model and is refused.

The data model is typed (:class:`GenAIConfig` and its parts, with the defaults used where nothing says
otherwise); JSON appears only at the edges (:func:`onnxpipe.core.model_config.read_source_config` reads,
:meth:`GenAIConfig.to_json` writes).  Top to bottom: the model; what the graph says (the managed tensors'
names, the cache's as ``%d`` templates of the layer, and the dims GenAI sizes its buffers with, read off
a decoder's graph alone; and the refusal of a ``--genai-config`` that describes another model than the
graph); the stages as GenAI's ``decoder.pipeline`` (each stage's file, its tensors and its session
options, from its device) and the whole config put together (written by
:func:`onnxpipe.export.stages.with_decoder_files`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from onnxpipe.cluster.model import Device
from onnxpipe.core.errors import UsageError
from onnxpipe.core.iocontract import Role
from onnxpipe.core.kv import KVPair
from onnxpipe.core.model_config import GENAI_CONFIG_NAME, SourceConfig, TokenIds
from onnxpipe.core.options import opt
from onnxpipe.ir.decoder import DecoderInfo, logits_output
from onnxpipe.ir.decoder_dims import DecoderDims, decoder_dims
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import Manifest, StageEntry

PIPELINE_TYPE = "decoder-pipeline"
"""``model.type`` of a decoder split over several ONNX files."""

DEFAULT_BOS = 1
DEFAULT_EOS = 2
DEFAULT_PAD = 0
"""Token ids written when no config says them: the graph holds no tokenizer.  These are the Llama /
SentencePiece convention (``<s>`` 1, ``</s>`` 2, ``<unk>``/pad 0) that most small decoders share;
another model's real ids come with ``--genai-config`` (its ``config.json`` or ``genai_config.json``)."""

_MULTIMODAL_PARTS = ("embedding", "vision", "speech")
"""The models a multimodal GenAI config names beside its text model (``model.embedding``...), left out of
a split's config: a split of an ``exclude_embeds`` text model joins its embedding model into its first
stage (:mod:`onnxpipe.ir.joined`) and runs as a ``decoder-pipeline`` from the token ids, the text path."""


DEFAULT_SEARCH: Mapping[str, Any] = {
    "do_sample": False,
    "num_beams": 1,
    "num_return_sequences": 1,
    "past_present_share_buffer": False,
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_k": 1,
    "top_p": 1.0,
}
"""``search`` without a source config: greedy decoding, and a cache that grows by concatenation
(``past_present_share_buffer`` needs attention ops that write into a preallocated cache, which an
exporter's plain ``Concat`` does not)."""


# --------------------------------------------------------------------------------------------------
# the data model


@dataclass(frozen=True)
class ConfigDims:
    """The dims written: the graph's, completed by the source config where the graph leaves one open."""

    layers: int
    kv_heads: int
    head_size: int
    vocab_size: int
    hidden_size: int | None


@dataclass(frozen=True)
class TensorNames:
    """The managed tensors' names: GenAI's ``decoder.inputs`` and ``decoder.outputs`` (the cache names as
    ``%d`` templates of the layer index)."""

    input_ids: str
    attention_mask: str | None
    position_ids: str | None
    past_key: str
    past_value: str
    logits: str
    present_key: str
    present_value: str

    def inputs_json(self) -> dict[str, str]:
        """``decoder.inputs`` (the mask and the positions only when the model takes them)."""
        inputs = {"input_ids": self.input_ids}
        if self.attention_mask is not None:
            inputs["attention_mask"] = self.attention_mask
        if self.position_ids is not None:
            inputs["position_ids"] = self.position_ids
        return inputs | {"past_key_names": self.past_key, "past_value_names": self.past_value}

    def outputs_json(self) -> dict[str, str]:
        """``decoder.outputs``."""
        return {
            "logits": self.logits,
            "present_key_names": self.present_key,
            "present_value_names": self.present_value,
        }


@dataclass(frozen=True)
class ProviderOptions:
    """One execution provider of a stage's session, as GenAI names it, with its options."""

    name: str
    options: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SessionOptions:
    """A stage's session options (from its device): threads and execution providers."""

    intra_op_num_threads: int | None = None
    providers: tuple[ProviderOptions, ...] = ()

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"log_id": "onnxruntime-genai"}
        if self.intra_op_num_threads is not None:
            obj["intra_op_num_threads"] = self.intra_op_num_threads
        obj["provider_options"] = [{p.name: dict(p.options)} for p in self.providers]
        return obj


@dataclass(frozen=True)
class PipelineModel:
    """One stage in GenAI's ``decoder.pipeline``.

    ``is_lm_head`` marks a stage that only computes the logits (``--ends own``): GenAI may skip it on
    prompt chunks whose logits nobody reads.  A stage that also holds layers never is one, since skipping
    it would skip those layers' cache.
    """

    model_id: str
    filename: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    run_on_prompt: bool = True
    run_on_token_gen: bool = True
    is_lm_head: bool = False
    session_options: SessionOptions | None = None

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "filename": self.filename,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "run_on_prompt": self.run_on_prompt,
            "run_on_token_gen": self.run_on_token_gen,
            "is_lm_head": self.is_lm_head,
        }
        if self.session_options is not None:
            obj["session_options"] = self.session_options.to_json()
        return {self.model_id: obj}


@dataclass(frozen=True)
class GenAIConfig:
    """A whole ``genai_config.json`` for a split folder.

    ``base`` is the source GenAI config's document (its search options, extra model keys and the
    decoder's session options are kept), empty when there was none.
    """

    dims: ConfigDims
    names: TensorNames
    tokens: TokenIds
    context_length: int
    attention_heads: int | None
    pipeline: tuple[PipelineModel, ...]
    session_options: SessionOptions | None = None
    """The decoder's own session options (GenAI's primary device): set from the devices when every stage
    runs on one provider; None keeps the source's (or GenAI's default, the CPU)."""
    base: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The document GenAI reads: the source's, its model's decoder and ids replaced by the split's."""
        doc = json.loads(json.dumps(dict(self.base)))  # a deep copy of plain JSON
        model = doc.setdefault("model", {})
        for other in _MULTIMODAL_PARTS:  # the split's pipeline takes the token ids: it is the whole model
            model.pop(other, None)
        source_decoder = model.get("decoder", {}) if isinstance(model.get("decoder"), dict) else {}
        model |= {
            "bos_token_id": self.tokens.bos,
            "context_length": self.context_length,
            "decoder": self._decoder_json(source_decoder),
            "eos_token_id": self.tokens.eos[0] if len(self.tokens.eos) == 1 else list(self.tokens.eos),
            "pad_token_id": self.tokens.pad,
            "type": PIPELINE_TYPE,
            "vocab_size": self.dims.vocab_size,
        }
        search = doc.setdefault("search", dict(DEFAULT_SEARCH))
        length = search.get("max_length")
        if not isinstance(length, int) or isinstance(length, bool) or not 0 < length <= self.context_length:
            search["max_length"] = self.context_length  # GenAI refuses a max_length over the context
        return {
            "model": model,
            "search": search,
            **{k: v for k, v in doc.items() if k not in ("model", "search")},
        }

    def _decoder_json(self, source_decoder: Mapping[str, Any]) -> dict[str, Any]:
        """``model.decoder``: the dims, the managed tensors' names and the pipeline; the source decoder's
        session options kept unless the devices set them."""
        decoder: dict[str, Any] = {
            "session_options": (
                self.session_options.to_json()
                if self.session_options is not None
                else source_decoder.get("session_options", SessionOptions().to_json())
            ),
            "head_size": self.dims.head_size,
        }
        if self.dims.hidden_size is not None:
            decoder["hidden_size"] = self.dims.hidden_size
        if self.attention_heads is not None:
            decoder["num_attention_heads"] = self.attention_heads
        return decoder | {
            "num_hidden_layers": self.dims.layers,
            "num_key_value_heads": self.dims.kv_heads,
            "inputs": self.names.inputs_json(),
            "outputs": self.names.outputs_json(),
            "pipeline": [p.to_json() for p in self.pipeline],
        }


@dataclass(frozen=True)
class Unsupported:
    """Why GenAI cannot run this split as it is (the config is then not written, and a note says why)."""

    reason: str


# --------------------------------------------------------------------------------------------------
# what the graph says


def tensor_names(
    ids: str, mask: str | None, positions: str | None, logits: str | None, kv: Sequence[KVPair]
) -> TensorNames | Unsupported:
    """The managed tensors' names, the cache's as ``%d`` templates; :class:`Unsupported` when GenAI's
    naming cannot express them (key and value in one tensor, names that follow no template)."""
    if logits is None:
        return Unsupported("no logits output was found")
    if not kv or any(p.past_value is None or p.present_value is None for p in kv):
        return Unsupported("key and value share one cache tensor per layer; GenAI needs them apart")
    if [p.layer for p in kv] != list(range(len(kv))):
        return Unsupported(
            "its cross-attention cache (an encoder-decoder's) has no place in GenAI's decoder config"
            if any(p.cross for p in kv)
            else "the cache's layers are not numbered 0 to N-1"
        )
    templates: list[str] = []
    for role in ("past_key", "past_value", "present_key", "present_value"):
        template = layer_template([getattr(p, role) for p in kv])
        if template is None:
            first = getattr(kv[0], role)
            return Unsupported(f"the cache names ({first}, ...) follow no single %d pattern of the layer")
        templates.append(template)
    pk, pv, qk, qv = templates
    return TensorNames(ids, mask, positions, pk, pv, logits, qk, qv)


_NUMBER = re.compile(r"(?<!\d)0(?!\d)")


def layer_template(names: Sequence[str]) -> str | None:
    """The ``%d`` template that gives ``names[i]`` for layer ``i`` (``past_key_values.%d.key``), or None.

    Layer 0's name is tried with each standalone ``0`` in turn as the placeholder; a name holding ``%``
    has none (GenAI would read it as a format)."""
    if not names or any("%" in n for n in names):
        return None
    for m in _NUMBER.finditer(names[0]):
        template = names[0][: m.start()] + "%d" + names[0][m.end() :]
        if all(template % i == n for i, n in enumerate(names)):
            return template
    return None


def model_facts(view: ModelView, dec: DecoderInfo) -> tuple[TensorNames, DecoderDims] | Unsupported:
    """The names and dims GenAI needs, from the graph alone (used before profiling to refuse a
    ``--genai-config`` early, and at export).

    The dims are :func:`onnxpipe.ir.decoder_dims.decoder_dims`'s (the cache's heads and head size from the
    past tensors or the attention node that reads them, the vocabulary from the logits or the embedding
    table, the hidden size from the embedding table, the positions from the position or rotary table);
    GenAI sizes its buffers with them, so a graph whose vocabulary neither tells is :class:`Unsupported`.
    """
    if dec.tokens == Role.INPUTS_EMBEDS:
        return Unsupported(
            f"the model takes {dec.ids_input!r}: GenAI feeds it from an embedding model, "
            "which a split's genai_config.json does not name yet"
        )
    logits = logits_output(view, set(dec.present_outputs))
    names = tensor_names(dec.ids_input, dec.mask_input, dec.positions_input, logits, dec.kv)
    if isinstance(names, Unsupported):
        return names
    dims = decoder_dims(view, dec)
    if dims.vocab_size is None:
        return Unsupported(
            f"the vocabulary size is neither the logits' ({names.logits}) last dim nor an embedding's"
        )
    managed = {dec.ids_input, dec.mask_input, dec.positions_input, *dec.past_inputs}
    extra = [t for t in view.inputs if t not in managed]
    if extra:
        return Unsupported(f"the model takes {extra[0]!r}, which GenAI does not feed")
    return names, dims


def check_source_fits(source: SourceConfig, dims: DecoderDims) -> None:
    """Refuse a ``--genai-config`` whose dims contradict the graph's: it describes another model, and GenAI
    would size its buffers wrongly; or whose token ids lie outside the vocabulary (:class:`UsageError`
    naming the file and the field)."""
    contradiction = source.dims.contradicted(dims)
    if contradiction is not None:
        name, stated, shown = contradiction
        raise UsageError(
            f"{source.path}: {name} is {stated}, but the model has {shown}; give this model's own "
            f"config, or leave {opt('genai_config')} out"
        )
    tokens = source.tokens
    if tokens is not None and dims.vocab_size is not None:
        for key, ids in (
            ("bos_token_id", (tokens.bos,)),
            ("eos_token_id", tokens.eos),
            ("pad_token_id", (tokens.pad,)),
        ):
            bad = [t for t in ids if t >= dims.vocab_size]
            if bad:
                raise UsageError(
                    f"{source.path}: {key} {bad[0]} is outside the model's vocabulary of {dims.vocab_size}; "
                    f"give this model's own config, or leave {opt('genai_config')} out"
                )
    for key, seen, said in (
        ("head_size", dims.head_size, source.dims.head_size),
        ("num_key_value_heads", dims.kv_heads, source.dims.kv_heads),
    ):
        if seen is None and said is None:
            raise UsageError(
                f"{source.path}: {key}: missing, and the model's past tensors leave it open; give it in "
                "the config"
            )


# --------------------------------------------------------------------------------------------------
# the whole config


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
