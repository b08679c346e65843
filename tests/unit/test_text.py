"""The tokenizer, chat template and end ids read from a model's files (onnxpipe.runtime.text): built here
with Hugging Face's ``tokenizers`` (a word-level vocabulary, and a byte-level BPE whose tokens split
characters), nothing downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from text_models import byte_tokenizer, word_tokenizer

from onnxpipe.core.errors import UsageError
from onnxpipe.runtime.text import TextCodec, TextStream, TextStreams, config_eos_ids


def test_plain_text_gets_the_tokenizers_bos_and_decodes_back(tmp_path: Path) -> None:
    codec = TextCodec.load(word_tokenizer(tmp_path))
    assert codec.encode("w5 w6 w7") == (0, 5, 6, 7)
    assert codec.decode([0, 5, 6, 7, 1]) == "w5 w6 w7"  # special tokens left out
    assert codec.eos_ids == (1,)


def test_chat_wraps_the_prompt_in_the_template_without_a_second_bos(tmp_path: Path) -> None:
    codec = TextCodec.load(word_tokenizer(tmp_path))
    assert codec.render("w5", system="w9") == "[system] w9 [user] w5 [assistant]"
    assert codec.encode("w5", chat=True, system="w9") == (126, 9, 125, 5, 127)


def test_a_template_in_its_own_file_is_read(tmp_path: Path) -> None:
    folder = word_tokenizer(tmp_path, chat=None)
    (folder / "chat_template.jinja").write_text("{{ messages[-1]['content'] }} [assistant]")
    assert TextCodec.load(folder).encode("w3", chat=True) == (3, 127)


def test_a_template_list_gives_its_default(tmp_path: Path) -> None:
    folder = word_tokenizer(tmp_path, chat=None)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "w4"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert TextCodec.load(folder).render("w3") == "w4"


def test_no_chat_template_is_refused_naming_the_folder_and_option(tmp_path: Path) -> None:
    codec = TextCodec.load(word_tokenizer(tmp_path, chat=None))
    with pytest.raises(UsageError, match=r"has no chat template.*leave `chat` out") as info:
        codec.encode("w3", chat=True)
    assert str(tmp_path) in str(info.value)


def test_a_template_that_raises_is_a_usage_error(tmp_path: Path) -> None:
    template = "{{ raise_exception('only user turns') }}"
    codec = TextCodec.load(word_tokenizer(tmp_path, chat=template))
    with pytest.raises(UsageError, match="the model's chat template refuses the prompt: only user turns"):
        codec.encode("w3", chat=True)


def test_a_folder_without_a_tokenizer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"holds no tokenizer\.json; .*`tokenizer`.*`prompt_ids`"):
        TextCodec.load(tmp_path)


def test_a_broken_tokenizer_file_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(UsageError, match=r"tokenizer\.json: cannot be read as a tokenizer"):
        TextCodec.load(tmp_path)


def test_end_ids_come_from_generation_config_before_the_tokenizer(tmp_path: Path) -> None:
    folder = word_tokenizer(tmp_path)
    assert config_eos_ids(folder) is None
    (folder / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert config_eos_ids(folder) == ((7,), str(folder / "config.json"))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 9]}))
    assert config_eos_ids(folder) == ((1, 9), str(folder / "generation_config.json"))
    assert TextCodec.load(folder).eos_ids == (1, 9)


def test_streamed_text_equals_the_whole_decoding_for_split_characters(tmp_path: Path) -> None:
    codec = TextCodec.load(byte_tokenizer(tmp_path))
    text = "hello wörld ✓ fox 🦊 done"
    ids = codec.tokenizer.encode(text).ids
    assert any(codec.decode(ids[:n]).endswith("\ufffd") for n in range(1, len(ids)))  # a split character
    pieces: list[tuple[int, str]] = []
    streams = TextStreams(codec, lambda i, piece: pieces.append((i, piece)))
    for token in ids:
        streams(3, token)
    streams.close()
    assert all(i == 3 and "\ufffd" not in piece for i, piece in pieces)
    assert "".join(p for _, p in pieces) == codec.decode(ids) == text


def test_streamed_words_keep_their_spaces(tmp_path: Path) -> None:
    codec = TextCodec.load(word_tokenizer(tmp_path))
    pieces: list[str] = []
    stream = TextStream(codec, pieces.append)
    for token in (5, 6, 1, 7):
        stream.add(token)
    stream.close()
    assert "".join(pieces) == codec.decode([5, 6, 1, 7]) == "w5 w6 w7"
    assert len(pieces) == 3
