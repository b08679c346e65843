"""A decoder's own config: a GenAI ``genai_config.json`` or a Hugging Face ``config.json``, read into one
typed record (:class:`SourceConfig`), whether the user names it (``split --genai-config FILE``) or it lies
beside the model (:func:`config_beside`).

Why on the ground floor: the planner counts the KV cache at the model's own context, the exporter writes
GenAI's config from it, and a generator checks its limits against it; none may need onnx for that.  The
dims it states are checked against the graph by whoever has the graph (a config of another model is
refused when named, and set aside with a note when it merely lies beside the model).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from onnxpipe.core.errors import UsageError
from onnxpipe.core.jsonread import Document, Fields, Value
from onnxpipe.core.options import opt
from onnxpipe.core.tokenizer_files import folder_place, looked_in, model_folders

GENAI_CONFIG_NAME = "genai_config.json"
"""The file GenAI's ``og.Model(folder)`` reads, and its model builder writes beside the model."""

HF_CONFIG_NAME = "config.json"
"""A Hugging Face model folder's config."""

GENERATION_CONFIG_NAME = "generation_config.json"
"""A Hugging Face folder's generation defaults: the end-of-sequence ids generation stops at (often more
than ``config.json`` says: a chat model's end-of-turn token)."""

_ADVICE = (
    f"give the model's genai_config.json or Hugging Face config.json, or leave {opt('genai_config')} out"
)


class SourceKind(StrEnum):
    """What a model's config file is."""

    GENAI = "genai"
    """An ONNX Runtime GenAI ``genai_config.json`` (its ``model.decoder`` is replaced, the rest kept)."""
    HF = "hf"
    """A Hugging Face ``config.json`` (token ids, head counts and context are taken from it)."""


@dataclass(frozen=True)
class TokenIds:
    """The special tokens: the start of a sequence, those that end one (several allowed), the padding."""

    bos: int
    eos: tuple[int, ...]
    pad: int


@dataclass(frozen=True)
class ModelDims:
    """A decoder's sizes as its config states them (:class:`SourceConfig`) or its graph shows them
    (:class:`onnxpipe.ir.decoder_dims.DecoderDims`); None where it does not say."""

    layers: int | None = None
    kv_heads: int | None = None
    head_size: int | None = None
    attention_heads: int | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None

    def contradicted(self, seen: ModelDims) -> tuple[str, int, int] | None:
        """The first size stated here that ``seen`` (the graph's) says otherwise, as (its config key,
        stated, seen): the config of another model; None when they agree where both say."""
        pairs = (
            ("num_hidden_layers", self.layers, seen.layers),
            ("num_key_value_heads", self.kv_heads, seen.kv_heads),
            ("head_size", self.head_size, seen.head_size),
            ("vocab_size", self.vocab_size, seen.vocab_size),
            ("hidden_size", self.hidden_size, seen.hidden_size),
        )
        return next(((k, a, b) for k, a, b in pairs if a is not None and b is not None and a != b), None)


@dataclass(frozen=True)
class SourceConfig:
    """What a model's config says: the dims it states (checked against the graph), the token ids, the
    context, and for a GenAI config the whole document (kept but for its decoder)."""

    path: Path
    kind: SourceKind
    tokens: TokenIds | None = None
    dims: ModelDims = ModelDims()
    context_length: int | None = None
    document: Mapping[str, Any] = field(default_factory=dict)
    filename: str | None = None
    """The model file a GenAI config's decoder names (``model.decoder.filename``), if it names one."""


def read_source_config(path: str | Path) -> SourceConfig:
    """Read a GenAI ``genai_config.json`` (an object with ``model.decoder``) or a Hugging Face
    ``config.json`` (an object with ``model_type``, ``architectures`` or ``vocab_size``; the
    ``generation_config.json`` beside it adds the end-of-sequence ids generation stops at).

    Raises :class:`UsageError` (one line naming the file) for a missing or unreadable file, text that is
    not JSON, or JSON that is neither kind of decoder config.
    """
    p = Path(path)
    obj = _json(p)
    doc = Document(str(p), UsageError, _ADVICE)
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        return _read_genai(p, doc.read(obj).fields())
    if isinstance(obj, dict) and any(k in obj for k in ("model_type", "architectures", "vocab_size")):
        return _with_generation_ids(_read_hf(p, doc.read(obj).fields()))
    raise UsageError(
        f"{p}: not a decoder config (expected a genai_config.json with model.decoder, or a Hugging Face "
        f"config.json with model_type); {_ADVICE}"
    )


