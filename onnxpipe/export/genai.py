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

The data model is typed (:class:`GenAIConfig` and its parts); JSON appears only at the edges
(:func:`read_source_config` reads, :meth:`GenAIConfig.to_json` writes).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from onnxpipe.cluster.model import Device, option_text
from onnxpipe.core.choices import Runtime
from onnxpipe.core.errors import UsageError
from onnxpipe.core.jsonread import Document, Fields, Value
from onnxpipe.core.options import opt
from onnxpipe.ir.decoder import DecoderInfo
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import Manifest, StageEntry

GENAI_CONFIG_NAME = "genai_config.json"
"""The file GenAI's ``og.Model(folder)`` reads."""

PIPELINE_TYPE = "decoder-pipeline"
"""``model.type`` of a decoder split over several ONNX files."""

DEFAULT_BOS = 1
DEFAULT_EOS = 2
DEFAULT_PAD = 0
"""Token ids written when no config says them: the graph holds no tokenizer.  These are the Llama /
SentencePiece convention (``<s>`` 1, ``</s>`` 2, ``<unk>``/pad 0) that most small decoders share;
another model's real ids come with ``--genai-config`` (its ``config.json`` or ``genai_config.json``)."""

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

_ADVICE = (
    f"give the model's genai_config.json or Hugging Face config.json, or leave {opt('genai_config')} out"
)

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


# --------------------------------------------------------------------------------------------------
# the data model


class SourceKind(StrEnum):
    """What ``--genai-config`` held."""

    GENAI = "genai"
    """An ONNX Runtime GenAI ``genai_config.json`` (its ``model.decoder`` is replaced, the rest kept)."""
    HF = "hf"
    """A Hugging Face ``config.json`` (token ids, head counts and context are taken from it)."""


@dataclass(frozen=True)
class TokenIds:
    """The special tokens GenAI stops at (``eos``, several allowed) and pads with."""

    bos: int
    eos: tuple[int, ...]
    pad: int


