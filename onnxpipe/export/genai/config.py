"""The typed model of a ``genai_config.json``: what the source config says, what the graph says, and the
document written (:class:`GenAIConfig`, whose :meth:`~GenAIConfig.to_json` is the only place it becomes
JSON), with the defaults used where nothing says otherwise."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from onnxpipe.core.model_config import TokenIds

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
