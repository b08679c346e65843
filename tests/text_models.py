"""Tokenizers for the tests, built with Hugging Face's ``tokenizers`` (nothing downloaded): a word-level
vocabulary whose text is easy to read in a failure, and a byte-level BPE whose tokens split characters."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CHAT = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


def word_tokenizer(folder: Path, *, chat: str | None = CHAT, bos: bool = True, words: int = 125) -> Path:
    """Words ``w0 .. w{words - 1}`` and the chat's three markers after them (128 ids by default: the
    sample decoders' vocabulary); ``w0`` the BOS (added to plain text), ``w1`` the end."""
    markers = ("[user]", "[system]", "[assistant]")
    vocab = {f"w{i}": i for i in range(words)} | {m: words + i for i, m in enumerate(markers)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="w0 $A", special_tokens=[("w0", 0)])
    tok.add_special_tokens([AddedToken(t, single_word=True, special=True) for t in ("w0", "w1")])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config: dict[str, object] = {"bos_token": "w0", "eos_token": {"content": "w1"}}
    if chat is not None:
        config["chat_template"] = chat
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def byte_tokenizer(folder: Path) -> Path:
    """A byte-level BPE with few merges: a character of 2-4 bytes spans several tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world", "the quick brown fox"] * 20, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder
