"""A decoder's own files in its split folder, and what a generator checks before any work.

A split of a decoder is a model folder too: the tokenizer, its chat template and the generation defaults
found beside the model (:func:`onnxpipe.core.tokenizer_files.tokenizer_files`) are copied beside the
stages, so that a generator takes text from the folder alone and GenAI's ``og.Tokenizer`` loads it.  The
manifest's ``plan.decoder.model`` (:class:`~onnxpipe.planning.records.DecoderModelRecord`) records the model's
vocabulary and context, the token ids of its own config, the files copied and where the chat template is:
what ``generate`` checks a prompt against before it runs a step (:mod:`onnxpipe.manifest.limits`).

The config used is the one named (``split --genai-config``), else the one beside the model when its dims
agree with the graph's (:func:`onnxpipe.ir.decoder_dims.own_config`); never a guess: without one, the
record says no token ids.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from onnxpipe.core.errors import ExportError, UsageError
from onnxpipe.core.model_config import GENAI_CONFIG_NAME, HF_CONFIG_NAME, SourceConfig
from onnxpipe.core.options import opt
from onnxpipe.core.tokenizer_files import chat_template, folder_place, model_folders, tokenizer_files
from onnxpipe.export.genai.config import Unsupported
from onnxpipe.export.genai.graph import check_source_fits, model_facts
from onnxpipe.export.genai.write import describe_written, genai_config
from onnxpipe.export.outdir import writing
from onnxpipe.ir.decoder import DecoderInfo, FoundDecoder, decoder_of
from onnxpipe.ir.decoder_dims import decoder_dims, own_config, own_context
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import Manifest
from onnxpipe.planning.records import DecoderModelRecord


@dataclass(frozen=True)
class ModelSource:
    """The config a decoder's split takes its ids and context from (None: the graph alone), and the notes
    that say why one beside the model was set aside."""

    config: SourceConfig | None
    named: bool
    """Whether the user named it (``--genai-config``): a named config that does not fit is an error."""
    notes: tuple[str, ...] = ()


def model_source(view: ModelView, dec: DecoderInfo, named: SourceConfig | None) -> ModelSource:
    """``named``, else the config beside the model, kept only when its dims agree with the graph's (else
    set aside with a note: the user did not ask for it)."""
    if named is not None:
        return ModelSource(named, True)
    found = own_config(view, dec)
    config = found.config
    if config is None:
        return ModelSource(None, False, found.notes)
    facts = model_facts(view, dec)
    if not isinstance(facts, Unsupported):
        try:
            check_source_fits(config, facts[1])
        except UsageError as e:
            reason = str(e).split(": ", 1)[-1]
            return ModelSource(
                None, False, (*found.notes, f"{config.path.name} beside the model set aside: {reason}")
            )
    return ModelSource(config, False, found.notes)


def copy_model_files(view: ModelView, source: ModelSource, tmp: Path) -> tuple[tuple[str, ...], str | None]:
    """Copy the tokenizer, chat template and generation files beside the model (else one folder up, the
    ``onnx/`` layout, else beside the named config) into ``tmp``; their names, and where they were found
    when not beside the model.  A ``config.json`` is copied only when it is the config used."""
    folders = list(model_folders(view.path)) if view.path is not None else []
    if source.config is not None and source.config.path.parent.absolute() not in folders:
        folders.append(source.config.path.parent.absolute())
    for folder in folders:
        files = [
            p
            for p in tokenizer_files(folder)
            if p.name != HF_CONFIG_NAME
            or (source.config is not None and p.resolve() == source.config.path.resolve())
        ]
        if not files:
            continue
        for p in files:
            try:
                shutil.copyfile(p, tmp / p.name)
            except OSError as e:
                raise ExportError(
                    f"{tmp / p.name}: cannot copy {p} into the split ({e}); free space or fix access"
                ) from e
        origin = _origin(view.path, folder)
        return tuple(p.name for p in files), origin
    return (), None


def _origin(model: Path | None, folder: Path) -> str | None:
    """Where the model's files came from, when not from beside it."""
    if model is None or folder not in model_folders(model):
        return str(folder)
    return None if folder == model.absolute().parent else folder_place(model, folder)


def model_record(
    view: ModelView, dec: DecoderInfo, source: ModelSource, files: tuple[str, ...], folder: Path
) -> DecoderModelRecord:
    """``plan.decoder.model``: the vocabulary and context (the config's and the graph's), the config's
    token ids, the files copied into ``folder`` and which holds the chat template."""
    config = source.config
    dims = decoder_dims(view, dec)
    context = own_context(view, dec, config)
    tokens = config.tokens if config is not None else None
    template = chat_template(folder) if files else None
    return DecoderModelRecord(
        vocab_size=dims.vocab_size or (config.dims.vocab_size if config is not None else None),
        context_length=context.tokens if context is not None else None,
        bos_token_id=tokens.bos if tokens is not None else None,
        eos_token_ids=tokens.eos if tokens is not None else (),
        pad_token_id=tokens.pad if tokens is not None else None,
        config=config.path.name if config is not None else None,
        files=files,
        chat_template=template[1] if template is not None else None,
    )


def with_decoder_files(
    view: ModelView,
    manifest: Manifest,
    tmp: Path,
    out: Path,
    named: SourceConfig | None,
    decoder: FoundDecoder | None = None,
) -> Manifest:
    """A decoder split's own files written into ``tmp`` (the model's tokenizer files, a
    ``genai_config.json``) and recorded in ``manifest`` (its decoder's ``model`` record, the notes on the
    config and the files); nothing for a model that is not a decoder (and a ``named`` config is then
    refused)."""
    record = manifest.plan.decoder
    dec = decoder_of(view, decoder) if record is not None else None
    if record is None or dec is None:
        if named is not None:
            raise UsageError(
                f"{named.path}: {opt('genai_config')} is for a decoder LLM split between its layers, and "
                f"{view.label} was not split as one; leave {opt('genai_config')} out"
            )
        return manifest
    source = model_source(view, dec, named)
    files, origin = copy_model_files(view, source, tmp)
    notes = list(source.notes)
    if files:
        where = "" if origin is None else f" from {origin}"
        notes.append(f"copied the model's {', '.join(files)}{where} into the folder")
    notes.append(_write_genai_config(view, dec, manifest, tmp, out, source))
    plan = dataclasses.replace(
        manifest.plan,
        decoder=dataclasses.replace(record, model=model_record(view, dec, source, files, tmp)),
        notes=(*manifest.plan.notes, *notes),
    )
    return dataclasses.replace(manifest, plan=plan)


def _write_genai_config(
    view: ModelView, dec: DecoderInfo, manifest: Manifest, tmp: Path, out: Path, source: ModelSource
) -> str:
    """Write a decoder split's ``genai_config.json`` into ``tmp``, derived from ``source``'s config (the
    builder's own, when it lies beside the model); the note saying so, or saying why GenAI cannot run the
    split (an error for a config the user named)."""
    config = genai_config(view, dec, manifest, source.config)
    if isinstance(config, Unsupported):
        if source.named:
            raise ExportError(f"{out / GENAI_CONFIG_NAME}: cannot be written: {config.reason}")
        return f"{GENAI_CONFIG_NAME} not written: ONNX Runtime GenAI cannot run this split ({config.reason})"
    with writing(out / GENAI_CONFIG_NAME, out):
        # plain JSON, as GenAI's parser takes, with a 4-space indent as its builder writes
        (tmp / GENAI_CONFIG_NAME).write_text(json.dumps(config.to_json(), indent=4) + "\n", encoding="utf-8")
    return describe_written(config, source.config)
