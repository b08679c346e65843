"""What a generator checks a request against before any work, read from a decoder's split folder.

A prompt of ids beyond the vocabulary, or a prompt and new tokens past the context, fails deep inside a
run (onnxruntime's raw error, after the work); a chat request needs a template, and text needs a
tokenizer.  The split records all of it (``plan.decoder`` and its ``model`` record, the tokenizer files
copied beside the stages: :mod:`onnxpipe.export.model_files`); :func:`decoder_limits` reads it back as one
typed value, without onnx.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from onnxpipe.core.errors import UsageError
from onnxpipe.core.tokenizer_files import chat_template, has_tokenizer
from onnxpipe.manifest.manifest import Manifest, load_manifest


@dataclass(frozen=True)
class DecoderLimits:
    """A decoder split's limits and token ids.

    ``context`` is the most tokens (prompt and new) a sequence may hold: the context the split counted
    its KV cache at (``max_context``, or the model's own where smaller), the ``context_length`` its
    ``genai_config.json`` says.  ``vocab_size`` bounds the token ids (None where neither the graph nor a
    config says it).  ``eos_ids`` are the model's own end-of-sequence ids (empty when no config of the
    model states them: no id is guessed).  ``tokenizer_dir`` is the folder when it holds a tokenizer
    (``tokenizer.json``, a SentencePiece model, or BPE vocabulary and merges), ``chat_template`` the
    template's text when the model has one.
    """

    vocab_size: int | None
    context: int
    eos_ids: tuple[int, ...]
    tokenizer_dir: Path | None
    chat_template: str | None
    bos_id: int | None = None
    pad_id: int | None = None


def decoder_limits(folder: str | Path, manifest: Manifest | None = None) -> DecoderLimits:
    """The limits of the decoder split in ``folder`` (its ``manifest``, read from the folder unless
    given).

    Raises :class:`UsageError` naming the folder when it was not split as a decoder with a KV cache, and
    :class:`~onnxpipe.core.errors.ManifestError` for a manifest that cannot be read.
    """
    path = Path(folder)
    m = manifest if manifest is not None else load_manifest(path, check_files=False)
    record = m.plan.decoder
    if record is None:
        raise UsageError(
            f"{path}: was not split as a decoder LLM with a KV cache, so it has no vocabulary or context to "
            "check against; split a decoder"
        )
    model = record.model
    context = record.max_context
    if model is not None and model.context_length is not None:
        context = min(context, model.context_length)
    template = chat_template(path)
    return DecoderLimits(
        vocab_size=model.vocab_size if model is not None else None,
        context=context,
        eos_ids=model.eos_token_ids if model is not None else (),
        tokenizer_dir=path if has_tokenizer(path) else None,
        chat_template=template[0] if template is not None else None,
        bos_id=model.bos_token_id if model is not None else None,
        pad_id=model.pad_token_id if model is not None else None,
    )
