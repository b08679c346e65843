"""No shape value and no constant-only value crosses a cut: the stages recompute them (issue 18).

Over the corpus (the ``onnx`` package's CNN layouts, the registry's models, the torch exports) and the
sample models: every stage count the planner is asked for, and the stage files of a few splits, which
must still compute what the whole model does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from onnx import TensorProto, helper

from onnxpipe.api import VerifyOptions, verify
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.source import get_profile
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.load import load_model, view_from_proto
from onnxpipe.ir.shapevalues import constant_only, shape_values, value_kinds
from onnxpipe.planning.planner import plan
from onnxpipe.planning.request import PlanRequest
from tools import corpus

STAGE_COUNTS = (2, 3, 5)


def crossing(path: Path, ks: tuple[int, ...] = STAGE_COUNTS) -> dict[int, list[tuple[int, str]]]:
    """For each K, the (stage, tensor) pairs a stage receives that are shape or constant-only values."""
    view = load_model(path)
    kinds = value_kinds(view)
    prof = get_profile(view, ProfileOptions(cost="static"))
    found: dict[int, list[tuple[int, str]]] = {}
    for k in ks:
        if k > len(view.compute_nodes):
            continue
        p = plan(view, prof, PlanRequest(k))
        found[k] = [(s.index, t) for s in p.stages for t in s.inputs if kinds.recomputable(t)]
        assert not any(s.crossing_shape_values for s in p.stages)
    return found


def test_finds_shape_values_and_constant_only_values() -> None:
    """A Reshape's computed shape is a shape value, ``Unsqueeze(weight)`` a constant-only one."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["b"], name="gather", axis=0),
        helper.make_node("Unsqueeze", ["b", "axes"], ["b1"], name="unsq"),
        helper.make_node("Concat", ["b1", "minus1"], ["target"], name="concat", axis=0),
        helper.make_node("Unsqueeze", ["w", "axes"], ["w1"], name="unsq_w"),
        helper.make_node("Mul", ["x", "w1"], ["y"], name="mul"),
        helper.make_node("Reshape", ["y", "target"], ["z"], name="reshape"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [
            helper.make_tensor("zero", TensorProto.INT64, [], [0]),
            helper.make_tensor("axes", TensorProto.INT64, [1], [0]),
            helper.make_tensor("minus1", TensorProto.INT64, [1], [-1]),
            helper.make_tensor("w", TensorProto.FLOAT, [4], [1.0, 2.0, 3.0, 4.0]),
        ],
    )
    view = view_from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert shape_values(view) == {"s", "b", "b1", "target"}
    assert constant_only(view) == {"w1"}


@pytest.mark.corpus
@pytest.mark.parametrize("name", corpus.onnx_light_names())
def test_light_models(name: str, light_model: Callable[[str], Path]) -> None:
    found = crossing(light_model(name))
    assert all(v == [] for v in found.values()), found


@pytest.mark.corpus
@pytest.mark.parametrize(
    "fixture",
    ["rapidocr_det_path", "rapidocr_rec_path", "rapidocr_cls_path", "nudenet_path", "iris_path"],
)
def test_registry_models(fixture: str, request: pytest.FixtureRequest) -> None:
    found = crossing(request.getfixturevalue(fixture))
    assert all(v == [] for v in found.values()), found


@pytest.mark.parametrize("name", ["mlp.onnx", "resnet_tiny.onnx", "transformer_tiny.onnx"])
def test_sample_models(name: str, sample_models_dir: Path) -> None:
    found = crossing(sample_models_dir / name)
    assert all(v == [] for v in found.values()), found


@pytest.mark.corpus
@pytest.mark.slow
@pytest.mark.parametrize(
    "fixture", ["gpt2_tiny_path", "gpt2_tiny_dynamo_path", "bert_tiny_path", "bert_tiny_dynamo_path"]
)
def test_torch_exports(fixture: str, request: pytest.FixtureRequest) -> None:
    found = crossing(request.getfixturevalue(fixture), (3, 5))
    assert all(v == [] for v in found.values()), found


@pytest.mark.corpus
def test_inception_v2_stages_recompute_and_match(light_model: Callable[[str], Path], tmp_path: Path) -> None:
    """Inception v2 sent up to 132 ``Unsqueeze(initializer)`` tensors across its cuts; now its stages make
    them, the plan says so, no stage file receives one, and the chain still equals the model."""
    path = light_model("inception_v2")
    view = load_model(path)
    prof = get_profile(view, ProfileOptions(cost="static"))
    p = plan(view, prof, PlanRequest(4))
    assert sum(len(s.recomputed_nodes) for s in p.stages) > 0
    assert any("recomputed there" in n for n in p.notes)
    manifest = export_stages(view, p, tmp_path / "s")
    kinds = value_kinds(view)
    assert not [i.name for s in manifest.stages for i in s.inputs if kinds.recomputable(i.name)]
    report = verify(tmp_path / "s", VerifyOptions(runs=1))
    assert report.ok, report.summary()


def test_transformer_stages_read_shapes_off_what_they_have(sample_models_dir: Path, tmp_path: Path) -> None:
    """The sample transformer's stages recompute its Reshape targets, their ``Shape`` reading a tensor
    of the same shape that the stage has, and the chain equals the model."""
    view = load_model(sample_models_dir / "transformer_tiny.onnx")
    prof = get_profile(view, ProfileOptions(cost="static"))
    p = plan(view, prof, PlanRequest(5))
    assert any(s.shape_sources or s.recomputed_nodes for s in p.stages)
    export_stages(view, p, tmp_path / "s")
    report = verify(tmp_path / "s", VerifyOptions(runs=1))
    assert report.ok, report.summary()
