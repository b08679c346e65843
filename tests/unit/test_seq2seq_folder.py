"""An encoder-decoder folder read without its graphs: where its configs are found, the start tokens
``forced_decoder_ids`` gives, the merged-file hint; and the cross cache's slice on hand-made graphs (the
exported Whisper folders are in tests/integration/test_seq2seq.py)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from onnxpipe.core.errors import UsageError
from onnxpipe.core.model_config import read_source_config
from onnxpipe.ir.seq2seq import ENCODER, ENCODER_OUTPUT, MERGED, _slice, family_hint, find_seq2seq


def _hub_layout(tmp_path: Path) -> Path:
    """onnx-community's layout: the graphs in ``onnx/`` (empty files here: only their names are read),
    the configs at the repository's root."""
    folder = tmp_path / "repo" / "onnx"
    folder.mkdir(parents=True)
    for name in (ENCODER, MERGED):
        (folder / name).touch()
    return folder


def _write(path: Path, config: object) -> None:
    path.write_text(json.dumps(config), encoding="utf-8")


def test_configs_are_found_beside_the_files_or_one_folder_up(tmp_path: Path) -> None:
    folder = _hub_layout(tmp_path)
    with pytest.raises(UsageError, match=r"no decoder_start_token_id .* one folder up \(.*repo\)"):
        find_seq2seq(folder)
    _write(folder.parent / "config.json", {"decoder_start_token_id": 5, "eos_token_id": [6, 7]})
    _write(folder / "generation_config.json", {"forced_decoder_ids": [[2, 9], [1, 8]]})
    found = find_seq2seq(folder)
    assert found is not None and found.merged
    assert (found.start_ids, found.eos_ids, found.notes) == ((5, 8, 9), (6, 7), ())
    assert found.configs == (folder.parent / "config.json", folder / "generation_config.json")
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        (folder.parent / name).touch()
    assert {p.relative_to(tmp_path).as_posix() for p in found.side_files} == {
        "repo/config.json",
        "repo/onnx/generation_config.json",
        "repo/tokenizer.json",
        "repo/vocab.json",
        "repo/merges.txt",
    }
    (folder / "tokenizer.json").touch()  # a tokenizer beside the files is theirs
    assert {p.relative_to(folder.parent).as_posix() for p in found.side_files} == {
        "config.json",
        "onnx/generation_config.json",
        "onnx/tokenizer.json",
    }


@pytest.mark.parametrize(
    ("forced", "start", "position"),
    [([[1, None], [2, 50360]], (5,), 1), ([[1, 8], [3, 9]], (5, 8), 2)],  # whisper-large-v3's; a gap
)
def test_forced_ids_start_each_sequence_up_to_the_first_position_forcing_none(
    tmp_path: Path, forced: list[list[int | None]], start: tuple[int, ...], position: int
) -> None:
    folder = _hub_layout(tmp_path)
    _write(
        folder.parent / "generation_config.json", {"decoder_start_token_id": 5, "forced_decoder_ids": forced}
    )
    found = find_seq2seq(folder)
    assert found is not None and found.start_ids == start
    assert found.notes == (
        f"generation_config.json: forced_decoder_ids forces no token at position {position}: each sequence "
        f"starts with the {position} token(s) before it and the model chooses the rest (the later forced "
        "tokens are not forced)",
    )


@pytest.mark.parametrize("forced", [[[1, "a"]], [1, 2], {"1": 2}])
def test_malformed_forced_ids_are_refused_naming_the_file(tmp_path: Path, forced: object) -> None:
    folder = _hub_layout(tmp_path)
    _write(folder.parent / "config.json", {"decoder_start_token_id": 5, "forced_decoder_ids": forced})
    with pytest.raises(UsageError, match=r"repo/config\.json: forced_decoder_ids is .*: give \[\[position"):
        find_seq2seq(folder)


def test_a_whisper_config_gives_its_decoders_positions_as_the_context(tmp_path: Path) -> None:
    """Whisper's ``max_target_positions`` (448) bounds the decoder's context; its encoder's
    ``max_source_positions`` does not."""
    path = tmp_path / "config.json"
    _write(path, {"model_type": "whisper", "max_source_positions": 1500, "max_target_positions": 448})
    assert read_source_config(path).context_length == 448


