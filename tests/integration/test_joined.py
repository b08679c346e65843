"""A text model that takes ``inputs_embeds`` joined with its embedding model (:mod:`onnxpipe.ir.joined`), on
hand-built models: one graph from the token ids, names that clash renamed, the embedding's other inputs fed
empty; an embedding model that does not fit refused in one line naming both files."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.api import PlanOptions, SplitOptions, plan, run, split
from onnxpipe.core.choices import CostSource
from onnxpipe.core.errors import ModelLoadError, UsageError
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.ir.joined import join_embedding, named_embedding, runnable_file
from onnxpipe.ir.load import load_model
from onnxpipe.planning.request import PlanRequest
from onnxpipe.runtime.generation.feeds import Embedding
from onnxpipe.runtime.options import RunOptions

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
    whole = ort.InferenceSession(str(runnable_file(text, emb)), providers=["CPUExecutionProvider"])
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


def _model(
    path: Path,
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    opset: int,
    **weights: np.ndarray,
) -> Path:
    """A model of ``nodes`` from ``inputs`` to ``inputs_embeds`` [b, s, HIDDEN], at ``opset``."""
    out = helper.make_tensor_value_info("inputs_embeds", TensorProto.FLOAT, ["b", "s", HIDDEN])
    initializers = [numpy_helper.from_array(v, n) for n, v in weights.items()]
    graph = helper.make_graph(nodes, "embedding", inputs, [out], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


IDS = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])


def _run(proto: onnx.ModelProto, ids: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"input_ids": ids})[0])


def test_an_embedding_model_of_another_opset_is_converted_or_refused_naming_both(tmp_path: Path) -> None:
    """Squeeze's axes are an attribute at opset 11 and an input at 17: joined as it is, the graph would not
    run; converted to the text model's opset, it does."""
    text = text_model(tmp_path / "text.onnx")  # opset 17
    nodes = [
        helper.make_node("Gather", ["W", "input_ids"], ["rows"]),
        helper.make_node("Unsqueeze", ["rows"], ["wide"], axes=[0]),
        helper.make_node("Squeeze", ["wide"], ["inputs_embeds"], axes=[0]),
    ]
    old = _model(tmp_path / "old.onnx", nodes, [IDS], 11, W=TABLE)
    joined = join_embedding(onnx.load(str(text)), text, old).proto
    assert {o.domain: o.version for o in joined.opset_import}[""] == 17
    ids = np.array([[3, 7, 1]], dtype=np.int64)
    np.testing.assert_allclose(_run(joined, ids), TABLE[ids] @ HEAD, rtol=1e-6)
    # LayerNormalization is an op of opset 17: no converter takes it down to 13
    low = tmp_path / "low.onnx"
    model = onnx.load(str(text))
    model.opset_import[0].version = 13
    onnx.save(model, str(low))
    ones = np.ones(HIDDEN, np.float32)
    norm = [
        helper.make_node("Gather", ["W", "input_ids"], ["rows"]),
        helper.make_node("LayerNormalization", ["rows", "scale", "bias"], ["inputs_embeds"], axis=-1),
    ]
    new = _model(tmp_path / "new.onnx", norm, [IDS], 17, W=TABLE, scale=ones, bias=0 * ones)
    with pytest.raises(UsageError) as e:
        join_embedding(onnx.load(str(low)), low, new)
    assert str(e.value).startswith(f"{new} (opset 17) cannot be converted to the opset of {low} (opset 13)")
    assert "\n" not in str(e.value)


def test_the_joined_graph_is_checked_when_loaded(tmp_path: Path) -> None:
    text = text_model(tmp_path / "text.onnx")
    nodes = [
        helper.make_node("Gather", ["W", "input_ids"], ["rows"]),
        helper.make_node("NoSuchOp", ["rows"], ["inputs_embeds"]),
    ]
    bad = _model(tmp_path / "bad.onnx", nodes, [IDS], 17, W=TABLE)
    with pytest.raises(ModelLoadError, match=r"text.onnx: fails the ONNX checker: .*NoSuchOp"):
        load_model(text, embedding=bad)
    assert load_model(text, embedding=bad, check=False).inputs == ("input_ids",)


def test_a_joined_graph_over_protobuf_s_limit_is_checked_with_its_weights_as_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a text model and its embedding model, each under 2 GB in one file, joined over it: the
    checker was handed the whole graph and protobuf's size error came out as a traceback.  The limit is
    lowered here, and the checker refuses what is over it as protobuf does (a ``ValueError``)."""
    text, emb = text_model(tmp_path / "text.onnx"), embedding_model(tmp_path / "embedding.onnx")
    limit = join_embedding(onnx.load(str(text)), text, emb).proto.ByteSize() - 1  # just under the joined
    checker = onnx.checker.check_model

    def check_within_limit(model: onnx.ModelProto | str, *args: object, **kwargs: object) -> None:
        if isinstance(model, onnx.ModelProto) and model.ByteSize() > limit:
            raise ValueError(f"Message onnx.ModelProto exceeds maximum protobuf size of {limit}")
        checker(model, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("onnxpipe.ir.load.PROTOBUF_LIMIT", limit)
    monkeypatch.setattr(onnx.checker, "check_model", check_within_limit)
    view = load_model(text, embedding=emb)
    assert view.inputs == ("input_ids",) and view.embedding == emb


def test_weights_listed_as_inputs_and_empty_names_are_not_inputs_or_clashes(tmp_path: Path) -> None:
    """An older export lists its weights among its inputs: they stay weights, not inputs fed empty; an
    unnamed node and a Clip's missing ``min`` (an empty name) are no names that clash."""
    text = tmp_path / "text.onnx"
    embeds = helper.make_tensor_value_info("inputs_embeds", TensorProto.FLOAT, ["b", "s", HIDDEN])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", OUT])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["inputs_embeds", "H"], ["logits"])],  # unnamed
        "text",
        [embeds],
        [logits],
        [numpy_helper.from_array(HEAD, "H")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(text))
    table = helper.make_tensor_value_info("W", TensorProto.FLOAT, [VOCAB, HIDDEN])
    nodes = [
        helper.make_node("Gather", ["W", "input_ids"], ["rows"]),  # unnamed too
        helper.make_node("Clip", ["rows", "", "top"], ["inputs_embeds"]),
    ]
    emb = _model(tmp_path / "old.onnx", nodes, [IDS, table], 17, W=TABLE, top=np.array(0.5, np.float32))
    joined = join_embedding(onnx.load(str(text)), text, emb)
    onnx.checker.check_model(joined.proto, full_check=True)
    assert "fed empty" not in joined.note
    names = [t.name for t in joined.proto.graph.initializer]
    assert sorted(names) == ["H", "W", "top"] and [n.name for n in joined.proto.graph.node] == ["", "", ""]
    assert list(joined.proto.graph.node[1].input) == ["rows", "", "top"]
    ids = np.array([[3, 7, 1]], dtype=np.int64)
    np.testing.assert_allclose(_run(joined.proto, ids), np.minimum(TABLE[ids], 0.5) @ HEAD, rtol=1e-6)


def test_inputs_besides_the_ids_are_fed_empty_at_their_type_and_rank_by_one_rule(tmp_path: Path) -> None:
    """The join and the driver's embedding session feed the others alike: no rows, at the input's own
    type; one of unknown rank has no elements; a non-float one is refused by both."""
    text = text_model(tmp_path / "text.onnx")
    image = helper.make_tensor_value_info("image_features", TensorProto.FLOAT16, ["n", HIDDEN])
    loose = helper.make_tensor_value_info("loose", TensorProto.FLOAT, None)
    gather = [helper.make_node("Gather", ["W", "input_ids"], ["inputs_embeds"])]
    emb = _model(tmp_path / "emb.onnx", gather, [IDS, image, loose], 17, W=TABLE)
    joined = join_embedding(onnx.load(str(text)), text, emb)
    fed = {t.name: (list(t.dims), t.data_type) for t in joined.proto.graph.initializer if "W" not in t.name}
    assert fed == {"image_features": ([0, HIDDEN], TensorProto.FLOAT16), "loose": ([0], TensorProto.FLOAT)}
    ids = np.array([[3, 7]], dtype=np.int64)
    np.testing.assert_allclose(Embedding(emb)(ids), TABLE[ids], rtol=1e-6)  # float16 fed as float16
    mask = helper.make_tensor_value_info("pixel_mask", TensorProto.BOOL, ["n"])
    other = _model(tmp_path / "other.onnx", gather, [IDS, mask], 17, W=TABLE)
    for refuse in (lambda: join_embedding(onnx.load(str(text)), text, other), lambda: Embedding(other)):
        with pytest.raises(UsageError, match=r"other.onnx: an embedding model takes the token ids"):
            refuse()


def merged_text_model(path: Path) -> Path:
    """:func:`text_model` as optimum merges a decoder: one If on ``use_cache_branch``, its with-past branch
    reading ``inputs_embeds``, the mask and the cache ``past`` (passed on as ``present``), the other the mask
    only (an integer input, as a merged decoder's first step reads)."""
    floats = ["b", "s", HIDDEN]
    embeds = helper.make_tensor_value_info("inputs_embeds", TensorProto.FLOAT, floats)
    past = helper.make_tensor_value_info("past", TensorProto.FLOAT, ["b", "p", HIDDEN])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "t"])
    flag = helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", OUT])
    present = helper.make_tensor_value_info("present", TensorProto.FLOAT, ["b", "p", HIDDEN])

    def branch(name: str, nodes: list[onnx.NodeProto], outputs: tuple[str, str]) -> onnx.GraphProto:
        made = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["x", "y", "z"]) for n in outputs]
        return helper.make_graph(nodes, name, [], made)

    with_past = branch(
        "with_past",
        [
            helper.make_node("MatMul", ["inputs_embeds", "W"], ["l1"]),
            helper.make_node("Identity", ["past"], ["p1"]),
            helper.make_node("Cast", ["attention_mask"], ["unused"], to=TensorProto.FLOAT),
        ],
        ("l1", "p1"),
    )
    first = branch(
        "first",
        [
            helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["m", "axes"], ["l0"]),
            helper.make_node("Identity", ["l0"], ["p0"]),
        ],
        ("l0", "p0"),
    )
    node = helper.make_node(
        "If", ["use_cache_branch"], ["logits", "present"], then_branch=with_past, else_branch=first
    )
    graph = helper.make_graph(
        [node],
        "merged",
        [embeds, past, mask, flag],
        [logits, present],
        [numpy_helper.from_array(HEAD, "W"), numpy_helper.from_array(np.array([2]), "axes")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_the_file_a_whole_model_worker_opens_unwraps_a_merged_decoder_before_joining(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    text, emb = merged_text_model(tmp_path / "merged.onnx"), embedding_model(tmp_path / "embedding.onnx")
    view = load_model(text, embedding=emb)
    made = runnable_file(text, emb)
    written = onnx.load(str(made))
    assert (
        [i.name for i in written.graph.input] == list(view.inputs) == ["input_ids", "past", "attention_mask"]
    )
    ids = np.array([[3, 7, 1]], dtype=np.int64)
    feeds = {"input_ids": ids, "past": np.zeros((1, 0, HIDDEN), np.float32), "attention_mask": ids}
    whole = ort.InferenceSession(str(made), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(whole.run(["logits"], feeds)[0], TABLE[ids] @ HEAD, rtol=1e-6)


def test_run_builds_the_whole_model_file_only_to_compare_and_a_plan_says_where_the_embedding_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run`` without ``--compare`` feeds random token ids made from the model as split (its weights left
    on disk) and writes no joined file; the plan's note on the embedding model of a graph that is no
    decoder says nothing of ``--ends``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    text, emb = text_model(tmp_path / "text.onnx"), embedding_model(tmp_path / "embedding.onnx")
    out = tmp_path / "split"
    request, static = PlanRequest(2), ProfileOptions(cost=CostSource.STATIC)
    result = split(text, SplitOptions(out=out, plan=request, profile=static, embedding=emb, verify=False))
    note = "the embedding model embedding.onnx runs in stage 0 on worker 0, with 1 node(s): where the balance"
    assert [n for n in result.plan.notes if "runs in stage" in n] == [
        f"{note} put it; the split takes the token ids 'input_ids'"
    ]
    planned = plan(text, PlanOptions(plan=request, profile=static, embedding=emb)).plan
    assert [n for n in planned.notes if n.startswith(note)] == [
        n for n in result.plan.notes if n.startswith(note)
    ]
    report = run(out, RunOptions(microbatches=2, warmup=0))
    assert report.outputs_match is None and not list((tmp_path / "tmp").glob("onnxpipe-*"))
    report = run(out, RunOptions(microbatches=2, warmup=0, compare=True))
    assert report.outputs_match and len(list((tmp_path / "tmp" / "onnxpipe-unwrapped").iterdir())) == 1