@dataclass(frozen=True)
class SourceConfig:
    """What ``--genai-config FILE`` says: the dims it states (checked against the graph), the token ids,
    the context, and for a GenAI config the whole document (kept but for its decoder)."""

    path: Path
    kind: SourceKind
    tokens: TokenIds | None = None
    layers: int | None = None
    kv_heads: int | None = None
    head_size: int | None = None
    attention_heads: int | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    context_length: int | None = None
    document: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GraphDims:
    """What the graph tells GenAI: layer count, the past tensors' head count and size, the vocabulary
    (logits' last dim), the hidden size and the position table's rows (``None`` where the graph does
    not say: a symbolic dim, as GenAI's builder names the head size ``kv_cache_dim``; no embedding table
    found; no position table)."""

    layers: int
    kv_heads: int | None
    head_size: int | None
    vocab_size: int
    hidden_size: int | None
    position_rows: int | None
    attention_heads: int | None = None
    """The query heads an attention op that reads the cache states (``num_heads``), when there is one."""


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
        """The document GenAI reads."""
        doc = json.loads(json.dumps(dict(self.base)))  # a deep copy of plain JSON
        model = doc.setdefault("model", {})
        source_decoder = model.get("decoder", {}) if isinstance(model.get("decoder"), dict) else {}
        names = self.names
        inputs: dict[str, str] = {"input_ids": names.input_ids}
        if names.attention_mask is not None:
            inputs["attention_mask"] = names.attention_mask
        if names.position_ids is not None:
            inputs["position_ids"] = names.position_ids
        inputs["past_key_names"] = names.past_key
        inputs["past_value_names"] = names.past_value
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
        decoder |= {
            "num_hidden_layers": self.dims.layers,
            "num_key_value_heads": self.dims.kv_heads,
            "inputs": inputs,
            "outputs": {
                "logits": names.logits,
                "present_key_names": names.present_key,
                "present_value_names": names.present_value,
            },
            "pipeline": [p.to_json() for p in self.pipeline],
        }
        model |= {
            "bos_token_id": self.tokens.bos,
            "context_length": self.context_length,
            "decoder": decoder,
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


@dataclass(frozen=True)
class Unsupported:
    """Why GenAI cannot run this split as it is (the config is then not written, and a note says why)."""

    reason: str


class _KV(Protocol):
    """One layer's cache names: :class:`onnxpipe.ir.decoder.KVPair` and the manifest's ``KVRecord``."""

    @property
    def layer(self) -> int: ...
    @property
    def past_key(self) -> str: ...
    @property
    def past_value(self) -> str | None: ...
    @property
    def present_key(self) -> str: ...
    @property
    def present_value(self) -> str | None: ...


# --------------------------------------------------------------------------------------------------
# reading --genai-config


def read_source_config(path: str | Path) -> SourceConfig:
    """Read ``--genai-config FILE``: a GenAI ``genai_config.json`` (an object with ``model.decoder``) or a
    Hugging Face ``config.json`` (an object with ``model_type``, ``architectures`` or ``vocab_size``).

    Raises :class:`UsageError` (one line naming the file) for a missing or unreadable file, text that is
    not JSON, or JSON that is neither kind of decoder config.
    """
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{p}: no such file ({opt('genai_config')}); {_ADVICE}")
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{p}: cannot be read ({e}); {_ADVICE}") from e
    except json.JSONDecodeError as e:
        raise UsageError(
            f"{p}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); {_ADVICE}"
        ) from e
    doc = Document(str(p), UsageError, _ADVICE)
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        return _read_genai(p, doc.read(obj).fields())
    if isinstance(obj, dict) and any(k in obj for k in ("model_type", "architectures", "vocab_size")):
        return _read_hf(p, doc.read(obj).fields())
    raise UsageError(
        f"{p}: not a decoder config (expected a genai_config.json with model.decoder, or a Hugging Face "
        f"config.json with model_type); {_ADVICE}"
    )


def _opt_int(f: Fields, *keys: str, minimum: int = 1) -> int | None:
    """The first of ``keys`` present and not null, as an integer ``>= minimum``."""
    for key in keys:
        if f.raw.get(key) is not None:
            return f[key].integer(minimum)
    return None


def _token_list(v: Value) -> tuple[int, ...]:
    if isinstance(v.raw, list):
        ids = v.list_of(lambda x: x.integer(0))
        if not ids:
            raise v.expected("a token id or a non-empty list of them")
        return ids
    return (v.integer(0, expected="a token id (an integer >= 0) or a list of them"),)


def _tokens(f: Fields) -> TokenIds | None:
    """Token ids from an object holding ``eos_token_id`` (and maybe ``bos``/``pad``); None without eos."""
    if f.raw.get("eos_token_id") is None:
        return None
    eos = _token_list(f["eos_token_id"])
    bos = _opt_int(f, "bos_token_id", minimum=0)
    pad = _opt_int(f, "pad_token_id", minimum=0)
    return TokenIds(bos=eos[0] if bos is None else bos, eos=eos, pad=eos[0] if pad is None else pad)


def _read_genai(path: Path, top: Fields) -> SourceConfig:
    model = top["model"].fields()
    if not isinstance(model.raw.get("decoder"), dict):
        raise UsageError(
            f"{path}: model.decoder: missing; this genai_config.json is not a decoder's; {_ADVICE}"
        )
    dec = model["decoder"].fields()
    return SourceConfig(
        path=path,
        kind=SourceKind.GENAI,
        tokens=_tokens(model),
        layers=_opt_int(dec, "num_hidden_layers"),
        kv_heads=_opt_int(dec, "num_key_value_heads"),
        head_size=_opt_int(dec, "head_size"),
        attention_heads=_opt_int(dec, "num_attention_heads"),
        hidden_size=_opt_int(dec, "hidden_size"),
        vocab_size=_opt_int(model, "vocab_size"),
        context_length=_opt_int(model, "context_length"),
        document=top.raw,
    )


def _read_hf(path: Path, f: Fields) -> SourceConfig:
    heads = _opt_int(f, "num_attention_heads", "n_head")
    hidden = _opt_int(f, "hidden_size", "n_embd", "d_model")
    head_size = _opt_int(f, "head_dim")
    if head_size is None and heads is not None and hidden is not None and hidden % heads == 0:
        head_size = hidden // heads
    return SourceConfig(
        path=path,
        kind=SourceKind.HF,
        tokens=_tokens(f),
        layers=_opt_int(f, "num_hidden_layers", "n_layer", "num_layers"),
        kv_heads=_opt_int(f, "num_key_value_heads", "num_attention_heads", "n_head"),
        head_size=head_size,
        attention_heads=heads,
        hidden_size=hidden,
        vocab_size=_opt_int(f, "vocab_size"),
        context_length=_opt_int(f, "max_position_embeddings", "n_positions", "n_ctx"),
    )


# --------------------------------------------------------------------------------------------------
# what the graph says


def logits_output(view: ModelView, dec: DecoderInfo) -> str | None:
    """The logits: the output named so, else the one floating-point output that is no cache."""
    presents = set(dec.present_outputs)
    others = [t for t in view.outputs if t not in presents]
    named = [t for t in others if "logits" in t.lower()]
    if len(named) == 1:
        return named[0]
    floats = [t for t in others if view.tensor(t).elem_type in (1, 10, 11, 16)]
    return floats[0] if len(floats) == 1 else None


def tensor_names(
    ids: str, mask: str | None, positions: str | None, logits: str | None, kv: Sequence[_KV]
) -> TensorNames | Unsupported:
    """The managed tensors' names, the cache's as ``%d`` templates; :class:`Unsupported` when GenAI's
    naming cannot express them (key and value in one tensor, names that follow no template)."""
    if logits is None:
        return Unsupported("no logits output was found")
    if not kv or any(p.past_value is None or p.present_value is None for p in kv):
        return Unsupported("key and value share one cache tensor per layer; GenAI needs them apart")
    if [p.layer for p in kv] != list(range(len(kv))):
        return Unsupported("the cache's layers are not numbered 0 to N-1")
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


def graph_dims(view: ModelView, dec: DecoderInfo, logits: str) -> GraphDims | Unsupported:
    """Head count and size from the past key (``[batch, kv_heads, past, head_size]``), the vocabulary from
    the logits' last dim (else the embedding table's rows), the hidden size from the embedding table
    (``[vocab, hidden]``, read by a ``Gather`` of the token ids), the position table's rows (another
    ``[rows, hidden]`` table the embedding reads: GPT-2's ``wpe``) that bound the context."""
    shape = view.tensor(dec.kv[0].past_key).shape
    if shape is None or len(shape) != 4:
        return Unsupported(f"the past key {dec.kv[0].past_key} is not [batch, heads, past, head size]")
    kv_heads = shape[1] if isinstance(shape[1], int) else None
    head_size = shape[3] if isinstance(shape[3], int) else None
    heads, attention_kv_heads = _attention_heads(view, dec.kv[0].past_key)
    kv_heads = kv_heads or attention_kv_heads
    tables = _embedding_tables(view, dec)
    out = view.tensor(logits).shape
    vocab = out[-1] if out and isinstance(out[-1], int) else None
    if vocab is None:
        vocab = max((rows for rows, _ in tables), default=None)
    if vocab is None:
        return Unsupported(
            f"the vocabulary size is neither the logits' ({logits}) last dim nor an embedding's"
        )
    hidden = next((cols for rows, cols in tables if rows == vocab), None)
    positions = [rows for rows, cols in tables if rows != vocab and (hidden is None or cols == hidden)]
    positions += _rotary_rows(view, dec.kv[0].past_key)
    if head_size is None and heads is not None and hidden is not None and hidden % heads == 0:
        head_size = hidden // heads  # the usual layout: the query heads split the hidden size
    return GraphDims(
        layers=dec.layers,
        kv_heads=kv_heads,
        head_size=head_size,
        vocab_size=vocab,
        hidden_size=hidden,
        position_rows=min(positions) if positions else None,
        attention_heads=heads,
    )


_ROTARY_CACHE_INPUT = 7
"""``GroupQueryAttention``'s ``cos_cache`` input: a ``[positions, rotary dim / 2]`` table."""


def _rotary_rows(view: ModelView, past: str) -> list[int]:
    """The positions of the rotary table a ``GroupQueryAttention`` reading ``past`` takes (GenAI's builder
    gives it ``max_position_embeddings`` rows): positions past it have no angles."""
    rows = []
    for pos in view.consumers.get(past, ()):
        proto = view.proto.graph.node[view.nodes[pos].index]  # by position: with its empty inputs
        if proto.op_type == "GroupQueryAttention" and len(proto.input) > _ROTARY_CACHE_INPUT:
            table = proto.input[_ROTARY_CACHE_INPUT]
            shape = view.tensor(table).shape if table in view.weights else None
            if shape and isinstance(shape[0], int):
                rows.append(shape[0])
    return rows


_HEAD_ATTRIBUTES = (("num_heads", "q_num_heads"), ("kv_num_heads",))


def _attention_heads(view: ModelView, past: str) -> tuple[int | None, int | None]:
    """(query heads, key/value heads) from the attribute of an attention op that reads ``past``
    (onnxruntime's ``GroupQueryAttention``/``MultiHeadAttention``, ONNX's ``Attention``), where the
    past's shape leaves them open (GenAI's builder names the head size ``kv_cache_dim``)."""
    for pos in view.consumers.get(past, ()):
        proto = view.proto.graph.node[view.nodes[pos].index]
        found = {a.name: int(a.i) for a in proto.attribute if a.type == a.INT}
        query, kv = (next((found[k] for k in keys if found.get(k, 0) > 0), None) for keys in _HEAD_ATTRIBUTES)
        if query is not None:
            return query, kv or query
    return None, None


def _embedding_tables(view: ModelView, dec: DecoderInfo) -> list[tuple[int, int]]:
    """(rows, columns) of each 2-D weight a ``Gather`` of the embedding reads as its table."""
    tables = []
    by_name = view.node_by_name
    for name in dec.embedding_nodes:
        node = by_name[name]
        if node.op_type != "Gather" or not node.inputs or node.inputs[0] not in view.weights:
            continue
        shape = view.tensor(node.inputs[0]).shape
        if shape is not None and len(shape) == 2 and all(isinstance(d, int) for d in shape):
            rows, cols = shape
            assert isinstance(rows, int) and isinstance(cols, int)
            tables.append((rows, cols))
    return tables


def check_source_fits(source: SourceConfig, dims: GraphDims) -> None:
    """Refuse a ``--genai-config`` whose dims contradict the graph's: it describes another model, and GenAI
    would size its buffers wrongly; or whose token ids lie outside the vocabulary (:class:`UsageError`
    naming the file and the field)."""
    checks = (
        ("num_hidden_layers", source.layers, dims.layers, "layers"),
        ("num_key_value_heads", source.kv_heads, dims.kv_heads, "key/value heads in its past tensors"),
        ("head_size", source.head_size, dims.head_size, "head size in its past tensors"),
        ("vocab_size", source.vocab_size, dims.vocab_size, "vocabulary"),
        ("hidden_size", source.hidden_size, dims.hidden_size, "hidden size"),
    )
    for key, said, seen, what in checks:
        if said is not None and seen is not None and said != seen:
            raise UsageError(
                f"{source.path}: {key} is {said}, but the model has {seen} {what}; give this model's own "
                f"config, or leave {opt('genai_config')} out"
            )
    tokens = source.tokens
    if tokens is not None:
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
        ("head_size", dims.head_size, source.head_size),
        ("num_key_value_heads", dims.kv_heads, source.kv_heads),
    ):
        if seen is None and said is None:
            raise UsageError(
                f"{source.path}: {key}: missing, and the model's past tensors leave it open; give it in "
                "the config"
            )


