"""``split --static``: the given shapes frozen, stale value_info dropped, shape arithmetic folded
(:mod:`onnxpipe.ir.static`) (issue 18)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import const, make, vi
from onnx import helper

from onnxpipe.api import PlanRequest, SplitOptions, split
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.runnable import RETRY_NOTE
from onnxpipe.ir.load import load_model
from onnxpipe.ir.shapes import RETRY_SEQUENCE_SIZE
from onnxpipe.ir.static import fold_constants, freeze_shapes
from onnxpipe.manifest import load_manifest


def test_freezing_folds_the_shape_arithmetic(sample_models_dir: Path) -> None:
    view = load_model(sample_models_dir / "transformer_tiny.onnx")
    shapes = {name: (2, 5) for name in view.inputs}
    frozen, folded = freeze_shapes(view.proto, shapes)
    ops = {n.op_type for n in frozen.graph.node}
    assert folded > 0
    assert "Shape" not in ops and "Concat" not in ops
    assert not frozen.graph.value_info
    assert [d.dim_value for d in frozen.graph.input[0].type.tensor_type.shape.dim] == [2, 5]
    assert any(n.op_type == "Shape" for n in view.proto.graph.node)  # the source is left as it was
    feeds = {name: np.arange(10, dtype=np.int64).reshape(2, 5) for name in view.inputs}
    plain = ort.SessionOptions()  # no optimizer: fixed shapes let it fuse otherwise, which rounds otherwise
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort.InferenceSession(view.proto.SerializeToString(), plain).run(None, feeds)
    got = ort.InferenceSession(frozen.SerializeToString(), plain).run(None, feeds)
    for e, g in zip(expected, got, strict=True):
        assert np.array_equal(e, g)  # only exact ops are folded: bit for bit


def test_float_arithmetic_is_not_folded() -> None:
    """``w * 3`` of weights stays a node (a runtime's float arithmetic is its own); ``Shape`` folds."""
    nodes = [
        helper.make_node("Mul", ["w", "three"], ["w3"], name="mul"),
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Reshape", ["x", "s"], ["xr"], name="reshape"),
        helper.make_node("Add", ["xr", "w3"], ["y"], name="add"),
    ]
    model = make(
        nodes,
        [vi("x", [2, 3])],
        [vi("y", [2, 3])],
        [const("w", np.ones((2, 3), np.float32)), const("three", 3.0)],
    )
    folded = fold_constants(model, {"x": (2, 3)})
    assert folded == 1
    assert [n.op_type for n in model.graph.node] == ["Mul", "Reshape", "Add"]
    assert {t.name for t in model.graph.initializer} == {"w", "three", "s"}
    onnx.checker.check_model(model)


def test_static_split_has_fixed_shapes_everywhere(sample_models_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "s"
    model = sample_models_dir / "transformer_tiny.onnx"
    name = load_model(model).inputs[0]
    opts = partial(SplitOptions, profile=ProfileOptions(cost="static", shapes={name: (3, 6)}), static=True)
    result = split(model, opts(out=out, plan=PlanRequest(3)))
    assert result.report is not None and result.report.ok
    manifest = load_manifest(out)
    for st in manifest.stages:
        for t in (*st.inputs, *st.outputs):
            assert t.shape is not None and all(isinstance(d, int) for d in t.shape), t
            assert t.profiled_shape == t.shape
        stage = onnx.load(out / st.file)
        assert "Shape" not in {n.op_type for n in stage.graph.node}
        for v in [*stage.graph.input, *stage.graph.output]:
            assert all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim), v.name
    assert manifest.model_inputs[0].shape == (3, 6)
    assert manifest.source.sha256 == load_model(model).sha256  # verified against the source file


def _squeeze_if(dims: list[int | str]) -> onnx.ModelProto:
    """torch's ``x.squeeze(0)`` of a dim it cannot prove is 1: an ``If`` on ``Shape(x)[0] == 1`` whose
    branches give tensors of different ranks (Silero VAD's decoder exports so)."""
    then = helper.make_graph(
        [helper.make_node("Squeeze", ["x", "axes"], ["sq"], name="squeeze")], "then", [], [vi("sq", None)]
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["same"], name="same")], "else", [], [vi("same", None)]
    )
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["d0"], name="d0", axis=0),
        helper.make_node("Equal", ["d0", "one"], ["is_one"], name="is_one"),
        helper.make_node("If", ["is_one"], ["picked"], name="if", then_branch=then, else_branch=other),
        helper.make_node("Relu", ["picked"], ["y"], name="relu"),
    ]
    return make(
        nodes,
        [vi("x", dims)],
        [vi("y", None)],
        [
            const("axes", np.array([0]), np.int64),
            const("zero", np.array(0), np.int64),
            const("one", 1, np.int64),
        ],
    )


