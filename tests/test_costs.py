"""Unit tests of onnxpipe.costs: hand-computed FLOPs, concrete shapes, the static profile."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.costs import (
    MEMORY_BANDWIDTH,
    NODE_OVERHEAD_SECONDS,
    PEAK_FLOPS,
    concrete_shapes,
    node_bytes,
    node_flops,
    static_profile,
)
from onnxpipe.model import ModelView, load_model, view_from_proto


def _vi(name: str, shape: list[int | str] | None, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _init(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.ones(shape, np.float32), name)


def _view(nodes: list[onnx.NodeProto], inputs, outputs, inits=()) -> ModelView:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return view_from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _flops_of(view: ModelView, name: str) -> float:
    shapes = concrete_shapes(view, {i: tuple(int(d) for d in view.tensors[i].shape) for i in view.inputs})  # type: ignore[union-attr]
    return node_flops(view, view.node_by_name[name], shapes)


def test_conv_flops() -> None:
    # out (1, 4, 8, 8): each output element is a 3x3x3 dot product (27 MACs) plus the bias
    view = _view(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], name="conv")],
        [_vi("x", [1, 3, 8, 8])],
        [_vi("y", None)],
        [_init("w", (4, 3, 3, 3)), _init("b", (4,))],
    )
    assert _flops_of(view, "conv") == 2 * (4 * 8 * 8) * 27 + 4 * 8 * 8


def test_grouped_strided_conv_flops() -> None:
    # groups=2: each output channel sees 4/2 input channels; stride 2 -> out (2, 6, 4, 4)
    view = _view(
        [
            helper.make_node(
                "Conv", ["x", "w"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1], group=2, name="conv"
            )
        ],
        [_vi("x", [2, 4, 8, 8])],
        [_vi("y", None)],
        [_init("w", (6, 2, 3, 3))],
    )
    assert _flops_of(view, "conv") == 2 * (2 * 6 * 4 * 4) * (2 * 3 * 3)


def test_matmul_flops_with_batch() -> None:
    view = _view(
        [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
        [_vi("a", [2, 3, 4])],
        [_vi("y", None)],
        [_init("b", (4, 5))],
    )
    assert _flops_of(view, "mm") == 2 * 2 * 3 * 5 * 4


def test_gemm_flops_trans_a_and_bias() -> None:
    # A is (K=4, M=3) transposed; out (3, 5); plus one add per output element for C
    view = _view(
        [helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=1, name="gemm")],
        [_vi("a", [4, 3])],
        [_vi("y", None)],
        [_init("b", (4, 5)), _init("c", (5,))],
    )
    assert _flops_of(view, "gemm") == 2 * 3 * 5 * 4 + 3 * 5


def test_einsum_elementwise_and_data_movement() -> None:
    view = _view(
        [
            helper.make_node("Einsum", ["a", "b"], ["e"], equation="bij,bjk->bik", name="einsum"),
            helper.make_node("Relu", ["e"], ["r"], name="relu"),
            helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1], name="tr"),
        ],
        [_vi("a", [2, 3, 4]), _vi("b", [2, 4, 5])],
        [_vi("y", None)],
    )
    assert _flops_of(view, "einsum") == 2 * 2 * 3 * 5 * 4
    assert _flops_of(view, "relu") == 2 * 3 * 5
    assert _flops_of(view, "tr") == 0.0
    shapes = concrete_shapes(view, {"a": (2, 3, 4), "b": (2, 4, 5)})
    assert node_bytes(view, view.node_by_name["tr"], shapes) == 2 * (2 * 3 * 5 * 4)


def test_concrete_shapes_follow_the_given_input_shapes() -> None:
    view = _view(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node("Flatten", ["c"], ["f"], name="flat"),
        ],
        [_vi("x", ["n", 3, "h", "w"])],
        [_vi("f", None)],
        [_init("w", (8, 3, 3, 3))],
    )
    shapes = concrete_shapes(view, {"x": (2, 3, 10, 12)})
    assert shapes["c"] == (2, 8, 10, 12)
    assert shapes["f"] == (2, 8 * 10 * 12)
    assert shapes["w"] == (8, 3, 3, 3)


def test_static_profile_costs_every_compute_node_without_running(monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("static_profile must not run the model")

    monkeypatch.setattr(onnxruntime, "InferenceSession", refuse)
    view = _view(
        [
            helper.make_node(
                "Constant", [], ["k"], value=numpy_helper.from_array(np.ones(4, np.float32)), name="k"
            ),
            helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
            helper.make_node("Add", ["m", "k"], ["y"], name="add"),
        ],
        [_vi("x", ["batch", 8])],
        [_vi("y", None)],
        [_init("w", (8, 4))],
    )
    prof = static_profile(view, shapes={"x": (1000, 8)})
    assert prof.source == "static"
    assert set(prof.node_seconds) == {"mm", "add"}  # the Constant is not a compute node
    assert prof.total_seconds == pytest.approx(sum(prof.node_seconds.values()))
    assert prof.input_shapes == {"x": (1000, 8)}
    assert prof.tensor_bytes["x"] == 1000 * 8 * 4
    assert prof.tensor_bytes["m"] == 1000 * 4 * 4
    mm_flops = 2 * 1000 * 4 * 8
    mm_bytes = (1000 * 8 + 8 * 4 + 1000 * 4) * 4
    expected = max(mm_flops / PEAK_FLOPS, mm_bytes / MEMORY_BANDWIDTH) + NODE_OVERHEAD_SECONDS
    assert prof.node_seconds["mm"] == pytest.approx(expected)
    assert prof.regions == () and prof.exact_fraction == 1.0


def test_static_profile_of_a_huge_external_model_reads_no_weights(tmp_path: Path) -> None:
    """A 2.4 GB weight whose file does not even exist: dims are enough."""
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[20_000, 30_000])
    w.data_location = TensorProto.EXTERNAL
    entry = w.external_data.add()
    entry.key, entry.value = "location", "weights.bin"
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "big",
        [_vi("x", ["batch", 20_000])],
        [_vi("y", None)],
        [w],
    )
    path = tmp_path / "big.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    view = load_model(path, check=False)
    prof = static_profile(view)
    assert prof.tensor_bytes["w"] == 20_000 * 30_000 * 4
    assert prof.tensor_bytes["y"] == 1 * 30_000 * 4
    assert prof.node_seconds["mm"] >= 2 * 20_000 * 30_000 / PEAK_FLOPS


def test_nodes_computed_from_constants_cost_nothing() -> None:
    """onnxruntime folds them when it loads the model (the onnx light models scale weights this way)."""
    axes = numpy_helper.from_array(np.array([1, 2], np.int64), "axes")
    view = _view(
        [
            helper.make_node("Unsqueeze", ["scale", "axes"], ["scale4"], name="unsq"),
            helper.make_node("Mul", ["x", "scale4"], ["y"], name="mul"),
        ],
        [_vi("x", [1, 8, 4, 4])],
        [_vi("y", None)],
        [_init("scale", (8,)), axes],
    )
    prof = static_profile(view)
    assert prof.node_seconds["unsq"] == 0.0
    assert prof.node_seconds["mul"] > 0.0