def model_facts(view: ModelView, dec: DecoderInfo) -> tuple[TensorNames, GraphDims] | Unsupported:
    """The names and dims GenAI needs, from the graph alone (used before profiling to refuse a
    ``--genai-config`` early, and at export)."""
    logits = logits_output(view, dec)
    names = tensor_names(dec.ids_input, dec.mask_input, dec.positions_input, logits, dec.kv)
    if isinstance(names, Unsupported):
        return names
    dims = graph_dims(view, dec, names.logits)
    if isinstance(dims, Unsupported):
        return dims
    managed = {dec.ids_input, dec.mask_input, dec.positions_input, *dec.past_inputs}
    extra = [t for t in view.inputs if t not in managed]
    if extra:
        return Unsupported(f"the model takes {extra[0]!r}, which GenAI does not feed")
    return names, dims


# --------------------------------------------------------------------------------------------------
# the pipeline


def session_options_of(device: Device) -> SessionOptions | Unsupported:
    """A stage's session options from its device: its threads and its execution provider."""
    if device.runtime == Runtime.TRACT:
        return Unsupported(f"device {device.name!r} runs tract, which GenAI cannot run")
    if device.runtime == Runtime.OPENVINO:
        config = tuple((k, option_text(v)) for k, v in device.openvino_config.items())
        options = (("device_type", device.openvino_device), *config)
        return SessionOptions(device.threads, (ProviderOptions("OpenVINO", options),))
    if device.provider == "CPUExecutionProvider":
        return SessionOptions(device.threads)
    name = _PROVIDERS.get(device.provider, device.provider.removesuffix("ExecutionProvider"))
    options = tuple((k, option_text(v)) for k, v in device.provider_options.items())
    return SessionOptions(device.threads, (ProviderOptions(name, options),))


