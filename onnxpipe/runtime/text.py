"""Text in and out of a decoder: the model's own tokenizer and chat template, read from its files.

A decoder's users have prompts, not token ids.  The files that turn one into the other are the ones Hugging
Face and ONNX Runtime GenAI's builder write beside a model, and a split carries into its folder:
``tokenizer.json`` (read by Hugging Face's maintained ``tokenizers`` library, the optional extra
``onnxpipe[text]``), ``tokenizer_config.json`` (the special tokens and the chat template; newer writers put
the template in ``chat_template.jinja`` or ``chat_template.json``), ``generation_config.json`` and
``config.json`` (the end-of-sequence ids).  The chat template is Jinja, rendered in a sandbox as
``transformers`` renders it, so a prompt is wrapped exactly as the model was trained to read it.

Text streams out as it is made (:class:`TextStream`): a token may hold part of a character or of a word
that only the next token completes, so text is released once what has been decoded no longer ends in a
partial character.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxpipe.core.errors import UsageError
from onnxpipe.core.extras import install_hint
from onnxpipe.core.options import opt
from onnxpipe.core.tokenizer_files import chat_template

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
_PARTIAL = "\ufffd"
"""What a byte-level tokenizer decodes part of a multi-byte character to."""


@dataclass(frozen=True)
class TextCodec:
    """A tokenizer with its chat template and end-of-sequence ids, from one folder's files."""

    folder: Path
    tokenizer: Any
    """A ``tokenizers.Tokenizer``."""
    chat_template: str | None
    special: dict[str, str]
    """The special tokens' texts by role (``bos_token``, ``eos_token``, ...), for the chat template."""
    eos_ids: tuple[int, ...]
    """The ids that end a sequence, as the model's files say (empty when none says)."""

    @staticmethod
    def load(where: str | Path) -> TextCodec:
        """The tokenizer of the folder ``where`` (or of the folder of the file ``where``).

        Raises :class:`UsageError` naming the folder when it holds no ``tokenizer.json``, and naming the
        extra to install when ``tokenizers`` is missing."""
        path = Path(where)
        folder = path.parent if path.is_file() else path
        file = folder / TOKENIZER_FILE
        if not file.is_file():
            raise UsageError(
                f"{folder}: holds no {TOKENIZER_FILE}; give the folder of the model's tokenizer files as "
                f"{opt('tokenizer')}, or token ids as {opt('prompt_ids')}"
            )
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise UsageError(
                f"text prompts need Hugging Face's tokenizers: {install_hint('text')}, or give token "
                f"ids as {opt('prompt_ids')}"
            ) from e
        try:
            tokenizer = Tokenizer.from_file(str(file))
        except Exception as e:
            raise UsageError(f"{file}: cannot be read as a tokenizer ({e})") from e
        config = _json(folder / TOKENIZER_CONFIG)
        special = {
            role: text
            for role in ("bos_token", "eos_token", "unk_token", "pad_token")
            if (text := _token_text(config.get(role))) is not None
        }
        eos = _eos_ids(folder, tokenizer, special.get("eos_token"))
        template = chat_template(folder)
        return TextCodec(folder, tokenizer, None if template is None else template[0], special, eos)

    def encode(self, text: str, *, chat: bool = False, system: str | None = None) -> tuple[int, ...]:
        """``text``'s token ids; with ``chat`` wrapped first in the chat template as a user's message
        (after ``system``'s), ready for the assistant's answer.  The template writes its own special
        tokens, so none is added to it; plain text gets the ones the tokenizer adds (a leading BOS)."""
        if chat:
            return tuple(self.tokenizer.encode(self.render(text, system), add_special_tokens=False).ids)
        if system is not None:
            raise UsageError(f"{opt('system')} is for chat prompts: add {opt('chat', True)}")
        return tuple(self.tokenizer.encode(text).ids)

    def render(self, text: str, system: str | None = None) -> str:
        """``text`` as a user's message in the chat template, with the assistant's turn opened."""
        if self.chat_template is None:
            raise UsageError(
                f"{self.folder}: the model has no chat template ({TOKENIZER_CONFIG} has no chat_template, "
                f"and there is no chat_template.jinja or chat_template.json); leave {opt('chat')} out and "
                "give the prompt as the model expects it"
            )
        messages = ([{"role": "system", "content": system}] if system is not None else []) + [
            {"role": "user", "content": text}
        ]
        return _render(self.chat_template, messages, self.special)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens left out."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))


