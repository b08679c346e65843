"""``objective="latency"`` (one request alone: the sum of every stage and link) and ``stages="auto"``
leaving out a device that slows the pipeline (:class:`onnxpipe.planning.orders.KeptDevices`)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_runner import run
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.cluster.devicesfile import load_cluster
from onnxpipe.cluster.model import Cluster, Device, Link
from onnxpipe.core.choices import Objective
from onnxpipe.core.errors import UsageError
from onnxpipe.cost.profile import Profile
from onnxpipe.cost.static import static_profile
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.partition import HeterogeneousRequest, Partition, solve_heterogeneous
from onnxpipe.planning import orders
from onnxpipe.planning.orders import KeptDevices, stages_auto
from onnxpipe.planning.planner import plan
from onnxpipe.planning.request import PlanRequest, ScheduleRequest

MS = 1e-3


def chain(path: Path, n: int) -> Path:
    """``n`` nodes in a row, each adding its own 1 KiB of weights: every cut moves the same 1 KiB."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])
    y = helper.make_tensor_value_info(f"a{n - 1}", TensorProto.FLOAT, [1, 256])
    weights = [numpy_helper.from_array(np.full((1, 256), i, np.float32), f"w{i}") for i in range(n)]
    nodes = [
        helper.make_node("Add", ["x" if i == 0 else f"a{i - 1}", f"w{i}"], [f"a{i}"], name=f"add{i}")
        for i in range(n)
    ]
    graph = helper.make_graph(nodes, "chain", [x], [y], initializer=weights)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def chain_plan_inputs(tmp_path: Path, n: int) -> tuple[ModelView, Profile]:
    """The chain with every node at 1 ms."""
    view = load_model(chain(tmp_path / "chain.onnx", n))
    costs = {node.name: MS for node in view.compute_nodes}
    return view, dataclasses.replace(static_profile(view), node_seconds=costs, total_seconds=n * MS)


def cluster(*speeds: float, bandwidth: float = math.inf, memory: int | None = None) -> Cluster:
    devices = tuple(Device(f"d{i}-x{s:g}", speed=s, memory_bytes=memory) for i, s in enumerate(speeds))
    return Cluster(devices, (Link(bandwidth),) * (len(speeds) - 1), source="devices.json")


def items_solver(costs: list[float]) -> Callable[[Cluster], Partition]:
    def solve(c: Cluster) -> Partition:
        return solve_heterogeneous(HeterogeneousRequest(costs, speeds=c.speeds), c.size)

    return solve


# ----------------------------------------------------------------------------------------------------------
# leaving out a slow device