def pipeline_of(manifest: Manifest, names: TensorNames) -> tuple[PipelineModel, ...] | Unsupported:
    """One :class:`PipelineModel` per stage, in order, from the manifest (files, inputs, outputs, devices).

    Refused (:class:`Unsupported`) when one layer's cache is split over two stages, or a stage's device
    runs where GenAI cannot."""
    by_device = {d.name: d for d in manifest.cluster.devices} if manifest.cluster is not None else {}
    io = manifest.plan.decoder.io if manifest.plan.decoder is not None else None
    if io is not None:
        where: dict[int, set[int]] = {}
        for s in manifest.stages:
            made = {o.name for o in s.outputs}
            for r in io.kv:
                if any(t in made for t in r.presents):
                    where.setdefault(r.layer, set()).add(s.index)
        torn = sorted(layer for layer, stages in where.items() if len(stages) > 1)
        if torn:
            return Unsupported(
                f"layer {torn[0]}'s cache is split over stages {sorted(where[torn[0]])} "
                f"({opt('layer_cuts', False)})"
            )
    models = []
    for s in manifest.stages:
        options: SessionOptions | None = None
        device = by_device.get(s.device)
        if device is not None:
            found = session_options_of(device)
            if isinstance(found, Unsupported):
                return Unsupported(f"stage {s.index}'s {found.reason}")
            options = found
        models.append(
            PipelineModel(
                model_id=f"stage_{s.index}",
                filename=s.file,
                inputs=tuple(i.name for i in s.inputs),
                outputs=tuple(o.name for o in s.outputs),
                is_lm_head=_only_head(s, names),
                session_options=options,
            )
        )
    return tuple(models)


