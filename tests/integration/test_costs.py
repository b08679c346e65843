"""Unit tests of onnxpipe.cost.static: hand-computed FLOPs, concrete shapes, the static profile."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from models import const, shape_arithmetic_model, vi, view_of
from onnx import TensorProto, helper

from onnxpipe.cost.static import (
    static_profile,
)
from onnxpipe.ir.load import load_model, view_from_proto
from onnxpipe.ir.static import concrete_shapes


def _true_values(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every node output as onnxruntime computes it."""
    import onnxruntime as ort

    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    names = [t for n in model.graph.node for t in n.output]
    del exposed.graph.output[:]
    exposed.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in names)
    session = ort.InferenceSession(exposed.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, feeds), strict=True))


def test_shapes_of_torch_style_shape_arithmetic_are_settled() -> None:
    model = shape_arithmetic_model()
    true = {t: a.shape for t, a in _true_values(model, {"x": np.ones((2, 7), np.float32)}).items()}
    notes: list[str] = []
    shapes = concrete_shapes(view_from_proto(model), {"x": (2, 7)}, notes)
    assert {t: shapes[t] for t in true} == true
    assert shapes["p"] == (1, 7) and notes == []


@pytest.mark.slow
@pytest.mark.parametrize(
    "fixture",
    [
        "gpt2_tiny_path",
        pytest.param("gpt2_tiny_dynamo_path", marks=pytest.mark.exhaustive),
        pytest.param("bert_tiny_path", marks=pytest.mark.exhaustive),
        "bert_tiny_dynamo_path",
    ],
)
def test_torch_exports_get_the_shapes_onnxruntime_computes(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    """Before the symbolic second opinion, 91-108 of these models' tensors had a wrong static size (a
    BERT's attention masks, a GPT-2's causal mask and position ids); now every one has the true size."""
    from onnxpipe.ir.feeds import random_feeds

    path: Path = request.getfixturevalue(fixture)
    view = load_model(path)
    inputs = {name: (4, 32) for name in view.inputs}
    values = _true_values(onnx.load(path), dict(random_feeds(view, inputs)))
    notes: list[str] = []
    shapes = concrete_shapes(view, inputs, notes)
    assert {t: shapes.get(t) for t in values} == {t: a.shape for t, a in values.items()}
    assert notes == []
    profile = static_profile(view, shapes=inputs)
    assert {t: profile.tensor_bytes.get(t) for t in values} == {t: a.nbytes for t, a in values.items()}


def test_a_dim_that_may_be_1_at_run_time_is_not_merged_into_a_wrong_size() -> None:
    """``NonZero``'s count broadcast against a row of 7: merged, the tool would call the count 7."""
    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"], name="nz"),
        helper.make_node("Cast", ["nz"], ["nzf"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Add", ["nzf", "row"], ["y"], name="add"),
    ]
    view = view_of(nodes, [vi("x", [3])], [vi("y", None)], [const("row", np.ones((1, 7)))])
    true = _true_values(view.proto, {"x": np.array([0, 1, 0], np.float32)})
    assert true["nz"].shape == (1, 1)
    notes: list[str] = []
    shapes = concrete_shapes(view, {"x": (3,)}, notes)
    assert shapes["nz"] == (1, 1)  # the unknown count sized as 1, as without the tool
    assert len(notes) == 1 and "nz" in notes[0].split("(e.g. ")[1]
