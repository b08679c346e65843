"""Unit tests of onnxpipe.ir.model: naming, inputs, subgraph reads, constants, types, load errors, node
order, tensors in external data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import convert_model_to_external_data

from onnxpipe.core.errors import ModelLoadError
from onnxpipe.ir.external import inlined, is_external, tensor_values
from onnxpipe.ir.load import load_model, view_from_proto
from onnxpipe.ir.static import freeze_shapes


def _vi(name: str, shape: list[int | str], elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes: list[onnx.NodeProto], inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_unnamed_and_duplicate_nodes_get_stable_unique_names() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"], name="dup"),
        helper.make_node("Relu", ["b"], ["c"], name="dup"),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    m = _model(nodes, [_vi("x", [2])], [_vi("y", [2])])
    names = [n.name for n in view_from_proto(m).nodes]
    assert len(set(names)) == 4
    assert names == ["Relu_0", "dup", "dup__2", "Relu_3"]
    again = [n.name for n in view_from_proto(_model(nodes, [_vi("x", [2])], [_vi("y", [2])])).nodes]
    assert again == names


def test_initializers_listed_as_inputs_are_not_model_inputs() -> None:
    w = numpy_helper.from_array(np.ones((2,), np.float32), "w")
    m = _model(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")],
        [_vi("x", [2]), _vi("w", [2])],
        [_vi("y", [2])],
        [w],
    )
    m.ir_version = 3
    view = view_from_proto(m)
    assert view.inputs == ("x",)
    assert view.initializers == {"w": 8}
    assert view.nodes[0].param_bytes == 8


def _if_reading(outer: str, out: str, depth: int) -> onnx.NodeProto:
    """An If whose branches read ``outer`` from the enclosing scope, nested ``depth`` deep."""
    if depth == 0:
        return helper.make_node("Identity", [outer], [out])
    then_g = helper.make_graph(
        [_if_reading(outer, f"{out}_t", depth - 1)], f"then{depth}", [], [_vi(f"{out}_t", [2])]
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", [outer], [f"{out}_e"])], f"else{depth}", [], [_vi(f"{out}_e", [2])]
    )
    return helper.make_node("If", ["cond"], [out], then_branch=then_g, else_branch=else_g)


def test_nested_if_outer_reads_are_node_dependencies() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
        _if_reading("h", "y", 3),
    ]
    m = _model(nodes, [_vi("x", [2]), _vi("cond", [], TensorProto.BOOL)], [_vi("y", [2])])
    view = view_from_proto(m)
    node_if = view.nodes[-1]
    assert node_if.op_type == "If" and node_if.has_subgraph
    assert node_if.outer_inputs == ("h",)
    assert "h" in node_if.reads
    assert view.consumers["h"] == (node_if.position,)


def test_constant_producers_are_marked() -> None:
    shape = numpy_helper.from_array(np.array([2], np.int64), "shape")
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.ones(2, np.float32))),
        helper.make_node("ConstantOfShape", ["shape"], ["z"]),
        helper.make_node("Identity", ["c"], ["ci"]),
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Add", ["x", "ci"], ["a"], name="add"),
        helper.make_node("Add", ["a", "z"], ["b"], name="add2"),
        helper.make_node("Reshape", ["b", "xs"], ["y"], name="reshape"),
    ]
    m = _model(nodes, [_vi("x", [2])], [_vi("y", [2])], [shape])
    view = view_from_proto(m)
    kinds = {n.op_type: n.is_constant for n in view.nodes}
    assert kinds == {
        "Constant": True,
        "ConstantOfShape": True,
        "Identity": True,
        "Shape": True,
        "Add": False,
        "Reshape": False,
    }
    assert [n.name for n in view.compute_nodes] == ["add", "add2", "reshape"]


def test_shape_of_dynamic_tensor_is_not_constant() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["xs"], name="shape"),
        helper.make_node("Reshape", ["x", "xs"], ["y"], name="reshape"),
    ]
    view = view_from_proto(_model(nodes, [_vi("x", ["n"])], [_vi("y", ["n"])]))
    assert not view.nodes[0].is_constant
    assert view.tensor("x").shape == ("n",)


def test_symbolic_dims_are_kept_by_inference() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="r"), helper.make_node("Relu", ["h"], ["y"])]
    view = view_from_proto(_model(nodes, [_vi("x", ["batch", 3])], [_vi("y", ["batch", 3])]))
    assert view.tensor("h").shape == ("batch", 3)
    assert view.tensor("h").dtype == "float32"
    assert view.tensor("h").nbytes({"batch": 4}) == 48


def test_dfs_order_keeps_branches_together() -> None:
    # the file interleaves two branches that each shrink their data; running one branch to its end
    # before starting the next keeps fewer bytes live, so the chosen order does that
    nodes = [
        helper.make_node("Relu", ["x"], ["a1"], name="a1"),
        helper.make_node("Relu", ["x"], ["b1"], name="b1"),
        helper.make_node("ReduceSum", ["a1"], ["a2"], name="a2"),
        helper.make_node("ReduceSum", ["b1"], ["b2"], name="b2"),
        helper.make_node("Add", ["a2", "b2"], ["y"], name="join"),
    ]
    view = view_from_proto(_model(nodes, [_vi("x", [1024])], [_vi("y", [1])]))
    assert [n.name for n in view.nodes] == ["a1", "a2", "b1", "b2", "join"]


def test_file_order_kept_when_no_better() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="first"),
        helper.make_node("Relu", ["x"], ["b"], name="second"),
        helper.make_node("Add", ["a", "b"], ["y"], name="join"),
    ]
    view = view_from_proto(_model(nodes, [_vi("x", [4])], [_vi("y", [4])]))
    assert [n.name for n in view.nodes] == ["first", "second", "join"]


def test_external_data_loads_without_reading_weights(tmp_path: Path) -> None:
    w = numpy_helper.from_array(np.arange(4096, dtype=np.float32), "w")
    m = _model(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")], [_vi("x", [4096])], [_vi("y", [4096])], [w]
    )
    path = tmp_path / "m.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    view = load_model(path)
    assert view.initializers == {"w": 4096 * 4}
    init = view.proto.graph.initializer[0]
    assert init.data_location == TensorProto.EXTERNAL and not init.raw_data
    assert view.base_dir == tmp_path


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no such file"):
        load_model(tmp_path / "missing.onnx")
    with pytest.raises(ModelLoadError, match="is not a file"):
        load_model(tmp_path)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\xff\xfe this is not a protobuf \x00\x01" * 10)
    with pytest.raises(ModelLoadError, match=r"junk\.onnx"):
        load_model(junk)
    good = _model([helper.make_node("Relu", ["x"], ["y"], name="r")], [_vi("x", [2])], [_vi("y", [2])])
    data = good.SerializeToString()
    cut = tmp_path / "truncated.onnx"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"truncated\.onnx"):
        load_model(cut)
    bad = _model([helper.make_node("Relu", ["nowhere"], ["y"], name="r")], [_vi("x", [2])], [_vi("y", [2])])
    bad_path = tmp_path / "bad.onnx"
    onnx.save(bad, str(bad_path))
    with pytest.raises(ModelLoadError, match=r"bad\.onnx: fails the ONNX checker"):
        load_model(bad_path)


def test_order_is_topological_for_constant_chains() -> None:
    # a ConstantOfShape fed by a Shape of a static tensor, listed before it in the file
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
        helper.make_node("ConstantOfShape", ["hs"], ["zeros"], name="zeros"),
        helper.make_node("Shape", ["h"], ["hs"], name="shape"),
        helper.make_node("Add", ["h", "zeros"], ["y"], name="add"),
    ]
    view = view_from_proto(_model(nodes, [_vi("x", [2, 3])], [_vi("y", [2, 3])]))
    seen: set[str] = {"x"}
    for n in view.nodes:
        assert all(t in seen for t in n.reads), n.name
        seen.update(n.outputs)
    assert {n.name for n in view.nodes if n.is_constant} == {"zeros", "shape"}


def test_negative_dims_are_unknown() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="r")]
    view = view_from_proto(_model(nodes, [_vi("x", [-1, 4])], [_vi("y", [-1, 4])]))
    assert view.tensor("x").shape == (None, 4)
    assert view.tensor("x").nbytes() == 16


def _out_of_order_if_model() -> onnx.ModelProto:
    """Main graph and an If branch both list a node before the node whose output it reads."""
    then_nodes = [
        helper.make_node("Neg", ["t1"], ["t2"], name="then_neg"),
        helper.make_node("Relu", ["h"], ["t1"], name="then_relu"),
    ]
    then_g = helper.make_graph(then_nodes, "then", [], [_vi("t2", [2])])
    else_id = helper.make_node("Identity", ["h"], ["e"], name="else_id")
    else_g = helper.make_graph([else_id], "else", [], [_vi("e", [2])])
    nodes = [
        helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g),
        helper.make_node("Abs", ["x"], ["h"], name="abs"),
    ]
    return _model(nodes, [_vi("x", [2]), _vi("c", [], TensorProto.BOOL)], [_vi("y", [2])])


def test_nodes_out_of_order_are_sorted_on_load_with_a_note(tmp_path: Path) -> None:
    model = _out_of_order_if_model()
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(model)
    path = tmp_path / "unsorted.onnx"
    onnx.save(model, str(path))
    view = load_model(path)
    assert [n.name for n in view.proto.graph.node] == ["abs", "if"]
    then_g = next(a.g for a in view.proto.graph.node[1].attribute if a.name == "then_branch")
    assert [n.name for n in then_g.node] == ["then_relu", "then_neg"]
    assert [view.proto.graph.node[n.index].name for n in view.nodes] == [n.name for n in view.nodes]
    assert any("out of topological order in 2 graphs" in n and "sorted on load" in n for n in view.notes)
    onnx.checker.check_model(view.proto)


def test_sorted_model_with_external_weights_is_checked_in_memory(tmp_path: Path) -> None:
    w = numpy_helper.from_array(np.arange(64, dtype=np.float32).reshape(8, 8), "w")
    nodes = [
        helper.make_node("Relu", ["m"], ["y"], name="relu"),
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
    ]
    model = _model(nodes, [_vi("x", [1, 8])], [_vi("y", [1, 8])], [w])
    path = tmp_path / "sub" / "model.onnx"
    path.parent.mkdir()
    onnx.save(model, str(path), save_as_external_data=True, location="model.onnx_data", size_threshold=0)
    view = load_model(path)  # the checker must not read the weights from the working directory
    assert [n.name for n in view.nodes] == ["mm", "relu"]
    assert any("sorted on load" in n for n in view.notes)
    bad = _model([helper.make_node("Relu", ["nowhere"], ["y"], name="r")], [_vi("x", [2])], [_vi("y", [2])])
    onnx.save(bad, str(tmp_path / "bad.onnx"))
    with pytest.raises(ModelLoadError, match="fails the ONNX checker"):  # a read of nothing stays refused
        load_model(tmp_path / "bad.onnx")


def test_tensors_inside_nodes_are_read_beside_the_model_not_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shape_value = numpy_helper.from_array(np.array([4, 2], dtype=np.int64), "shape_value")
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape"),  # out of order: sorted on load
        helper.make_node("Constant", [], ["shape"], name="shape_const", value=shape_value),
    ]
    model = _model(nodes, [_vi("x", [2, 4])], [_vi("y", [4, 2])])
    convert_model_to_external_data(
        model, location="model.onnx_data", size_threshold=0, convert_attribute=True
    )
    path = tmp_path / "model" / "model.onnx"
    path.parent.mkdir()
    onnx.save(model, str(path))
    monkeypatch.chdir(tmp_path)
    view = load_model(path)  # checked in memory with the Constant's external value as an input
    node = view.proto.graph.node[0]
    value = node.attribute[0].t
    assert is_external(value)
    np.testing.assert_array_equal(tensor_values(value, view.base_dir), [4, 2])
    assert not is_external(inlined(node, view.base_dir).attribute[0].t)
    assert inlined(node, None) is node
    frozen, folded = freeze_shapes(view.proto, {"x": (2, 4)}, view.base_dir)
    assert folded == 1 and [n.op_type for n in frozen.graph.node] == ["Reshape"]
    with pytest.raises(ModelLoadError, match="folder is unknown"):
        tensor_values(value, None)