def test_a_merged_decoder_beside_its_encoder_is_pointed_at_its_folder(tmp_path: Path) -> None:
    folder = _hub_layout(tmp_path)
    assert (
        family_hint(folder / MERGED) == f" (an encoder-decoder's merged decoder: split its folder {folder})"
    )
    (folder / ENCODER).unlink()
    assert family_hint(folder / MERGED) == "" and family_hint(None) == ""


def _cross_key(index: onnx.NodeProto) -> onnx.GraphProto:
    """A first-step decoder's cross key as TorchScript records it: the encoder's output projected, then
    reshaped to [batch, -1, 2, 2] with the batch read off the decoder's own hidden states (``index``
    picks a dim of their shape)."""
    nodes = [
        helper.make_node("Constant", [], ["zero_node"], value_int=0),  # as TorchScript writes its indices
        helper.make_node("Gather", ["embed", "input_ids"], ["hidden"]),
        helper.make_node("Shape", ["hidden"], ["shape"]),
        index,
        helper.make_node("Unsqueeze", ["batch", "axes"], ["batch1"]),
        helper.make_node("Concat", ["batch1", "rest"], ["target"], axis=0),
        helper.make_node("MatMul", [ENCODER_OUTPUT, "w"], ["projected"]),
        helper.make_node("Reshape", ["projected", "target"], ["present.0.encoder.key"]),
    ]
    weights = [
        helper.make_tensor("embed", TensorProto.FLOAT, [8, 4], [0.0] * 32),
        helper.make_tensor("w", TensorProto.FLOAT, [4, 4], [0.0] * 16),
        helper.make_tensor("zero", TensorProto.INT64, [], [0]),
        helper.make_tensor("axes", TensorProto.INT64, [1], [0]),
        helper.make_tensor("rest", TensorProto.INT64, [3], [-1, 2, 2]),
        helper.make_tensor("starts", TensorProto.INT64, [1], [0]),
        helper.make_tensor("ends", TensorProto.INT64, [1], [1]),
    ]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info(ENCODER_OUTPUT, TensorProto.FLOAT, ["batch", "frames", 4]),
    ]
    out = helper.make_tensor_value_info("present.0.encoder.key", TensorProto.FLOAT, None)
    return helper.make_graph(nodes, "main_graph", inputs, [out], initializer=weights)


@pytest.mark.parametrize(
    "index",
    [
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Gather", ["shape", "zero_node"], ["batch"]),
        helper.make_node("Slice", ["shape", "starts", "ends"], ["batch"]),
    ],
)
def test_a_batch_read_off_the_decoders_hidden_states_is_read_off_the_encoders_output(
    index: onnx.NodeProto,
) -> None:
    graph = _cross_key(index)
    kept = _slice(graph, ["present.0.encoder.key"], Path("decoder_model.onnx"))
    ops = [n.op_type for n in kept if n.op_type != "Constant"]
    assert ops == ["Shape", index.op_type, "Unsqueeze", "Concat", "MatMul", "Reshape"]
    shape = next(n for n in kept if n.op_type == "Shape")
    assert shape.input[:] == [ENCODER_OUTPUT] and graph.node[2].input[:] == ["hidden"]  # a copy re-rooted


def test_a_cross_cache_reading_the_decoders_sequence_length_is_refused() -> None:
    graph = _cross_key(helper.make_node("Gather", ["shape", "axes"], ["batch"], axis=0))  # [0]: still dim 0
    assert _slice(graph, ["present.0.encoder.key"], Path("d.onnx"))[0].input[:] == [ENCODER_OUTPUT]
    graph.initializer.append(helper.make_tensor("one", TensorProto.INT64, [], [1]))
    graph.node[3].input[1] = "one"  # the sequence's length, which the encoder's output does not have
    with pytest.raises(UsageError, match=r"^d\.onnx: its cross-attention cache reads 'input_ids', not only"):
        _slice(graph, ["present.0.encoder.key"], Path("d.onnx"))
