"""optimum's merged decoder unwrapped to its with-past branch
(:func:`onnxpipe.ir.joined.unwrap_merged_decoder`), and the ``If`` models it leaves alone, on the hand-built
decoders of ``tests/decoder_models.py`` merged as optimum's ``merge_decoders`` does
(``tools/export_decoders.py``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from decoder_models import HEAD_DIM, HEADS, LAYERS, concat_decoder
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.joined import runnable_file, unwrap_merged_decoder
from onnxpipe.ir.load import load_model, view_from_proto
from tools.export_decoders import merge_decoders


def no_past(with_past: onnx.ModelProto) -> onnx.ModelProto:
    """``with_past`` taking no cache: each past an empty initializer (the first step's decoder)."""
    out = onnx.ModelProto()
    out.CopyFrom(with_past)
    pasts = [vi for vi in out.graph.input if vi.name.startswith("past_key_values.")]
    for vi in pasts:
        out.graph.input.remove(vi)
        empty = np.zeros((1, HEADS, 0, HEAD_DIM), dtype=np.float32)
        out.graph.initializer.append(numpy_helper.from_array(empty, vi.name))
    return out


def test_the_with_past_branch_becomes_the_graph() -> None:
    with_past = concat_decoder()
    merged = merge_decoders(no_past(with_past), with_past)
    assert [n.op_type for n in merged.graph.node] == ["If"]
    unwrapped = unwrap_merged_decoder(merged)
    assert unwrapped is not None
    graph = unwrapped.proto.graph
    assert [vi.name for vi in graph.input] == [vi.name for vi in with_past.graph.input]  # the flag dropped
    assert [o.name for o in graph.output] == [o.name for o in with_past.graph.output]
    assert [n.op_type for n in graph.node] == [n.op_type for n in with_past.graph.node]
    # the weights the branch reads, hoisted and renamed by the merge, are its initializers again
    assert {t.name for t in graph.initializer} >= {"wk0_merged_1", "embed_merged_1", "split_shape"}
    assert "use_cache_branch" in unwrapped.note and "with-past branch" in unwrapped.note
    onnx.checker.check_model(unwrapped.proto)
    dec = find_decoder(view_from_proto(unwrapped.proto))
    assert dec is not None and dec.layers == LAYERS


def test_the_loader_notes_what_it_unwrapped(tmp_path: Path) -> None:
    with_past = concat_decoder()
    path = tmp_path / "decoder_model_merged.onnx"
    onnx.save(merge_decoders(no_past(with_past), with_past), str(path))
    view = load_model(path)
    assert view.rewritten and view.notes and view.notes[-1].startswith("merged decoder unwrapped")
    assert isinstance(view.session_source(), bytes)  # what onnxruntime runs is the unwrapped graph
    plain = tmp_path / "decoder_with_past_model.onnx"
    onnx.save(with_past, str(plain))
    assert load_model(plain).session_source() == plain and not load_model(plain).rewritten


def test_a_file_of_the_unwrapped_model_for_whole_model_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker running the whole model opens a file: the with-past branch's, written once, weights in."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    with_past = concat_decoder()
    plain, merged = tmp_path / "decoder_with_past_model.onnx", tmp_path / "decoder_model_merged.onnx"
    onnx.save(with_past, str(plain))
    onnx.save(merge_decoders(no_past(with_past), with_past), str(merged))
    assert runnable_file(plain) == plain
    made = runnable_file(merged)
    assert made.parent.parent == tmp_path / "tmp" / "onnxpipe-unwrapped" and made.name == merged.name
    written = onnx.load(str(made))
    assert [vi.name for vi in written.graph.input] == [vi.name for vi in with_past.graph.input]
    assert {t.name for t in written.graph.initializer} >= {"embed_merged_1", "lm_w_merged_1"}
    onnx.checker.check_model(written)
    mtime = made.stat().st_mtime_ns
    assert runnable_file(merged) == made and made.stat().st_mtime_ns == mtime  # written once


def _if_model(
    then_reads: str, else_reads: str, cond_type: int = TensorProto.BOOL, a_type: int = TensorProto.INT64
) -> onnx.ModelProto:
    """One If on the graph input ``flag`` whose branches return the sum of the graph inputs they read
    (``"ab"``: a + b), in outputs named otherwise than the If's."""

    def body(name: str, reads: str) -> onnx.GraphProto:
        node = helper.make_node("Sum", list(reads), [f"{name}_y"])
        return helper.make_graph([node], name, [], [helper.make_tensor_value_info(f"{name}_y", a_type, [2])])

    node = helper.make_node(
        "If", ["flag"], ["y"], then_branch=body("then", then_reads), else_branch=body("else", else_reads)
    )
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("a", a_type, [2]),
            helper.make_tensor_value_info("b", a_type, [2]),
            helper.make_tensor_value_info("flag", cond_type, [1]),
        ],
        [helper.make_tensor_value_info("y", a_type, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_if_is_unwrapped_only_when_one_branch_reads_inputs_the_other_does_not() -> None:
    assert unwrap_merged_decoder(_if_model("a", "b")) is None  # neither reads a subset of the other's
    assert unwrap_merged_decoder(_if_model("a", "a")) is None  # the same inputs: a real choice
    assert unwrap_merged_decoder(_if_model("a", "a", TensorProto.INT64)) is None  # no boolean flag
    assert unwrap_merged_decoder(concat_decoder()) is None  # no If at all
    # the first step reads a float (an encoder's output, as Whisper's merged decoder): left whole
    assert unwrap_merged_decoder(_if_model("a", "ab", a_type=TensorProto.FLOAT)) is None
    unwrapped = unwrap_merged_decoder(_if_model("a", "ab"))
    assert unwrapped is not None  # the else branch reads b too: it is taken
    graph = unwrapped.proto.graph
    assert [(n.op_type, list(n.input), list(n.output)) for n in graph.node] == [
        ("Sum", ["a", "b"], ["else_y"]),
        ("Identity", ["else_y"], ["y"]),  # the If's output name kept
    ]
    assert [vi.name for vi in graph.input] == ["a", "b"]