def _only_head(stage: StageEntry, names: TensorNames) -> bool:
    """Whether the stage makes the logits and holds no layer (nothing but the LM head, ``--ends own``)."""
    makes_logits = any(o.name == names.logits for o in stage.outputs)
    return makes_logits and not stage.kv_layers


def _primary(pipeline: Sequence[PipelineModel]) -> SessionOptions | None:
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
    names, dims = facts
    if source is not None:
        check_source_fits(source, dims)
    head_size = dims.head_size or (source.head_size if source is not None else None)
    kv_heads = dims.kv_heads or (source.kv_heads if source is not None else None)
    if head_size is None or kv_heads is None:
        return Unsupported(
            f"the past tensors' head count or head size is symbolic (give {opt('genai_config')})"
        )
    pipeline = pipeline_of(manifest, names)
    if isinstance(pipeline, Unsupported):
        return pipeline
    limits = [manifest.plan.decoder.max_context] if manifest.plan.decoder is not None else []
    for limit in (source.context_length if source else None, dims.position_rows):
        if limit is not None:
            limits.append(limit)
    if not limits:
        return Unsupported(f"no context length is known (give {opt('genai_config')})")
    tokens = source.tokens if source is not None and source.tokens is not None else None
    if tokens is None:
        tokens = TokenIds(DEFAULT_BOS, (DEFAULT_EOS,), DEFAULT_PAD)
    if max(tokens.bos, *tokens.eos, tokens.pad) >= dims.vocab_size:  # a given config's were checked
        return Unsupported(f"the default token ids lie outside the vocabulary of {dims.vocab_size}")
    heads = source.attention_heads if source is not None else None
    heads = heads or dims.attention_heads
    if heads is None and dims.hidden_size is not None and dims.hidden_size % head_size == 0:
        heads = dims.hidden_size // head_size
    return GenAIConfig(
        dims=ConfigDims(dims.layers, kv_heads, head_size, dims.vocab_size, dims.hidden_size),
        names=names,
        tokens=tokens,
        context_length=min(limits),
        attention_heads=heads,
        pipeline=pipeline,
        session_options=_primary(pipeline) if manifest.cluster is not None else None,
        base=source.document if source is not None else {},
    )


