"""What a generation starts from: the prompts as token ids, the ids that end a sequence, and the
tokenizer that turns text into ids and back, found beside the split or its source model.

Both doors to generation (:func:`onnxpipe.generate` and :meth:`Generator.generate
<onnxpipe.runtime.generation.generator.Generator.generate>`) settle these here, once, before any worker
starts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt
from onnxpipe.core.tokenizer_files import has_tokenizer, model_folders
from onnxpipe.manifest import DecoderLimits, Manifest, decoder_limits
from onnxpipe.runtime.options import GenerateOptions
from onnxpipe.runtime.text import TextCodec


@dataclass(frozen=True)
class Prompting:
    """The settled start of a generation: ``options`` with token ids for every prompt and the end ids to
    stop at, the tokenizer when text came in (its new tokens then go out as text too), and where the end
    ids were read (for the reader of the output)."""

    options: GenerateOptions
    codec: TextCodec | None
    eos_from: str | None


def settle(folder: Path, manifest: Manifest, options: GenerateOptions) -> Prompting:
    """``options`` with the prompts as ids and the model's end ids where none were given, checked
    against the model's vocabulary and context (:func:`~onnxpipe.manifest.decoder_limits`) before any
    worker runs: an id beyond the vocabulary or a sequence past the context would otherwise fail deep
    in a run, after the work."""
    limits = decoder_limits(folder, manifest)
    codec = None
    if options.prompts or options.tokenizer is not None:
        codec = TextCodec.load(_tokenizer_folder(folder, manifest, options.tokenizer))
    ids = options.prompt_ids
    if options.prompts:
        assert codec is not None
        ids = tuple(codec.encode(p, chat=options.chat, system=options.system) for p in options.prompts)
    _check_fits(ids, options, limits, codec)
    eos, source = _eos(folder, manifest, options, limits, codec)
    settled = dataclasses.replace(
        options, prompt_ids=ids, prompts=(), chat=False, system=None, eos_token_ids=eos, ignore_eos=False
    )
    return Prompting(settled, codec, source)


def _check_fits(
    ids: tuple[tuple[int, ...], ...], options: GenerateOptions, limits: DecoderLimits, codec: TextCodec | None
) -> None:
    """Refuse a prompt of no token (text the tokenizer made nothing of: options refuse an empty
    ``prompt_ids``), an id beyond the vocabulary, a sequence past the context."""
    vocab = limits.vocab_size
    for i, prompt in enumerate(ids):
        if not prompt and codec is not None and options.prompts:
            raise UsageError(
                f"prompt {i} ({options.prompts[i]!r}): the tokenizer in {codec.folder} made no token of this "
                f"text; give text it has tokens for, or the prompt as token ids ({opt('prompt_ids')})"
            )
        beyond = [t for t in prompt if vocab is not None and t >= vocab]
        if beyond and codec is not None:
            raise UsageError(
                f"{codec.folder}: its tokenizer makes id {beyond[0]}, beyond the model's vocabulary of "
                f"{vocab}: "
                f"it is not this model's tokenizer; give the model's own as {opt('tokenizer')}"
            )
        if beyond:
            raise UsageError(
                f"{opt('prompt_ids')}: prompt {i} holds id {beyond[0]}, beyond the model's vocabulary of "
                f"{vocab} (ids 0 to {vocab - 1 if vocab else 0}); give ids the model knows"
            )
        need = len(prompt) + options.max_new_tokens
        if need > limits.context:
            room = limits.context - len(prompt)
            fix = (
                f"give {opt('max_new_tokens')} {room} or less"
                if room > 0
                else "give a shorter prompt, or split the model again with a larger max_context"
            )
            raise UsageError(
                f"prompt {i}: its {len(prompt)} token(s) and {opt('max_new_tokens', options.max_new_tokens)} "
                f"need {need} positions, beyond the context of {limits.context} the split was made for; {fix}"
            )


def _tokenizer_folder(folder: Path, manifest: Manifest, given: Path | None) -> Path:
    """The folder given, else the split's when it holds a tokenizer (a split copies its model's), else the
    source model's, else the one above it (the ``onnx/`` layout of Hugging Face repositories)."""
    if given is not None:
        return given
    # the model that was split, where its folder still exists (its tokenizer may lie there or one up)
    source = None if manifest.source.path is None else (folder / manifest.source.path).resolve()
    searched = [folder, *(model_folders(source) if source is not None and source.parent.is_dir() else ())]
    for where in searched:
        if has_tokenizer(where):
            return where
    places = ", ".join(str(p) for p in searched[:-1])
    places = f"{places} or {searched[-1]}" if places else str(searched[-1])
    raise UsageError(
        f"no tokenizer (tokenizer.json, tokenizer.model, or vocab.json with merges.txt) in {places}; "
        f"give the folder of the model's tokenizer files as {opt('tokenizer')}, or token ids as "
        f"{opt('prompt_ids')}"
    )


def _eos(
    folder: Path,
    manifest: Manifest,
    options: GenerateOptions,
    limits: DecoderLimits,
    codec: TextCodec | None,
) -> tuple[tuple[int, ...], str | None]:
    """The ids to stop at and where they were read: those given, none with ``ignore_eos``, else the
    model's own as the split recorded them (its config's), else its tokenizer's end token.  No id is
    guessed: a model whose files name none stops only at ``max_new_tokens``."""
    if options.ignore_eos:
        return (), None
    if options.eos_token_ids is not None:
        return options.eos_token_ids, None
    record = manifest.plan.decoder.model if manifest.plan.decoder is not None else None
    if limits.eos_ids:
        config = record.config if record is not None and record.config else "the model's config"
        return limits.eos_ids, f"{config}, as the split recorded it"
    if codec is not None and codec.eos_ids:
        return codec.eos_ids, f"{codec.folder / 'tokenizer_config.json'}"
    return (), None
