"""A decoder recognised from its graph rather than its exporter's habits, and its own config and tokenizer
files beside it (:mod:`onnxpipe.ir.kv_pairs`, :mod:`onnxpipe.ir.decoder_dims`,
:mod:`onnxpipe.core.model_config`, :mod:`onnxpipe.core.tokenizer_files`), on the hand-built decoders of
``tests/decoder_models.py``."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from decoder_models import FLOAT, HEADS, LAYERS, VOCAB, WIDTH, concat_decoder, gqa_decoder, odd_names

from onnxpipe.core.errors import UsageError
from onnxpipe.core.model_config import config_beside, read_source_config
from onnxpipe.core.tokenizer_files import chat_template, has_tokenizer, tokenizer_files
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.decoder_dims import decoder_dims, decoder_facts, own_context
from onnxpipe.ir.load import load_model, view_from_proto

# ------------------------------------------------------------------------------------------ recognition


def test_the_int4_builders_layout_is_a_decoder_whatever_its_names() -> None:
    """The token input found through ``GatherBlockQuantized`` (named ``tokens``, beside another integer
    input), the cache pairs by the attention nodes' slots (names that follow no convention), the head size
    off the attention's heads and the packed q/k/v width, the hidden size off the dequantized table."""
    view = view_from_proto(gqa_decoder())
    dec = find_decoder(view)
    assert dec is not None
    assert dec.ids_input == "tokens" and dec.layers == LAYERS
    assert [(p.past_key, p.present_value) for p in dec.kv] == [
        ("a_key_in", "a_value_out"),
        ("b_key_in", "b_value_out"),
    ]
    assert dec.node_layer["/model/layers.1/attn/GroupQueryAttention"] == 1
    assert "/model/embed_tokens/GatherBlockQuantized" in dec.embedding_nodes
    dims = decoder_dims(view, dec)
    # 2 * HEADS query heads and HEADS KV heads share a 3 * WIDTH projection: 4 + 2 * 2 heads of 24 / 8
    assert (dims.attention_heads, dims.kv_heads, dims.head_size) == (
        2 * HEADS,
        HEADS,
        3 * WIDTH // (4 * HEADS),
    )
    assert (dims.vocab_size, dims.hidden_size) == (VOCAB, WIDTH)


def test_a_plain_export_with_unconventional_names_is_found_by_its_concats() -> None:
    view = view_from_proto(concat_decoder(names=odd_names))
    dec = find_decoder(view)
    assert dec is not None
    assert [(p.layer, p.past_key, p.past_value) for p in dec.kv] == [
        (0, "a_key_in", "a_value_in"),
        (1, "b_key_in", "b_value_in"),
    ]


def test_no_decoder_without_a_token_input() -> None:
    """Caches alone make no decoder (a streaming model's state, a decoder fed embeddings): it takes
    token ids."""
    proto = concat_decoder()
    proto.graph.input[0].type.tensor_type.elem_type = FLOAT
    proto.graph.input[1].type.tensor_type.elem_type = FLOAT
    assert find_decoder(view_from_proto(proto)) is None


# ------------------------------------------------------------------------ the model's config beside it