class TextStream:
    """One sequence's text, released piece by piece as its tokens come.

    Decoding token by token would split characters a byte-level tokenizer spreads over several tokens,
    and drop the spaces some tokenizers write only between words; so the text of the tokens since the
    last release is decoded whole, and released once it no longer ends in part of a character."""

    def __init__(self, codec: TextCodec, emit: Callable[[str], None]) -> None:
        self._codec = codec
        self._emit = emit
        self._ids: list[int] = []
        self._start = 0  # the first token of the text not released yet, with one token before it
        self._shown = 0  # the released text's length, of the decoding from _start

    def add(self, token: int) -> None:
        self._ids.append(token)
        text = self._codec.decode(self._ids[self._start :])
        if text.endswith(_PARTIAL) or len(text) <= self._shown:
            return
        self._emit(text[self._shown :])
        # restart the window one token back: enough context for the space before the next word
        self._start = len(self._ids) - 1
        self._shown = len(self._codec.decode(self._ids[self._start :]))

    def close(self) -> None:
        """Release what is left (a sequence that ended on a partial character shows it as such)."""
        text = self._codec.decode(self._ids[self._start :])
        if len(text) > self._shown:
            self._emit(text[self._shown :])
        self._shown = len(text)


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{path}: cannot be read as JSON ({e}); fix or remove it") from e
    return obj if isinstance(obj, dict) else {}


def _token_text(value: object) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: its text, or an object with ``content``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _ids(value: object) -> tuple[int, ...]:
    """The token ids of a config's ``eos_token_id``: one id or a list of them (booleans are no ids)."""
    values = [value] if isinstance(value, int) else value if isinstance(value, list) else []
    return tuple(v for v in values if isinstance(v, int) and not isinstance(v, bool))


def config_eos_ids(folder: Path) -> tuple[tuple[int, ...], str] | None:
    """The end ids ``folder``'s Hugging Face files name, and the file: ``generation_config.json``'s (what
    ``generate`` stops at, often several for chat models), else ``config.json``'s."""
    for name in ("generation_config.json", "config.json"):
        found = _ids(_json(folder / name).get("eos_token_id"))
        if found:
            return found, str(folder / name)
    return None


def _eos_ids(folder: Path, tokenizer: Any, eos_text: str | None) -> tuple[int, ...]:
    """The end ids of :func:`config_eos_ids`, else the tokenizer's end token's."""
    named = config_eos_ids(folder)
    if named is not None:
        return named[0]
    if eos_text is not None:
        token = tokenizer.token_to_id(eos_text)
        if token is not None:
            return (int(token),)
    return ()


def _render(template: str, messages: list[dict[str, str]], special: dict[str, str]) -> str:
    """Render a chat template as ``transformers`` does: a sandboxed Jinja environment that trims blocks,
    with ``raise_exception`` for the template's own refusals."""
    try:
        from jinja2 import TemplateError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:
        raise UsageError(f"chat templates need jinja2: {install_hint('text')}") from e

    def refuse(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = refuse
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
    try:
        return str(env.from_string(template).render(messages=messages, add_generation_prompt=True, **special))
    except TemplateError as e:
        raise UsageError(f"the model's chat template refuses the prompt: {e}") from e


class TextStreams:
    """Each sequence's :class:`TextStream`, told tokens as (sequence index, token): an ``on_token`` for
    :meth:`~onnxpipe.runtime.generation.generator.Generator.generate_with` that hands ``on_text``
    (sequence index, new text)."""

    def __init__(self, codec: TextCodec, on_text: Callable[[int, str], None]) -> None:
        self._codec = codec
        self._on_text = on_text
        self._streams: dict[int, TextStream] = {}

    def __call__(self, index: int, token: int) -> None:
        stream = self._streams.get(index)
        if stream is None:
            stream = self._streams[index] = TextStream(self._codec, lambda piece: self._on_text(index, piece))
        stream.add(token)

    def close(self) -> None:
        """Release every sequence's last text."""
        for stream in self._streams.values():
            stream.close()