@pytest.mark.parametrize("max_sets", [orders.MAX_SETS, 1])  # every set, or the backward elimination
def test_a_device_ten_times_slower_in_the_middle_is_left_out_with_a_note(
    max_sets: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(orders, "MAX_SETS", max_sets)
    devices = cluster(1.0, 0.1, 1.0)
    kept = KeptDevices(devices, items_solver([1.0] * 4), Objective.THROUGHPUT)
    assert kept.exact == (max_sets > 1)
    choice = stages_auto(devices.size, kept.search)
    # with it, its one item at least takes 10 s; without it the fast two share 4 items: 2 s
    assert choice.k == 2 and choice.result.order == (0, 2) and choice.result.bottleneck == 2.0
    assert dict(choice.bottlenecks) == {1: 4.0, 2: 2.0, 3: 10.0}  # the file's first two: 10 s
    (note,) = kept.notes(choice.result)
    assert note == (
        "`stages=auto` left out d1-x0.1, which makes the pipeline slower: 0.5 micro-batches/s without it, "
        "0.1 micro-batches/s with it"
    )


def test_a_slow_device_that_helps_is_kept() -> None:
    devices = cluster(1.0, 0.1)
    kept = KeptDevices(devices, items_solver([0.1] * 400), Objective.THROUGHPUT)
    choice = stages_auto(devices.size, kept.search)
    assert choice.k == 2 and choice.result.order == (0, 1)  # 40 s alone, 36.4 s with it: 9% faster
    assert choice.result.bottleneck == pytest.approx(36.4) and kept.notes(choice.result) == []


def test_edge_boards_leave_out_the_slowest_though_the_file_lists_it_first(tmp_path: Path) -> None:
    """Eight 1 ms nodes on boards of speeds 1, 2, 4 and 8: whatever board-x1 holds takes 1 ms at least;
    the plan of three stages used to be the file's first three boards."""
    view, prof = chain_plan_inputs(tmp_path, 8)
    edge = load_cluster(Path(__file__).resolve().parents[2] / "examples" / "devices" / "edge_1248.json")
    made = plan(view, prof, PlanRequest("auto", devices=edge))
    assert [s.device for s in made.stages] == ["board-x2", "board-x4", "board-x8"]
    assert made.bottleneck_seconds == pytest.approx(0.625 * MS)
    (note,) = [n for n in made.notes if "left out" in n]
    assert "left out board-x1" in note and "1600.0 micro-batches/s without it, 1000.0" in note


def test_identical_devices_stay_the_first_ones_and_a_link_list_drops_only_the_ends() -> None:
    same = cluster(1.0, 1.0, 1.0)
    kept = KeptDevices(same, items_solver([1.0] * 4), Objective.THROUGHPUT)
    assert [kept.search(k).order for k in (1, 2, 3)] == [(0,), (0, 1), (0, 1, 2)]
    listed = Cluster(cluster(1.0, 0.1, 1.0).devices, (Link(1e9), Link(2e9)), source="devices.json")
    kept = KeptDevices(listed, items_solver([1.0] * 4), Objective.THROUGHPUT)
    assert kept.search(2).order == (0, 1)  # (0, 2) has no link between them; (1, 2) is no faster
    assert kept.notes(kept.search(2)) == []  # d2 joins only with d1 in between


def test_plan_auto_on_devices_leaves_the_slow_one_out(tmp_path: Path) -> None:
    view, prof = chain_plan_inputs(tmp_path, 5)
    made = plan(view, prof, PlanRequest("auto", devices=cluster(1.0, 0.1, 1.0)))
    assert [s.device for s in made.stages] == ["d0-x1", "d2-x1"]
    assert made.bottleneck_seconds == pytest.approx(3 * MS)
    assert any(n.startswith("`stages=auto` left out d1-x0.1, which makes") for n in made.notes), made.notes
    assert made.optimized_for == Objective.THROUGHPUT


# ----------------------------------------------------------------------------------------------------------
# the latency objective in plans


def test_latency_keeps_one_device_unless_memory_forces_a_split(tmp_path: Path) -> None:
    view, prof = chain_plan_inputs(tmp_path, 6)
    latency = PlanRequest("auto", devices=cluster(1.0, 1.0, 1.0, bandwidth=1e6), objective="latency")
    one = plan(view, prof, latency)
    assert one.k == 1 and one.latency_seconds == pytest.approx(6 * MS) and one.optimized_for == "latency"
    assert "latency of one request" in one.objective
    left = [n for n in one.notes if "left out" in n]
    assert len(left) == 2 and left[0].startswith(
        "`stages=auto` left out d1-x1, which makes a request slower: 6.000 ms per request alone without it, "
        "7.024 ms per request alone with it"  # a hop of 1 KiB at 1 MB/s
    )
    throughput = plan(view, prof, dataclasses.replace(latency, objective="throughput"))
    assert throughput.k == 3 and throughput.latency_seconds > one.latency_seconds
    # 6 KiB of weights, 4.5 KiB a device (a stage after the first also holds two received KiB): two stages
    capped = plan(
        view, prof, dataclasses.replace(latency, devices=cluster(1.0, 1.0, 1.0, bandwidth=1e6, memory=4608))
    )
    assert capped.k == 2 and capped.latency_seconds == pytest.approx(6 * MS + 1024 / 1e6)


def test_latency_prefers_the_fast_device_over_a_hop(tmp_path: Path) -> None:
    view, prof = chain_plan_inputs(tmp_path, 8)
    request = PlanRequest(2, devices=cluster(1.0, 2.0, bandwidth=1e6), objective=Objective.LATENCY)
    made = plan(view, prof, request)
    # the first node stays on the slow device (stage 0 is not optional), the rest run twice as fast
    assert [len(s.node_names) for s in made.stages] == [1, 7]
    assert made.latency_seconds == pytest.approx(MS + 7 * MS / 2 + 1024 / 1e6)
    throughput = plan(view, prof, dataclasses.replace(request, objective=Objective.THROUGHPUT))
    assert throughput.bottleneck_seconds == pytest.approx(3 * MS)
    assert made.bottleneck_seconds == pytest.approx(3.5 * MS)
    assert throughput.latency_seconds > made.latency_seconds


def test_latency_refuses_what_serves_a_stream() -> None:
    with pytest.raises(UsageError, match=r"`objective=latency` plans inference one request at a time"):
        PlanRequest(2, objective="latency", schedule=ScheduleRequest(kind="gpipe")).check()
    with pytest.raises(UsageError, match=r"`objective=fastest`: choose one of throughput, latency"):
        PlanRequest(2, objective="fastest")  # type: ignore[arg-type]


def test_the_cli_says_the_objective_and_refuses_a_bad_one(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    model = chain(tmp_path / "chain.onnx", 4)
    code, out, err = run(["plan", model, "--stages", "2", "--cost", "static", "--objective", "fast"], capfd)
    assert code == 2 and err.count("\n") == 1 and "--objective: invalid choice: 'fast'" in err
    code, out, err = run(
        ["plan", model, "--stages", "2", "--cost", "static", "--objective", "latency", "--json"], capfd
    )
    assert code == 0, err
    obj = json.loads(out)["plan"]
    assert obj["optimized_for"] == "latency" and obj["latency_seconds"] > 0
    code, out, err = run(["plan", model, "--stages", "2", "--cost", "static"], capfd)
    assert code == 0 and "objective: throughput; one sample alone through every stage and link takes" in out
