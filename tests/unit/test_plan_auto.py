"""``--stages auto`` without a devices file, and the note of a node that bounds every split."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_runner import run
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.cost.profile import CostSource, Profile
from onnxpipe.cost.static import static_profile
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.planning.planner import auto_here, bound_note, plan
from onnxpipe.planning.request import PlanRequest
from onnxpipe.planning.types import Plan


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
    (note,) = [n for n in three.notes if n.startswith("one node bounds")]
    assert note == bound_note(view, prof, three)
    assert (
        "lm_head (MatMul)" in note
        and "3 stages are no faster than 2" in note
        and "`split_nodes=auto`" in note
    )
    share = re.search(r"ms, (\d+)% of the model's time", note)
    assert share is not None and int(share.group(1)) > 50
    assert bound_note(view, prof, plan(view, prof, PlanRequest(1))) is None


def test_auto_in_the_cli_prints_the_counts_tried(
    resnet: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["plan", resnet, "--stages", "auto", "--cost", "static"], capfd)
    assert code == 0, err
    assert out.count("<- chosen") == 1 and "--stages auto chose" in out


def _auto_plan(resnet: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ModelView, Profile, PlanRequest, Plan]:
    """An ``auto`` plan of two stages on measured costs (a static profile marked measured, no session's
    call cost measured)."""
    monkeypatch.setattr("onnxpipe.planning.workers.call_seconds", lambda threads: 0.0)
    view = load_model(resnet)
    prof = dataclasses.replace(static_profile(view), source=CostSource.PROFILE.value)
    request = PlanRequest(stages="auto")
    two = auto_here(view, prof, request, cpus=2)
    assert two.k == 2
    return view, prof, request, two


@pytest.mark.parametrize("ratio", [0.66, 1.4])
def test_split_auto_keeps_a_pipeline_only_when_a_short_run_here_says_it_pays(
    resnet: Path, ratio: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``auto`` measured (here injected) against one session of the whole model: below it, one stage and a
    note that says why; above it, the split it chose, with what was measured."""
    from onnxpipe.api.splitting import paid_here
    from onnxpipe.planning.workers import make_plan

    view, prof, request, two = _auto_plan(resnet, monkeypatch)
    seen: list[Plan] = []

    def gain(v: ModelView, p: Plan) -> float:
        seen.append(p)
        return ratio

    got = paid_here(view, two, prof, request, lambda: make_plan(view, prof, 1), gain)
    assert seen == [two]
    if ratio < 1:
        assert got.k == 1 and got.stage_counts_tried == two.stage_counts_tried
        assert "chose 1 stage: a short run of the 2-stage pipeline here gave 0.66x" in got.notes[-1]
    else:
        assert got.stages == two.stages and "gave 1.40x the throughput" in got.notes[-1]


def test_split_auto_is_not_measured_where_the_estimates_say_nothing_of_this_machine(
    resnet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage count given, a static profile, or one stage chosen: nothing is run."""
    from onnxpipe.api.splitting import paid_here

    view, prof, request, two = _auto_plan(resnet, monkeypatch)

    def gain(v: ModelView, p: Plan) -> float:
        raise AssertionError("measured")

    def one() -> Plan:
        raise AssertionError("re-planned")

    assert paid_here(view, two, prof, PlanRequest(stages=2), one, gain) is two
    static = dataclasses.replace(prof, source=CostSource.STATIC.value)
    assert paid_here(view, two, static, request, one, gain) is two
    single = auto_here(view, prof, request, cpus=1)
    assert paid_here(view, single, prof, request, one, gain) is single


def test_split_auto_keeps_its_choice_when_the_short_run_fails(
    resnet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model the short run cannot feed keeps the estimates' choice, and the note says why."""
    from onnxpipe.api.splitting import paid_here
    from onnxpipe.core.errors import RuntimeStageError

    view, prof, request, two = _auto_plan(resnet, monkeypatch)

    def gain(v: ModelView, p: Plan) -> float:
        raise RuntimeStageError("stage 1 failed: no")

    def one() -> Plan:
        raise AssertionError("re-planned")

    got = paid_here(view, two, prof, request, one, gain)
    assert (
        got.stages == two.stages and "could not be run against the whole model here (stage 1" in got.notes[-1]
    )