def test_an_if_on_shapes_is_replaced_by_the_branch_it_takes() -> None:
    for dims, rank in (([1, 4], 1), ([3, 4], 2)):
        frozen, _ = freeze_shapes(_squeeze_if(["n", 4]), {"x": dims})
        assert [n.op_type for n in frozen.graph.node if n.op_type in ("If", "Shape")] == []
        inferred = onnx.shape_inference.infer_shapes(frozen).graph.output[0]
        assert [d.dim_value for d in inferred.type.tensor_type.shape.dim] == dims[2 - rank :]
        x = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
        expected = ort.InferenceSession(_squeeze_if(["n", 4]).SerializeToString()).run(None, {"x": x})[0]
        got = ort.InferenceSession(frozen.SerializeToString()).run(None, {"x": x})[0]
        assert np.array_equal(expected, got)
    data = _squeeze_if(["n", 4])  # an If on data is left alone
    data.graph.node[2].input[0] = "d0_data"
    data.graph.node.insert(2, helper.make_node("ReduceMax", ["x"], ["m"], name="m", keepdims=0))
    assert fold_constants(data, {"x": (1, 4)}) >= 1
    assert "If" in {n.op_type for n in data.graph.node}


def test_a_static_split_names_the_stage_outputs_whose_dims_follow_data(tmp_path: Path) -> None:
    """A ``NonZero``'s count is data: no frozen size settles it, and the plan's notes say which output
    keeps an open dim and why, instead of the docs' promise of fixed shapes going silently unkept."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("NonZero", ["r"], ["nz"], name="nonzero"),
        helper.make_node("Cast", ["nz"], ["nzf"], name="cast", to=onnx.TensorProto.FLOAT),
        helper.make_node("Neg", ["nzf"], ["y"], name="neg"),
    ]
    path = tmp_path / "nonzero.onnx"
    onnx.save(make(nodes, [vi("x", ["n", 4])], [vi("y", ["a", "b"])]), path)
    opts = SplitOptions(
        out=tmp_path / "s", plan=PlanRequest(3), profile=ProfileOptions(cost="static"), static=True
    )
    result = split(path, opts)
    assert result.report is not None and result.report.ok
    notes = [n for n in result.plan.notes if "keep dims that the frozen input sizes do not settle" in n]
    assert len(notes) == 1 and "stage 1 emits nz [2, ?]" in notes[0], result.plan.notes


@pytest.mark.corpus
@pytest.mark.slow
@pytest.mark.parametrize("static", [True, False])
def test_silero_vad_splits_at_the_size_it_runs_at(
    silero_vad_path: Path, tmp_path: Path, static: bool
) -> None:
    """Issue 31: Silero VAD fails at the guessed 1x16 samples (its reflect pad takes 64).  ``split
    --static`` and static costs now run it at 512 samples as a measured profile does, say so, and the
    static split's stages have fixed shapes everywhere: no ``Shape``, no ``If``, nothing ONNX's inference
    leaves open inside a stage (its two ``If`` nodes on shapes are replaced by the branches they take)."""
    out = tmp_path / "s"
    opts = SplitOptions(out=out, plan=PlanRequest(3), profile=ProfileOptions(cost="static"), static=static)
    result = split(silero_vad_path, opts)
    assert result.report is not None and result.report.ok
    assert result.plan.input_shapes["input"] == (1, RETRY_SEQUENCE_SIZE)
    assert any(n.startswith(RETRY_NOTE) and "post-pad" in n for n in result.plan.notes), result.plan.notes
    if not static:
        return
    for st in load_manifest(out).stages:
        assert all(t.shape is not None and all(isinstance(d, int) for d in t.shape) for t in st.outputs)
        stage = onnx.load(out / st.file)
        assert not {"Shape", "If", "Size"} & {n.op_type for n in stage.graph.node}
        inferred = onnx.shape_inference.infer_shapes(stage, data_prop=True).graph
        for v in [*inferred.value_info, *inferred.output]:
            assert all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim), (st.index, v.name)
    assert not any("do not settle" in n for n in result.plan.notes)
