"""Unit tests of onnxpipe.costs: hand-computed FLOPs, concrete shapes, the static profile."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.cost.static import (
    MEMORY_BANDWIDTH,
    NODE_OVERHEAD_SECONDS,
    PEAK_FLOPS,
    node_bytes,
    node_flops,
    static_profile,
)
from onnxpipe.ir import inference, symbolic
from onnxpipe.ir.inference import concrete_shapes
from onnxpipe.ir.load import load_model, view_from_proto
from onnxpipe.ir.model import ModelView


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


# --------------------------------------------------------------------------------------------------
# shapes ONNX's inference leaves unsettled: onnxruntime's symbolic inference as a second opinion


def _shape_arithmetic_model() -> onnx.ModelProto:
    """What torch exporters write for position ids: ``pos[:, :seq] + arange(seq)``, the length taken
    from the input's shape at run time (ONNX's inference leaves ``seq`` there as ``unk__``)."""
    ints = {"one": 1, "zero": 0, "step": 1}
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items()]
    inits += [
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array([0], np.int64), "start"),
        numpy_helper.from_array(np.arange(512, dtype=np.int64)[None], "pos"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "one"], ["n"], axis=0, name="len"),
        helper.make_node("Range", ["zero", "n", "step"], ["r"], name="range"),
        helper.make_node("Unsqueeze", ["r", "axis0"], ["ru"], name="ru"),
        helper.make_node("Unsqueeze", ["n", "axis0"], ["end"], name="end"),
        helper.make_node("Slice", ["pos", "start", "end", "axis1"], ["p"], name="slice"),
        helper.make_node("Add", ["p", "ru"], ["q"], name="add"),
        helper.make_node("Cast", ["q"], ["qf"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Mul", ["x", "qf"], ["y"], name="mul"),
    ]
    graph = helper.make_graph(nodes, "g", [_vi("x", ["batch", "seq"])], [_vi("y", ["batch", "seq"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


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
    model = _shape_arithmetic_model()
    true = {t: a.shape for t, a in _true_values(model, {"x": np.ones((2, 7), np.float32)}).items()}
    notes: list[str] = []
    shapes = concrete_shapes(view_from_proto(model), {"x": (2, 7)}, notes)
    assert {t: shapes[t] for t in true} == true
    assert shapes["p"] == (1, 7) and notes == []


def test_without_sympy_the_shapes_fall_back_and_a_note_says_how_to_settle_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The old answer, sized from the inputs' symbols or 1, with the remedy named."""
    monkeypatch.setattr(symbolic, "available", lambda: False)
    monkeypatch.setattr(inference, "symbolic_available", lambda: False)
    notes: list[str] = []
    shapes = concrete_shapes(view_from_proto(_shape_arithmetic_model()), {"x": (2, 7)}, notes)
    assert shapes["p"] == (1, 1) and shapes["y"] == (2, 7)
    assert len(notes) == 1 and "5 tensor(s)" in notes[0] and "(e.g. r, ru, p and 2 more)" in notes[0]
    assert "pip install 'onnxpipe[shapes]'" in notes[0]
    profile = static_profile(view_from_proto(_shape_arithmetic_model()), shapes={"x": (2, 7)})
    assert any("onnxpipe[shapes]" in n for n in profile.unattributed)


def test_a_failing_symbolic_inference_keeps_onnx_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(tool: object, model: onnx.ModelProto) -> onnx.ModelProto:
        raise AssertionError("an odd model")

    monkeypatch.setattr(symbolic, "_infer", broken)
    notes: list[str] = []
    shapes = concrete_shapes(view_from_proto(_shape_arithmetic_model()), {"x": (2, 7)}, notes)
    assert shapes["p"] == (1, 1)
    assert len(notes) == 1 and "could not settle them either" in notes[0]


def test_an_unknown_op_leaves_no_file_in_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tool's public entry saves ``sym_shape_infer_temp.onnx`` into the current folder when a shape
    stays unknown; onnxpipe runs its loop without that save and keeps what it settled."""
    model = _shape_arithmetic_model()
    model.graph.node.append(helper.make_node("Mystery", ["y"], ["z"], domain="com.example", name="mystery"))
    model.graph.output.append(_vi("z", None))
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
    model = _shape_arithmetic_model()
    onnx.save_model(
        model, tmp_path / "m.onnx", save_as_external_data=True, size_threshold=0, location="m.data"
    )
    view = load_model(tmp_path / "m.onnx")
    assert any(t.data_location == TensorProto.EXTERNAL for t in view.proto.graph.initializer)
    assert concrete_shapes(view, {"x": (2, 7)})["p"] == (1, 7)


@pytest.mark.slow
@pytest.mark.parametrize(
    "fixture", ["gpt2_tiny_path", "gpt2_tiny_dynamo_path", "bert_tiny_path", "bert_tiny_dynamo_path"]
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


def test_symbolic_inference_can_be_left_out() -> None:
    """``symbolic=False``: ONNX's answer alone, as the balance benchmark's baseline costs it."""
    view = view_from_proto(_shape_arithmetic_model())
    notes: list[str] = []
    assert concrete_shapes(view, {"x": (2, 7)}, notes, symbolic=False)["p"] == (1, 1)
    assert len(notes) == 1 and "symbolic shape inference was not asked" in notes[0]
    profile = static_profile(view, shapes={"x": (2, 7)}, symbolic=False)
    assert (
        profile.tensor_bytes["p"] == 8 and static_profile(view, shapes={"x": (2, 7)}).tensor_bytes["p"] == 56
    )


def test_a_dim_that_may_be_1_at_run_time_is_not_merged_into_a_wrong_size() -> None:
    """``NonZero``'s count broadcast against a row of 7: merged, the tool would call the count 7."""
    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"], name="nz"),
        helper.make_node("Cast", ["nz"], ["nzf"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Add", ["nzf", "row"], ["y"], name="add"),
    ]
    view = _view(nodes, [_vi("x", [3])], [_vi("y", None)], [_init("row", (1, 7))])
    true = _true_values(view.proto, {"x": np.array([0, 1, 0], np.float32)})
    assert true["nz"].shape == (1, 1)
    notes: list[str] = []
    shapes = concrete_shapes(view, {"x": (3,)}, notes)
    assert shapes["nz"] == (1, 1)  # the unknown count sized as 1, as without the tool
    assert len(notes) == 1 and "nz" in notes[0].split("(e.g. ")[1]


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
    shapes = concrete_shapes(view_from_proto(_shape_arithmetic_model()), {"x": (2, 7)})
    assert shapes["p"] == (1, 7) and shapes["qf"] == (1, 7)


def test_calls_from_many_threads_leave_the_tools_logger_as_it_was() -> None:
    import logging
    from concurrent.futures import ThreadPoolExecutor

    logger = logging.getLogger("onnxruntime.tools.symbolic_shape_infer")
    before = (logger.disabled, list(logger.filters))
    view = view_from_proto(_shape_arithmetic_model())
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
    view = _view(nodes, [_vi("x", [4, 3])], [_vi("y", None)], [zero])
    notes: list[str] = []
    concrete_shapes(view, {"x": (4, 3)}, notes)
    assert not any("seq" in n.split("(e.g. ")[-1] for n in notes)
