"""Refusing a ``--genai-config FILE`` (read by :func:`onnxpipe.core.model_config.read_source_config`) that
describes another model than the graph."""

from __future__ import annotations

from onnxpipe.core.errors import UsageError
from onnxpipe.core.model_config import SourceConfig
from onnxpipe.core.options import opt
from onnxpipe.ir.decoder_dims import DecoderDims


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