def _saved(tmp_path: Path, files: dict[str, object]) -> Path:
    """The hand-built decoder saved as ``model.onnx`` with ``files`` (JSON, or text) beside it."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    onnx.save(concat_decoder(), str(tmp_path / "model.onnx"))
    for name, content in files.items():
        text = content if isinstance(content, str) else json.dumps(content)
        (tmp_path / name).write_text(text)
    return tmp_path / "model.onnx"


GENAI = {
    "model": {
        "context_length": 300,
        "eos_token_id": [3, 4],
        "vocab_size": VOCAB,
        "decoder": {"filename": "model.onnx", "num_hidden_layers": LAYERS},
    }
}
HF = {
    "model_type": "llama",
    "vocab_size": VOCAB,
    "num_hidden_layers": LAYERS,
    "max_position_embeddings": 200,
    "eos_token_id": 5,
}


def test_the_genai_config_beside_the_model_comes_first(tmp_path: Path) -> None:
    path = _saved(tmp_path, {"genai_config.json": GENAI, "config.json": HF})
    found = config_beside(path)
    assert found.config is not None and found.config.path.name == "genai_config.json"
    assert found.config.tokens is not None and found.config.tokens.eos == (3, 4)
    view = load_model(path)
    dec = find_decoder(view)
    assert dec is not None
    context = own_context(view, dec)
    assert context is not None and (context.tokens, context.source) == (300, "genai_config.json")


def test_a_config_of_another_file_or_that_cannot_be_read_is_set_aside_with_a_note(tmp_path: Path) -> None:
    other = {"model": {**GENAI["model"], "decoder": {"filename": "other.onnx"}}}
    path = _saved(tmp_path, {"genai_config.json": other, "config.json": HF})
    found = config_beside(path)
    assert found.config is not None and found.config.path.name == "config.json"
    assert found.notes == ("genai_config.json beside the model is for other.onnx, not model.onnx: not read",)
    (tmp_path / "config.json").write_text("{oops")
    found = config_beside(path)
    assert (
        found.config is None and "config.json beside the model is not read: not valid JSON" in found.notes[1]
    )


def test_the_generation_config_gives_the_eos_ids_generation_stops_at(tmp_path: Path) -> None:
    path = _saved(
        tmp_path, {"config.json": HF, "generation_config.json": {"eos_token_id": [5, 7], "bos_token_id": 1}}
    )
    config = read_source_config(path.parent / "config.json")
    assert config.tokens is not None and (config.tokens.bos, config.tokens.eos, config.tokens.pad) == (
        1,
        (5, 7),
        5,
    )
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": "x"}')
    with pytest.raises(UsageError, match=r"generation_config\.json: eos_token_id: expected a token id"):
        read_source_config(path.parent / "config.json")


def test_a_config_beside_the_model_that_contradicts_its_graph_is_not_read(tmp_path: Path) -> None:
    path = _saved(tmp_path, {"config.json": {**HF, "num_hidden_layers": 7}})
    view = load_model(path)
    dec = find_decoder(view)
    assert dec is not None
    assert own_context(view, dec) is None  # 200 positions of another model do not count


# ------------------------------------------------------------------------------------ tokenizer files


def test_tokenizer_files_and_the_chat_template_wherever_it_is(tmp_path: Path) -> None:
    assert tokenizer_files(tmp_path) == () and not has_tokenizer(tmp_path) and chat_template(tmp_path) is None
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {"chat_template": [{"name": "tool", "template": "T"}, {"name": "default", "template": "D"}]}
        )
    )
    (tmp_path / "extra.jinja").write_text("E")
    (tmp_path / "weights.bin").write_text("not a tokenizer file")
    assert [p.name for p in tokenizer_files(tmp_path)] == [
        "tokenizer.json",
        "tokenizer_config.json",
        "extra.jinja",
    ]
    assert has_tokenizer(tmp_path)
    assert chat_template(tmp_path) == ("D", "tokenizer_config.json")
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "J"}))
    assert chat_template(tmp_path) == ("J", "chat_template.json")
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    assert chat_template(tmp_path) == ("{{ messages }}", "chat_template.jinja")


def test_the_config_one_folder_up_serves_the_onnx_layout_and_the_note_says_where_it_looked(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    path = _saved(repo / "onnx", {})
    found = config_beside(path)
    assert found.config is None
    assert found.notes == (
        f"no genai_config.json or config.json beside the model ({repo / 'onnx'}) or one folder up ({repo})",
    )
    (repo / "config.json").write_text(json.dumps(HF))
    (repo / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 7]}))
    found = config_beside(path)
    assert found.config is not None and found.config.path == repo / "config.json"
    assert found.config.tokens is not None and found.config.tokens.eos == (5, 7)
    view = load_model(path)
    dec = find_decoder(view)
    assert dec is not None
    assert f"config config.json one folder up ({repo})" in decoder_facts(view, dec).describe()
    beside = {
        "model": {**GENAI["model"], "decoder": {"filename": "onnx/model.onnx", "num_hidden_layers": LAYERS}}
    }
    (repo / "genai_config.json").write_text(json.dumps(beside))  # GenAI names the file from its own folder
    found = config_beside(path)
    assert found.config is not None and found.config.path == repo / "genai_config.json"
    _saved(repo / "onnx", {"config.json": HF})  # the model's own folder comes first
    assert config_beside(path).config == read_source_config(repo / "onnx" / "config.json")
