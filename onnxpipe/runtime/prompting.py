"""What a generation starts from: the prompts as token ids, the ids that end a sequence, and the
tokenizer that turns text into ids and back, found beside the split or its source model.

Both doors to generation (:func:`onnxpipe.generate` and :meth:`Pipeline.generate
<onnxpipe.runtime.pipeline.Pipeline.generate>`) settle these here, once, before any worker starts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt
from onnxpipe.export.genai.config import GENAI_CONFIG_NAME
from onnxpipe.export.genai.source import read_source_config
from onnxpipe.manifest import Manifest
from onnxpipe.runtime.generate import Generation
from onnxpipe.runtime.options import GenerateOptions
from onnxpipe.runtime.text import TOKENIZER_FILE, TextCodec, config_eos_ids


@dataclass(frozen=True)
class Prompting:
    """The settled start of a generation: ``options`` with token ids for every prompt and the end ids to
    stop at, the tokenizer when text came in (its new tokens then go out as text too), and where the end
    ids were read (for the reader of the output)."""

    options: GenerateOptions
    codec: TextCodec | None
    eos_from: str | None

    def with_texts(self, result: Generation) -> Generation:
        """``result`` with its new tokens as text, when the prompts came as text."""
        if self.codec is None:
            return result
        return dataclasses.replace(result, texts=tuple(self.codec.decode(t) for t in result.tokens))


def settle(folder: Path, manifest: Manifest, options: GenerateOptions) -> Prompting:
    """``options`` with the prompts as ids and the model's end ids where none were given."""
    options.check()
    codec = None
    if options.prompts or options.tokenizer is not None:
        codec = TextCodec.load(_tokenizer_folder(folder, manifest, options.tokenizer))
    ids = options.prompt_ids
    if options.prompts:
        assert codec is not None
        ids = tuple(codec.encode(p, chat=options.chat, system=options.system) for p in options.prompts)
    for i, p in enumerate(ids):
        if not p:
            raise UsageError(f"prompt {i} makes no token: give some text, or at least one token id")
    eos, source = _eos(folder, manifest, options, codec)
    settled = dataclasses.replace(
        options, prompt_ids=ids, prompts=(), chat=False, system=None, eos_token_ids=eos, ignore_eos=False
    )
    return Prompting(settled, codec, source)


def _source_folder(folder: Path, manifest: Manifest) -> Path | None:
    """The folder of the model that was split, where its own tokenizer and configs may lie."""
    if manifest.source.path is None:
        return None
    source = (folder / manifest.source.path).parent.resolve()
    return source if source.is_dir() else None


def _tokenizer_folder(folder: Path, manifest: Manifest, given: Path | None) -> Path:
    """The folder given, else the split's when it holds a tokenizer, else the source model's."""
    if given is not None:
        return given
    source = _source_folder(folder, manifest)
    for where in (folder, source):
        if where is not None and (where / TOKENIZER_FILE).is_file():
            return where
    searched = (
        f"{folder}: holds" if source is None else f"neither {folder} nor the source model's {source} holds"
    )
    raise UsageError(
        f"{searched} no {TOKENIZER_FILE}; give the folder of the model's tokenizer files as "
        f"{opt('tokenizer')}, "
        f"or token ids as {opt('prompt_ids')}"
    )


def _eos(
    folder: Path, manifest: Manifest, options: GenerateOptions, codec: TextCodec | None
) -> tuple[tuple[int, ...], str | None]:
    """The ids to stop at and the file they were read from: those given, none with ``ignore_eos``, else
    the model's own: the GenAI config its builder wrote beside it, else its Hugging Face generation
    config or config (in the split's folder or beside the model), else its tokenizer's end token.

    The split's own ``genai_config.json`` is not read for them: where the model's files named none, it
    holds GenAI's defaults, which are no model's end."""
    if options.ignore_eos:
        return (), None
    if options.eos_token_ids is not None:
        return options.eos_token_ids, None
    source = _source_folder(folder, manifest)
    if source is not None and (source / GENAI_CONFIG_NAME).is_file():
        tokens = read_source_config(source / GENAI_CONFIG_NAME).tokens
        if tokens is not None and tokens.eos:
            return tokens.eos, str(source / GENAI_CONFIG_NAME)
    for where in (folder, source):
        if where is not None:
            found = config_eos_ids(where)
            if found is not None:
                return found
    if codec is not None and codec.eos_ids:
        return codec.eos_ids, str(codec.folder / "tokenizer_config.json")
    return (), None
