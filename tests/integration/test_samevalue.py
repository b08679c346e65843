"""Equal values across stage cuts: :func:`onnxpipe.ir.shapevalues.value_classes` and how stages send and
remake them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from manifest_edits import sealed
from models import const, feeds_for, make, plan_for, save, vi
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.core.errors import ManifestError
from onnxpipe.cost.static import static_profile
from onnxpipe.export.build import ALIAS_NODE_PREFIX
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.load import load_model, view_from_proto
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapevalues import CONTENT_LIMIT, value_classes
from onnxpipe.manifest import MANIFEST_NAME, load_manifest
from onnxpipe.planning.records import SameValue
from onnxpipe.planning.sequences import sequences
from onnxpipe.planning.stages import StageOptions, assign_stages
from onnxpipe.planning.workers import make_plan
from onnxpipe.verification.chain import StageChain


def _constant(name: str, value: float) -> onnx.NodeProto:
    return helper.make_node(
        "Constant",
        [],
        [name],
        name=name,
        value=numpy_helper.from_array(np.array(value, np.float32), name + "_value"),
    )


def masked_layers(layers: int = 4) -> onnx.ModelProto:
    """A torch-export pattern: each layer builds the same mask (a Where of the same input and of its own,
    equal constants) and adds it to its hidden state."""
    nodes = [helper.make_node("Greater", ["m", "zero"], ["keep"], name="keep")]
    h = "x"
    for i in range(layers):
        nodes += [
            _constant(f"c{i}_on", 0.0),
            _constant(f"c{i}_off", -1e4),
            helper.make_node("Where", ["keep", f"c{i}_on", f"c{i}_off"], [f"mask{i}"], name=f"where{i}"),
            helper.make_node("MatMul", [h, "w"], [f"mm{i}"], name=f"matmul{i}"),
            helper.make_node("Add", [f"mm{i}", f"mask{i}"], [f"h{i}"], name=f"add{i}"),
        ]
        h = f"h{i}"
    w = const("w", np.eye(4, dtype=np.float32) * 0.5)
    return make(
        nodes, [vi("x", ["batch", 4]), vi("m", ["batch", 4])], [vi(h, ["batch", 4])], [w, const("zero", 0.0)]
    )


# --------------------------------------------------------------------------------------------------
# value classes


def test_repeats_of_one_computation_share_a_class() -> None:
    view = view_from_proto(masked_layers())
    classes = value_classes(view)
    assert len({classes[f"mask{i}"] for i in range(4)}) == 1  # equal constants, same input
    assert len({classes[f"mm{i}"] for i in range(4)}) == 4  # same weights, different inputs
    assert classes["c0_on"] == classes["c3_on"] != classes["c0_off"]  # Constants by value, not name


def test_what_can_differ_between_runs_or_callers_has_a_class_of_its_own() -> None:
    big = np.zeros(CONTENT_LIMIT // 4 + 1, np.float32)
    nodes = [
        helper.make_node("RandomUniformLike", ["x"], ["r1"], name="r1"),
        helper.make_node("RandomUniformLike", ["x"], ["r2"], name="r2"),
        helper.make_node("Dropout", ["x"], ["d1"], name="d1"),
        helper.make_node("Dropout", ["x"], ["d2"], name="d2"),
        helper.make_node("Add", ["x", "fed1"], ["f1"], name="f1"),
        helper.make_node("Add", ["x", "fed2"], ["f2"], name="f2"),
        helper.make_node("Add", ["x", "small1"], ["s1"], name="s1"),
        helper.make_node("Add", ["x", "small2"], ["s2"], name="s2"),
        helper.make_node("Mul", ["big1", "x0"], ["b1"], name="b1"),
        helper.make_node("Mul", ["big2", "x0"], ["b2"], name="b2"),
        helper.make_node("Split", ["x"], ["p", "q"], name="split", axis=1),
        helper.make_node("Relu", ["x"], ["relu1"], name="relu1"),
        helper.make_node("Relu", ["x"], ["relu2"], name="relu2", doc_string="a doc string is not a value"),
    ]
    model = make(
        nodes,
        [vi("x", [2, 4]), vi("x0", [1]), vi("fed1", [1]), vi("fed2", [1])],
        [
            vi(t, None)
            for t in ("r1", "r2", "d1", "d2", "f1", "f2", "s1", "s2", "b1", "b2", "p", "q", "relu1", "relu2")
        ],
        [
            const("fed1", [1.0]),  # listed among the inputs too: a caller may feed other values
            const("fed2", [1.0]),
            const("small1", [1.0]),
            const("small2", [1.0]),
            const("big1", big),
            const("big2", big),
        ],
        ir_version=3,
    )
    classes = value_classes(view_from_proto(model))
    assert classes["r1"] != classes["r2"] and classes["d1"] != classes["d2"]
    assert classes["f1"] != classes["f2"]
    assert classes["s1"] == classes["s2"]  # small initializers compare by content
    assert classes["b1"] != classes["b2"]  # large ones are never compared
    assert classes["p"] != classes["q"]  # outputs of one node differ by position
    assert classes["relu1"] == classes["relu2"]


def test_a_custom_domain_op_and_control_flow_are_never_merged() -> None:
    body = helper.make_graph([helper.make_node("Relu", ["x"], ["o"])], "b", [], [vi("o", [2])])
    nodes = [
        helper.make_node("Gelu", ["x"], ["g1"], name="g1", domain="com.microsoft"),
        helper.make_node("Gelu", ["x"], ["g2"], name="g2", domain="com.microsoft"),
        helper.make_node("If", ["c"], ["i1"], name="i1", then_branch=body, else_branch=body),
        helper.make_node("If", ["c"], ["i2"], name="i2", then_branch=body, else_branch=body),
    ]
    model = make(
        nodes,
        [vi("x", [2]), vi("c", [], TensorProto.BOOL)],
        [vi(t, None) for t in ("g1", "g2", "i1", "i2")],
        domains=[("com.microsoft", 1)],
    )
    classes = value_classes(view_from_proto(model))
    assert classes["g1"] != classes["g2"] and classes["i1"] != classes["i2"]


# --------------------------------------------------------------------------------------------------
# stages


def _cut_after_where2(view: ModelView) -> list[int]:
    """Bounds of two stages: the second starts with layer 2's Add, so it reads layer 2's mask across."""
    compute = [n.name for n in view.compute_nodes]
    assert compute[compute.index("where2") + 1] == "add2" and compute.index("where3") > compute.index("add2")
    return [0, compute.index("where2") + 1, len(compute)]


def test_a_stage_receives_each_value_once_and_remakes_the_repeats() -> None:
    view = view_from_proto(masked_layers())
    sizes = {name: t.nbytes() for name, t in view.tensors.items()}
    bounds = _cut_after_where2(view)
    s0, s1 = assign_stages(view, bounds, sizes, [1.0, 1.0], [0.0, 0.0])
    # stage 1 receives layer 0's mask, the first of its value in stage 0, and remakes layer 2's from it
    assert "mask0" in s1.inputs and "mask2" not in s1.inputs
    assert s1.aliases == (SameValue("mask2", "mask0"),)
    assert "where3" in s1.node_names and not s1.skipped_nodes  # made in stage 1 itself: stays
    # stage 0 sends mask0 and remakes layer 1's mask from it; its repeats' nodes are left out
    assert "mask0" in s0.outputs and "mask2" not in s0.outputs
    assert s0.aliases == (SameValue("mask1", "mask0"),)
    assert s0.skipped_nodes == ("where1", "where2")
    assert s0.file_node_names == tuple(n for n in s0.node_names if n not in ("where1", "where2"))
    assert s1.bytes_in == sum(sizes[t] for t in s1.inputs)
    # without sharing, every mask crosses and every Where stays
    unshared = StageOptions(share_equal_values=False)
    plain0, plain1 = assign_stages(view, bounds, sizes, [1.0, 1.0], [0.0, 0.0], unshared)
    assert "mask2" in plain1.inputs and "mask0" not in plain1.inputs
    assert not plain0.aliases and not plain1.aliases and not plain0.skipped_nodes


def test_stages_with_remade_values_chain_back_to_the_model(tmp_path: Path) -> None:
    model = masked_layers()
    path = save(model, tmp_path / "masked.onnx")
    view = load_model(path)
    manifest = export_stages(view, plan_for(view, _cut_after_where2(view)), tmp_path / "out")
    assert manifest == load_manifest(tmp_path / "out")
    s0, s1 = manifest.stages
    assert s1.same_values == (SameValue("mask2", "mask0"),) and not s0.same_values  # stage 0's is inner
    assert s0.skipped_node_count == 2 and s1.skipped_node_count == 0
    assert s0.node_count + s1.node_count + 2 == len(view.compute_nodes)
    for entry in manifest.stages:
        graph = onnx.load(str(tmp_path / "out" / entry.file)).graph
        assert sum(n.op_type == "Where" for n in graph.node) == 1
        remade = [n for n in graph.node if n.name.startswith(ALIAS_NODE_PREFIX)]
        assert [(n.op_type, n.input[0], n.output[0]) for n in remade] == [
            ("Identity", "mask0", "mask1" if entry.index == 0 else "mask2")
        ]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with StageChain.from_manifest(tmp_path / "out") as chain:
        for seed in range(3):
            feeds = feeds_for(model, seed, batch=3)
            np.testing.assert_array_equal(chain.run(feeds)["h3"], session.run(None, feeds)[0])


def test_a_manifest_whose_same_value_names_no_input_is_refused(tmp_path: Path) -> None:
    path = save(masked_layers(), tmp_path / "masked.onnx")
    view = load_model(path)
    export_stages(view, plan_for(view, _cut_after_where2(view)), tmp_path / "out")
    manifest_path = tmp_path / "out" / MANIFEST_NAME
    doc = json.loads(manifest_path.read_text())
    doc["stages"][1]["same_values"][0]["same_as"] = "no_such_tensor"
    manifest_path.write_text(sealed(doc))
    with pytest.raises(
        ManifestError, match=r"stages\[1\]\.same_values\[0\]\.same_as.*no_such_tensor.*not an input"
    ):
        load_manifest(tmp_path / "out")


def test_a_plan_says_when_its_stages_remake_received_values() -> None:
    view = view_from_proto(masked_layers(8))
    seen = False
    for k in range(2, 7):
        plan = make_plan(view, static_profile(view), k)
        received = sum(1 for st in plan.stages for a in st.aliases if a.same_as in st.inputs)
        notes = [n for n in plan.notes if "equal another it receives" in n]
        assert len(notes) == (1 if received else 0), (k, plan.notes)
        if received:
            seen = True
            assert notes[0].startswith(f"{received} tensor(s)")
    assert seen, "some stage count should cut between equal masks"


def masks_made_in_two_stages() -> onnx.ModelProto:
    """One mask made twice, in what become stages 0 and 1, and both read in stage 2."""
    nodes = [
        helper.make_node("Greater", ["m", "zero"], ["keep"], name="keep"),
        _constant("a_on", 0.0),
        _constant("a_off", -1e4),
        helper.make_node("Where", ["keep", "a_on", "a_off"], ["mask_a"], name="where_a"),
        helper.make_node("MatMul", ["x", "w"], ["mm0"], name="matmul0"),
        _constant("b_on", 0.0),
        _constant("b_off", -1e4),
        helper.make_node("Where", ["keep", "b_on", "b_off"], ["mask_b"], name="where_b"),
        helper.make_node("MatMul", ["mm0", "w"], ["mm1"], name="matmul1"),
        helper.make_node("Add", ["mm1", "mask_b"], ["h1"], name="add1"),
        helper.make_node("MatMul", ["h1", "w"], ["mm2"], name="matmul2"),
        helper.make_node("Add", ["mm2", "mask_a"], ["h2"], name="add2"),
        helper.make_node("Add", ["h2", "mask_b"], ["y"], name="add3"),
    ]
    w = const("w", np.eye(4, dtype=np.float32) * 0.5)
    return make(
        nodes,
        [vi("x", ["batch", 4]), vi("m", ["batch", 4])],
        [vi("y", ["batch", 4])],
        [w, const("zero", 0.0)],
    )


def test_a_value_made_in_two_earlier_stages_crosses_once(tmp_path: Path) -> None:
    model = masks_made_in_two_stages()
    path = save(model, tmp_path / "two.onnx")
    view = load_model(path)
    compute = [n.name for n in view.compute_nodes]
    bounds = [0, compute.index("matmul1"), compute.index("matmul2"), len(compute)]
    sizes = {name: t.nbytes() for name, t in view.tensors.items()}
    s0, s1, s2 = assign_stages(view, bounds, sizes, [1.0] * 3, [0.0] * 3)
    # stage 2 receives the mask once, as the latest earlier stage made it, and remakes mask_a from it
    assert set(s2.inputs) == {"h1", "mask_b"} and s2.aliases == (SameValue("mask_a", "mask_b"),)
    # so stage 0 need not send mask_a, and its Where is left out
    assert set(s0.outputs) == {"keep", "mm0"} and s0.skipped_nodes == ("where_a",)
    assert set(s1.inputs) == {"keep", "mm0"} and "mask_b" in s1.outputs
    plain = assign_stages(view, bounds, sizes, [1.0] * 3, [0.0] * 3, StageOptions(share_equal_values=False))
    assert set(plain[2].inputs) == {"h1", "mask_a", "mask_b"}
    manifest = export_stages(view, plan_for(view, bounds), tmp_path / "out")
    assert manifest.stages[2].same_values == (SameValue("mask_a", "mask_b"),)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with StageChain.from_manifest(tmp_path / "out") as chain:
        for seed in range(3):
            feeds = feeds_for(model, seed, batch=2)
            np.testing.assert_array_equal(chain.run(feeds)["y"], session.run(None, feeds)[0])


def test_the_partitioner_counts_an_equal_value_once_at_a_cut() -> None:
    """The cut bytes the partitioner weighs are what the stages send: at the cut in front of stage 2 the
    mask crosses once (it crossed twice before); at the first cut the mask counts once too, though the
    stages then send none of it (stage 1 makes it anew): the count is never below what is sent."""
    view = view_from_proto(masks_made_in_two_stages())
    profile = static_profile(view, shapes={"x": [2, 4], "m": [2, 4]})
    seq = sequences(view, profile)
    compute = [n.name for n in view.compute_nodes]
    cut1, cut2 = compute.index("matmul1"), compute.index("matmul2")
    size = 2 * 4 * 4
    assert seq.cut_bytes[cut2] == 2 * size  # h1 and the mask
    assert seq.cut_bytes[cut1] == size + size + 2 * 4  # mm0, the mask, keep (bool)
    specs = assign_stages(view, [0, cut1, cut2, len(compute)], seq.sizes, [1.0] * 3, [0.0] * 3)
    for spec, b in zip(specs[1:], (cut1, cut2), strict=True):
        assert spec.bytes_in <= seq.cut_bytes[b]
    assert specs[2].bytes_in == seq.cut_bytes[cut2]


def test_a_stage_whose_only_work_a_later_equal_value_replaces_still_loads(tmp_path: Path) -> None:
    """Regression (found by the fuzz test): stage 1 holds only ``where_a``, whose mask stage 3 now takes
    from stage 2's equal one.  Left out, the node would leave stage 1 a graph with no inputs, nodes or
    outputs, which onnxruntime cannot load; it stays, computing what nobody reads, as a dead node of
    the source does."""
    model = masks_made_in_two_stages()
    path = save(model, tmp_path / "two.onnx")
    view = load_model(path)
    compute = [n.name for n in view.compute_nodes]
    bounds = [0, compute.index("where_a"), compute.index("matmul0"), compute.index("matmul2"), len(compute)]
    sizes = {name: t.nbytes() for name, t in view.tensors.items()}
    specs = assign_stages(view, bounds, sizes, [1.0] * 4, [0.0] * 4)
    assert specs[1].node_names == ("where_a",) and not specs[1].skipped_nodes
    assert specs[1].outputs == () and specs[1].inputs == ("keep",)
    assert specs[3].aliases == (SameValue("mask_a", "mask_b"),)
    export_stages(view, plan_for(view, bounds), tmp_path / "out")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with StageChain.from_manifest(tmp_path / "out") as chain:
        feeds = feeds_for(model, 0, batch=2)
        np.testing.assert_array_equal(chain.run(feeds)["y"], session.run(None, feeds)[0])
