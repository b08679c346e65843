"""The files a tokenizer and a chat template live in, beside a model and in its split folder.

A model folder as users have it (Hugging Face's, or what GenAI's model builder writes) holds the tokenizer
next to the weights: ``tokenizer.json`` and ``tokenizer_config.json`` (Hugging Face ``tokenizers``, which
GenAI's tokenizer reads too), or a SentencePiece ``tokenizer.model``, or ``vocab.json`` with
``merges.txt``; the chat template in ``chat_template.jinja``, ``chat_template.json`` or the
``chat_template`` key of ``tokenizer_config.json``.  A split copies them (:func:`tokenizer_files`), so that
its folder is a model folder too: a generator takes text, and GenAI's ``og.Tokenizer`` loads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TOKENIZER_NAMES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "config.json",
)
"""The tokenizer's, the chat template's and the generation defaults' files, by the names Hugging Face and
GenAI's builder give them (the Hugging Face ``config.json`` too: some tokenizers are found through its
``model_type``)."""

TEMPLATE_SUFFIX = ".jinja"
"""Chat templates of their own file (``chat_template.jinja``, and named ones beside it)."""


def model_folders(model: Path) -> tuple[Path, ...]:
    """Where a model's own files are looked for: its folder, then the one above it.

    Hugging Face repositories of ONNX models (onnx-community's, transformers.js') keep the graphs in
    ``onnx/`` (``onnx/model_q4.onnx``) and the ``config.json``, ``generation_config.json`` and tokenizer
    at the repository's root, one folder up.  The model's own folder comes first.
    """
    here = model.absolute().parent
    up = here.parent
    return (here,) if up == here else (here, up)


def folder_place(model: Path, folder: Path) -> str:
    """``beside the model`` or ``one folder up (DIR)``: where ``folder`` is, for a note."""
    return "beside the model" if folder == model.absolute().parent else f"one folder up ({folder})"


def looked_in(model: Path) -> str:
    """The folders :func:`model_folders` searches, for a message: ``beside the model (A) or one folder up
    (B)``."""
    folders = model_folders(model)
    up = f" or one folder up ({folders[1]})" if len(folders) > 1 else ""
    return f"beside the model ({folders[0]}){up}"


def tokenizer_files(folder: Path) -> tuple[Path, ...]:
    """The tokenizer, chat template and generation files in ``folder`` (plain files only), in
    :data:`TOKENIZER_NAMES` order, then other ``*.jinja`` templates by name."""
    if not folder.is_dir():
        return ()
    named = [folder / n for n in TOKENIZER_NAMES if (folder / n).is_file() and not (folder / n).is_symlink()]
    extra = sorted(
        p for p in folder.glob(f"*{TEMPLATE_SUFFIX}") if p.is_file() and not p.is_symlink() and p not in named
    )
    return (*named, *extra)


def has_tokenizer(folder: Path) -> bool:
    """Whether ``folder`` holds a tokenizer a maintained library loads: ``tokenizer.json``, a
    SentencePiece model, or a BPE vocabulary with its merges."""
    return any(
        all((folder / n).is_file() for n in names)
        for names in (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"))
    )


def chat_template(folder: Path) -> tuple[str, str] | None:
    """The chat template in ``folder`` and the file it is in: ``chat_template.jinja``, else
    ``chat_template.json``'s ``chat_template``, else ``tokenizer_config.json``'s (a list of named templates
    gives its ``default``); None when there is none, or the files cannot be read."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8"), jinja.name
        except (OSError, UnicodeDecodeError):
            return None
    for name in ("chat_template.json", "tokenizer_config.json"):
        found = _template_in(_json_object(folder / name).get("chat_template"))
        if found is not None:
            return found, name
    return None


def _json_object(path: Path) -> dict[str, Any]:
    """``path``'s JSON object, empty when the file is absent, unreadable or holds something else."""
    if not path.is_file():
        return {}
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return obj if isinstance(obj, dict) else {}


def _template_in(value: Any) -> str | None:
    """A template from a ``chat_template`` value: the text, or of a list of ``{name, template}`` the
    ``default`` one (else the first)."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list):
        named = {
            item.get("name"): item.get("template")
            for item in value
            if isinstance(item, dict) and isinstance(item.get("template"), str)
        }
        chosen = named.get("default", next(iter(named.values()), None))
        return chosen if isinstance(chosen, str) and chosen.strip() else None
    return None
