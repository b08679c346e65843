"""Unit tests of onnxpipe.cost.static: hand-computed FLOPs, concrete shapes, the static profile."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from models import const, shape_arithmetic_model, vi, view_of
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.cost.static import (
    MEMORY_BANDWIDTH,
    NODE_OVERHEAD_SECONDS,
    PEAK_FLOPS,
    node_bytes,
    node_flops,
    static_profile,
)
from onnxpipe.ir import static, symbolic
from onnxpipe.ir.load import load_model, view_from_proto
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.static import concrete_shapes


def _flops_of(view: ModelView, name: str) -> float:
    shapes = concrete_shapes(view, {i: tuple(int(d) for d in view.tensors[i].shape) for i in view.inputs})  # type: ignore[union-attr]
    return node_flops(view, view.node_by_name[name], shapes)


def test_conv_flops() -> None:
    # out (1, 4, 8, 8): each output element is a 3x3x3 dot product (27 MACs) plus the bias
    view = view_of(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], name="conv")],
        [vi("x", [1, 3, 8, 8])],
        [vi("y", None)],
        [const("w", np.ones((4, 3, 3, 3))), const("b", np.ones((4,)))],
    )
    assert _flops_of(view, "conv") == 2 * (4 * 8 * 8) * 27 + 4 * 8 * 8


def test_grouped_strided_conv_flops() -> None:
    # groups=2: each output channel sees 4/2 input channels; stride 2 -> out (2, 6, 4, 4)
    view = view_of(
        [
            helper.make_node(
                "Conv", ["x", "w"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1], group=2, name="conv"
            )
        ],
        [vi("x", [2, 4, 8, 8])],
        [vi("y", None)],
        [const("w", np.ones((6, 2, 3, 3)))],
    )
    assert _flops_of(view, "conv") == 2 * (2 * 6 * 4 * 4) * (2 * 3 * 3)


def test_matmul_flops_with_batch() -> None:
    view = view_of(
        [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
        [vi("a", [2, 3, 4])],
        [vi("y", None)],
        [const("b", np.ones((4, 5)))],
    )
    assert _flops_of(view, "mm") == 2 * 2 * 3 * 5 * 4


def test_gemm_flops_trans_a_and_bias() -> None:
    # A is (K=4, M=3) transposed; out (3, 5); plus one add per output element for C
    view = view_of(
        [helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=1, name="gemm")],
        [vi("a", [4, 3])],
        [vi("y", None)],
        [const("b", np.ones((4, 5))), const("c", np.ones((5,)))],
    )
    assert _flops_of(view, "gemm") == 2 * 3 * 5 * 4 + 3 * 5


def test_einsum_elementwise_and_data_movement() -> None:
    view = view_of(
        [
            helper.make_node("Einsum", ["a", "b"], ["e"], equation="bij,bjk->bik", name="einsum"),
            helper.make_node("Relu", ["e"], ["r"], name="relu"),
            helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1], name="tr"),
        ],
        [vi("a", [2, 3, 4]), vi("b", [2, 4, 5])],
        [vi("y", None)],
    )
    assert _flops_of(view, "einsum") == 2 * 2 * 3 * 5 * 4
    assert _flops_of(view, "relu") == 2 * 3 * 5
    assert _flops_of(view, "tr") == 0.0
    shapes = concrete_shapes(view, {"a": (2, 3, 4), "b": (2, 4, 5)})
    assert node_bytes(view, view.node_by_name["tr"], shapes) == 2 * (2 * 3 * 5 * 4)


def test_concrete_shapes_follow_the_given_input_shapes() -> None:
    view = view_of(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node("Flatten", ["c"], ["f"], name="flat"),
        ],
        [vi("x", ["n", 3, "h", "w"])],
        [vi("f", None)],
        [const("w", np.ones((8, 3, 3, 3)))],
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
    view = view_of(
        [
            helper.make_node(
                "Constant", [], ["k"], value=numpy_helper.from_array(np.ones(4, np.float32)), name="k"
            ),
            helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
            helper.make_node("Add", ["m", "k"], ["y"], name="add"),
        ],
        [vi("x", ["batch", 8])],
        [vi("y", None)],
        [const("w", np.ones((8, 4)))],
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
        [vi("x", ["batch", 20_000])],
        [vi("y", None)],
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
    view = view_of(
        [
            helper.make_node("Unsqueeze", ["scale", "axes"], ["scale4"], name="unsq"),
            helper.make_node("Mul", ["x", "scale4"], ["y"], name="mul"),
        ],
        [vi("x", [1, 8, 4, 4])],
        [vi("y", None)],
        [const("scale", np.ones((8,))), axes],
    )
    prof = static_profile(view)
    assert prof.node_seconds["unsq"] == 0.0
    assert prof.node_seconds["mul"] > 0.0


def test_without_sympy_the_shapes_fall_back_and_a_note_says_how_to_settle_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The old answer, sized from the inputs' symbols or 1, with the remedy named."""
    monkeypatch.setattr(symbolic, "available", lambda: False)
    monkeypatch.setattr(static, "symbolic_available", lambda: False)
    notes: list[str] = []
    shapes = concrete_shapes(view_from_proto(shape_arithmetic_model()), {"x": (2, 7)}, notes)
    assert shapes["p"] == (1, 1) and shapes["y"] == (2, 7)
    assert len(notes) == 1 and "5 tensor(s)" in notes[0] and "(e.g. r, ru, p and 2 more)" in notes[0]
    assert "pip install 'onnxpipe[shapes]'" in notes[0]
    profile = static_profile(view_from_proto(shape_arithmetic_model()), shapes={"x": (2, 7)})
    assert any("onnxpipe[shapes]" in n for n in profile.unattributed)