def _json(p: Path) -> Any:
    if not p.is_file():
        raise UsageError(f"{p}: no such file ({opt('genai_config')}); {_ADVICE}")
    return Document(str(p), UsageError, _ADVICE).load(p)


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
        dims=ModelDims(
            layers=_opt_int(dec, "num_hidden_layers"),
            kv_heads=_opt_int(dec, "num_key_value_heads"),
            head_size=_opt_int(dec, "head_size"),
            attention_heads=_opt_int(dec, "num_attention_heads"),
            hidden_size=_opt_int(dec, "hidden_size"),
            vocab_size=_opt_int(model, "vocab_size"),
        ),
        context_length=_opt_int(model, "context_length"),
        document=top.raw,
        filename=dec["filename"].string() if dec.raw.get("filename") is not None else None,
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
        dims=ModelDims(
            layers=_opt_int(f, "num_hidden_layers", "n_layer", "num_layers"),
            kv_heads=_opt_int(f, "num_key_value_heads", "num_attention_heads", "n_head"),
            head_size=head_size,
            attention_heads=heads,
            hidden_size=hidden,
            vocab_size=_opt_int(f, "vocab_size"),
        ),
        context_length=_opt_int(f, "max_position_embeddings", "n_positions", "n_ctx", "max_target_positions"),
    )


def _with_generation_ids(config: SourceConfig) -> SourceConfig:
    """``config`` with the end-of-sequence ids of the ``generation_config.json`` beside it, where there is
    one that states them (what generation stops at); a bad one is refused like the config itself."""
    path = config.path.parent / GENERATION_CONFIG_NAME
    if not path.is_file():
        return config
    obj = _json(path)
    if not isinstance(obj, dict) or obj.get("eos_token_id") is None:
        return config
    found = _tokens(Document(str(path), UsageError, _ADVICE).read(obj).fields())
    if found is None:
        return config
    before = config.tokens
    tokens = TokenIds(
        bos=before.bos if before is not None and "bos_token_id" not in obj else found.bos,
        eos=found.eos,
        pad=before.pad if before is not None and "pad_token_id" not in obj else found.pad,
    )
    return dataclasses.replace(config, tokens=tokens)


# --------------------------------------------------------------------------------------------------
# the config beside a model


@dataclass(frozen=True)
class FolderConfig:
    """The config found beside a model (None when there is none that serves), and why one was set
    aside."""

    config: SourceConfig | None
    notes: tuple[str, ...] = ()


def config_beside(model: Path | None) -> FolderConfig:
    """The model's own config from its folder, else from the folder above it (the ``onnx/`` layout of
    Hugging Face repositories, :func:`~onnxpipe.core.tokenizer_files.model_folders`): the
    ``genai_config.json`` whose decoder is this file (GenAI's builder writes it there), else the Hugging
    Face ``config.json``.  One that cannot be read, or a GenAI config of another file, is set aside with a
    note: the user did not ask for it, so it never fails a split.  Finding none is a note too, saying
    where it looked."""
    if model is None:
        return FolderConfig(None)
    notes: list[str] = []
    for folder in model_folders(model):
        where = folder_place(model, folder)
        for name in (GENAI_CONFIG_NAME, HF_CONFIG_NAME):
            path = folder / name
            if not path.is_file():
                continue
            try:
                config = read_source_config(path)
            except UsageError as e:
                notes.append(f"{path.name} {where} is not read: {str(e).split(': ', 1)[-1]}")
                continue
            own = model.absolute().relative_to(folder).as_posix()
            if config.filename is not None and config.filename != own:
                notes.append(f"{path.name} {where} is for {config.filename}, not {own}: not read")
                continue
            return FolderConfig(config, tuple(notes))
    if not notes:
        notes.append(f"no {GENAI_CONFIG_NAME} or {HF_CONFIG_NAME} {looked_in(model)}")
    return FolderConfig(None, tuple(notes))
