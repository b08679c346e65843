"""``split --static``: the given shapes frozen, stale value_info dropped, shape arithmetic folded
(:mod:`onnxpipe.ir.static`, :mod:`onnxpipe.ir.fold`) (issue 18)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from models import const, make, vi
from onnx import helper

from onnxpipe.api import PlanRequest, SplitOptions, split
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.ir.fold import fold_constants
from onnxpipe.ir.load import load_model
from onnxpipe.ir.static import freeze_shapes
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
