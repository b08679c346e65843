"""``--stages auto`` without a devices file, and the note of a node that bounds every split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_runner import run
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.cost.static import static_profile
from onnxpipe.ir.load import load_model
from onnxpipe.planning.bound import bounding_node
from onnxpipe.planning.planner import auto_here, plan
from onnxpipe.planning.request import PlanRequest


def head_model(path: Path) -> Path:
    """A few cheap nodes, then one MatMul that costs far more than all of them (an LM head)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4096])
    w = numpy_helper.from_array(np.ones((256, 4096), np.float32), "w")
    nodes = [helper.make_node("Relu", ["x"], ["a0"], name="r0")]
    for i in range(1, 4):
        nodes.append(helper.make_node("Relu", [f"a{i - 1}"], [f"a{i}"], name=f"r{i}"))
    nodes.append(helper.make_node("MatMul", ["a3", "w"], ["y"], name="lm_head"))
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=[w])
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_auto_without_devices_tries_the_counts_this_machine_runs(resnet: Path) -> None:
    view = load_model(resnet)
    prof = static_profile(view)
    chosen = auto_here(view, prof, PlanRequest("auto"), cpus=4)
    assert [k for k, _ in chosen.stage_counts_tried] == [1, 2, 3, 4]
    best = min(b for _, b in chosen.stage_counts_tried)
    assert chosen.bottleneck_seconds <= best * 1.05
    # the fewest within the tolerance: no smaller count is within it
    assert all(b > best * 1.05 for k, b in chosen.stage_counts_tried if k < chosen.k)
    assert any("`stages=auto` chose" in n and "4 CPU(s)" in n for n in chosen.notes)
    assert [k for k, _ in auto_here(view, prof, PlanRequest("auto"), cpus=1).stage_counts_tried] == [1]


def test_one_node_bounding_the_plan_is_named(tmp_path: Path) -> None:
    view = load_model(head_model(tmp_path / "head.onnx"))
    prof = static_profile(view)
    three = plan(view, prof, PlanRequest(3))
    bound = bounding_node(view, prof, three)
    assert bound is not None and bound.node == "lm_head" and bound.op_type == "MatMul"
    assert bound.useful_stages == 2 and bound.share_of_model > 0.5
    (note,) = [n for n in three.notes if n.startswith("one node bounds")]
    assert (
        "lm_head (MatMul)" in note
        and "3 stages are no faster than 2" in note
        and "`split_nodes=auto`" in note
    )
    assert bounding_node(view, prof, plan(view, prof, PlanRequest(1))) is None


def test_auto_in_the_cli_prints_the_counts_tried(
    resnet: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["plan", resnet, "--stages", "auto", "--cost", "static"], capfd)
    assert code == 0, err
    assert out.count("<- chosen") == 1 and "--stages auto chose" in out
