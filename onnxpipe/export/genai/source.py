"""Reading ``--genai-config FILE`` (a GenAI ``genai_config.json`` or a Hugging Face ``config.json``), and
refusing one that describes another model than the graph."""

from __future__ import annotations

import json
from pathlib import Path

from onnxpipe.core.errors import UsageError
from onnxpipe.core.jsonread import Document, Fields, Value
from onnxpipe.core.options import opt
from onnxpipe.export.genai.config import GraphDims, SourceConfig, SourceKind, TokenIds

_ADVICE = (
    f"give the model's genai_config.json or Hugging Face config.json, or leave {opt('genai_config')} out"
)


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