def write_genai_config(config: GenAIConfig, path: Path) -> None:
    """Write ``config`` as JSON (GenAI's parser takes plain JSON, 4-space indent as its builder writes)."""
    path.write_text(json.dumps(config.to_json(), indent=4) + "\n", encoding="utf-8")


def describe_written(config: GenAIConfig, source: SourceConfig | None) -> str:
    """The plan note that says the config was written, and where its token ids came from."""
    if source is not None and source.tokens is not None:
        origin = f"token ids from {source.path.name}"
    else:
        origin = (
            f"default token ids bos {DEFAULT_BOS}, eos {DEFAULT_EOS}, pad {DEFAULT_PAD}: give "
            f"{opt('genai_config')} with the model's config.json for its own"
        )
    return (
        f"{GENAI_CONFIG_NAME}: an ONNX Runtime GenAI decoder-pipeline of {len(config.pipeline)} stages, "
        f"context {config.context_length} ({origin})"
    )


__all__ = [
    "DEFAULT_BOS",
    "DEFAULT_EOS",
    "DEFAULT_PAD",
    "GENAI_CONFIG_NAME",
    "ConfigDims",
    "GenAIConfig",
    "GraphDims",
    "PipelineModel",
    "ProviderOptions",
    "SessionOptions",
    "SourceConfig",
    "SourceKind",
    "TensorNames",
    "TokenIds",
    "Unsupported",
    "check_source_fits",
    "describe_written",
    "genai_config",
    "graph_dims",
    "layer_template",
    "model_facts",
    "pipeline_of",
    "read_source_config",
    "session_options_of",
    "tensor_names",
    "write_genai_config",
]