def test_a_failing_symbolic_inference_keeps_onnx_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> onnx.ModelProto:
        raise AssertionError("an odd model")

    monkeypatch.setattr(symbolic, "_infer", broken)
    notes: list[str] = []
    shapes = concrete_shapes(view_from_proto(shape_arithmetic_model()), {"x": (2, 7)}, notes)
    assert shapes["p"] == (1, 1)
    assert len(notes) == 1 and "could not settle them either" in notes[0]


def test_an_unknown_op_leaves_no_file_in_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tool's public entry saves ``sym_shape_infer_temp.onnx`` into the current folder when a shape
    stays unknown; onnxpipe runs its loop without that save and keeps what it settled."""
    model = shape_arithmetic_model()
    model.graph.node.append(helper.make_node("Mystery", ["y"], ["z"], domain="com.example", name="mystery"))
    model.graph.output.append(vi("z", None))
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    monkeypatch.chdir(tmp_path)
    notes: list[str] = []
    shapes = concrete_shapes(view_from_proto(model), {"x": (2, 7)}, notes)
    assert list(tmp_path.iterdir()) == []
    assert shapes["p"] == (1, 7)  # settled before the unknown op
    assert len(notes) == 1 and "1 tensor(s)" in notes[0] and "(e.g. z)" in notes[0]


def test_small_external_initializers_are_read_for_shape_arithmetic(tmp_path: Path) -> None:
    """A dynamo export keeps every weight in a side file, the position ids too: the small ones are read
    (the big ones never are, see above)."""
    model = shape_arithmetic_model()
    onnx.save_model(
        model, tmp_path / "m.onnx", save_as_external_data=True, size_threshold=0, location="m.data"
    )
    view = load_model(tmp_path / "m.onnx")
    assert any(t.data_location == TensorProto.EXTERNAL for t in view.proto.graph.initializer)
    assert concrete_shapes(view, {"x": (2, 7)})["p"] == (1, 7)


def test_symbolic_inference_can_be_left_out() -> None:
    """``symbolic=False``: ONNX's answer alone, as the balance benchmark's baseline costs it."""
    view = view_from_proto(shape_arithmetic_model())
    notes: list[str] = []
    assert concrete_shapes(view, {"x": (2, 7)}, notes, symbolic=False)["p"] == (1, 1)
    assert len(notes) == 1 and "symbolic shape inference was not asked" in notes[0]
    profile = static_profile(view, shapes={"x": (2, 7)}, symbolic=False)
    assert (
        profile.tensor_bytes["p"] == 8 and static_profile(view, shapes={"x": (2, 7)}).tensor_bytes["p"] == 56
    )


def test_what_the_tool_settled_before_it_raised_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tool raises on some models (an assertion in its ``Concat``, a helper newer onnx dropped):
    the shapes it had inferred up to that node still count."""
    from onnxruntime.tools import symbolic_shape_infer as tool

    class FailsOnMul(tool.SymbolicShapeInference):  # type: ignore[misc]
        def __init__(self, *args: object) -> None:
            super().__init__(*args)

            def boom(node: onnx.NodeProto) -> None:
                raise KeyError("")

            self.dispatcher_["Mul"] = boom

    monkeypatch.setattr(tool, "SymbolicShapeInference", FailsOnMul)
    shapes = concrete_shapes(view_from_proto(shape_arithmetic_model()), {"x": (2, 7)})
    assert shapes["p"] == (1, 7) and shapes["qf"] == (1, 7)


def test_calls_from_many_threads_leave_the_tools_logger_as_it_was() -> None:
    import logging
    from concurrent.futures import ThreadPoolExecutor

    logger = logging.getLogger("onnxruntime.tools.symbolic_shape_infer")
    before = (logger.disabled, list(logger.filters))
    view = view_from_proto(shape_arithmetic_model())
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: concrete_shapes(view, {"x": (2, 7)})["p"], range(16)))
    assert results == [(1, 7)] * 16
    assert (logger.disabled, list(logger.filters)) == before
    with symbolic._quiet(), symbolic._quiet():  # nested, as two threads interleave them
        assert len(logger.filters) == len(before[1]) + 2
    assert (logger.disabled, list(logger.filters)) == before


def test_a_sequence_is_not_reported_as_an_unsettled_tensor() -> None:
    nodes = [
        helper.make_node("SplitToSequence", ["x"], ["seq"], axis=0, name="split"),
        helper.make_node("SequenceAt", ["seq", "zero"], ["y"], name="at"),
    ]
    zero = numpy_helper.from_array(np.array(0, np.int64), "zero")
    view = view_of(nodes, [vi("x", [4, 3])], [vi("y", None)], [zero])
    notes: list[str] = []
    concrete_shapes(view, {"x": (4, 3)}, notes)
    assert not any("seq" in n.split("(e.g. ")[-1] for n in notes)
