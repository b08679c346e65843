"""A text model that takes ``inputs_embeds`` joined with its embedding model (:mod:`onnxpipe.ir.joined`), on
hand-built models: one graph from the token ids, names that clash renamed, the embedding's other inputs fed
empty; an embedding model that does not fit refused in one line naming both files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.core.errors import UsageError
from onnxpipe.ir.joined import join_embedding, joined_file, named_embedding
from onnxpipe.ir.load import load_model

HIDDEN, VOCAB, OUT = 4, 10, 3
RNG = np.random.default_rng(0)
TABLE = RNG.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
HEAD = RNG.standard_normal((HIDDEN, OUT)).astype(np.float32)


def text_model(path: Path) -> Path:
    """``inputs_embeds`` [b, s, HIDDEN] times the weight ``W`` (a name the embedding model uses too)."""
    embeds = helper.make_tensor_value_info("inputs_embeds", TensorProto.FLOAT, ["b", "s", HIDDEN])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", OUT])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["inputs_embeds", "W"], ["logits"], name="head")],
        "text",
        [embeds],
        [logits],
        [numpy_helper.from_array(HEAD, "W")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def embedding_model(path: Path, table: np.ndarray = TABLE, output: str = "inputs_embeds") -> Path:
    """A Gather on ``W`` (the table), with a vision input ``image_features`` it adds nothing from."""
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])
    image = helper.make_tensor_value_info("image_features", TensorProto.FLOAT, ["n", table.shape[1]])
    out = helper.make_tensor_value_info(output, TensorProto.FLOAT, ["b", "s", table.shape[1]])
    graph = helper.make_graph(
        [helper.make_node("Gather", ["W", "input_ids"], [output], name="head")],
        "embedding",
        [ids, image],
        [out],
        [numpy_helper.from_array(table, "W")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def test_one_graph_from_the_token_ids(tmp_path: Path) -> None:
    text, emb = text_model(tmp_path / "text.onnx"), embedding_model(tmp_path / "embedding.onnx")
    joined = join_embedding(onnx.load(str(text)), text, emb)
    onnx.checker.check_model(joined.proto)
    assert [i.name for i in joined.proto.graph.input] == ["input_ids"]
    assert {n.name for n in joined.proto.graph.node} == {"head", "embedding/head"}
    assert "image_features fed empty" in joined.note and "embedding.onnx joined" in joined.note
    ids = np.array([[3, 7, 1]], dtype=np.int64)
    session = ort.InferenceSession(joined.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"input_ids": ids})[0], TABLE[ids] @ HEAD, rtol=1e-6)
    view = load_model(text, embedding=emb)
    assert view.rewritten and view.embedding == emb and view.inputs == ("input_ids",)
    assert joined.note in view.notes
    whole = ort.InferenceSession(str(joined_file(text, emb)), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(whole.run(None, {"input_ids": ids})[0], TABLE[ids] @ HEAD, rtol=1e-6)


def test_an_embedding_model_that_does_not_fit_is_refused_naming_both(tmp_path: Path) -> None:
    text = text_model(tmp_path / "text.onnx")
    wide = embedding_model(tmp_path / "wide.onnx", table=np.zeros((VOCAB, 2 * HIDDEN), np.float32))
    with pytest.raises(UsageError) as e:
        join_embedding(onnx.load(str(text)), text, wide)
    assert str(e.value) == (
        f"{wide}: its output 'inputs_embeds' is {2 * HIDDEN} wide, but {text} takes 'inputs_embeds' {HIDDEN} "
        "wide; give the text model's own embedding model"
    )
    other = embedding_model(tmp_path / "other.onnx", output="embeds")
    with pytest.raises(UsageError, match=r"its outputs \(embeds\) match none of .*text.onnx's inputs"):
        join_embedding(onnx.load(str(text)), text, other)
    with pytest.raises(UsageError, match="no such embedding model file"):
        join_embedding(onnx.load(str(text)), text, tmp_path / "none.onnx")


def test_the_embedding_model_a_genai_config_beside_names(tmp_path: Path) -> None:
    text = text_model(tmp_path / "text.onnx")
    assert named_embedding(text) is None
    model = {"decoder": {"filename": "text.onnx"}, "embedding": {"filename": "embedding.onnx"}}
    (tmp_path / "genai_config.json").write_text(json.dumps({"model": model}))
    with pytest.raises(UsageError, match=r"names the embedding model embedding.onnx, which is not beside it"):
        named_embedding(text)
    embedding_model(tmp_path / "embedding.onnx")
    assert named_embedding(text) == tmp_path / "embedding.onnx"
    model["decoder"]["filename"] = "another.onnx"  # a config of another file is not this model's
    (tmp_path / "genai_config.json").write_text(json.dumps({"model": model}))
    assert named_embedding(text) is None
