"""The cluster-aware planner end to end: devices, memory, orders, stage count, schedules, CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from paths import REPO_ROOT

import onnxpipe
from onnxpipe.api import PlanRequest, ProfileOptions, SplitOptions
from onnxpipe.cli import main
from onnxpipe.cluster.devicesfile import load_cluster
from onnxpipe.cluster.model import Cluster, Device, Link
from onnxpipe.core.errors import PartitionError, UsageError
from onnxpipe.planning.cluster import plan_pipeline
from onnxpipe.planning.request import ScheduleRequest

ROOT = REPO_ROOT
TRANSFORMER = ROOT / "sample_models" / "transformer_tiny.onnx"
EDGE = ROOT / "examples" / "devices" / "edge_1248.json"


@pytest.fixture(scope="module")
def view_and_profile() -> tuple[onnxpipe.ModelView, onnxpipe.Profile]:
    view = onnxpipe.load_model(TRANSFORMER)
    return view, onnxpipe.static_profile(view)


def _two(speed_a: float, speed_b: float, **kw: object) -> Cluster:
    return Cluster(
        (Device("a", speed=speed_a, **kw), Device("b", speed=speed_b, **kw)),  # type: ignore[arg-type]
        (Link(math.inf, 0.0),),
    )


def test_faster_device_gets_three_times_the_work(view_and_profile) -> None:
    view, prof = view_and_profile
    plan = plan_pipeline(view, prof, PlanRequest(2, devices=_two(1.0, 3.0)))
    slow, fast = plan.stages
    assert (slow.device, fast.device) == ("a", "b")
    ref_slow = slow.compute_seconds  # speed 1
    ref_fast = fast.compute_seconds * 3.0  # reference seconds of the fast stage's nodes
    assert 2.4 < ref_fast / ref_slow < 3.6
    # the bottleneck is the exact optimum of the heterogeneous problem
    assert plan.bottleneck_seconds == pytest.approx(max(slow.compute_seconds, fast.compute_seconds))


def test_plan_records_devices_and_costs_source(view_and_profile) -> None:
    view, prof = view_and_profile
    cluster = load_cluster(EDGE)
    plan = plan_pipeline(view, prof, PlanRequest(4, devices=cluster))
    assert [s.device for s in plan.stages] == list(cluster.names)
    assert [r.method for r in plan.device_costs] == ["scaled"] * 4
    assert plan.timeline is not None and plan.timeline.kind == "stream"
    # 100 Mbit/s links: every stage after the first pays its cut on the link
    assert all(s.transfer_seconds > 0 for s in plan.stages[1:])


def test_stages_auto_picks_fewest_within_tolerance(view_and_profile) -> None:
    view, prof = view_and_profile
    plan = plan_pipeline(view, prof, PlanRequest("auto", devices=load_cluster(EDGE)))
    # on a slow network a single fast-enough board beats paying for any link
    assert plan.k == 1
    assert any("`stages=auto` chose 1" in n for n in plan.notes)


def test_free_order_is_never_worse(view_and_profile) -> None:
    view, prof = view_and_profile
    cluster = Cluster(
        (Device("fast", speed=4.0), Device("slow", speed=1.0), Device("mid", speed=2.0)),
        (Link(1e9, 0.0), Link(1e9, 0.0)),
    )
    fixed = plan_pipeline(view, prof, PlanRequest(3, devices=cluster))
    free = plan_pipeline(view, prof, PlanRequest(3, devices=cluster, order="free"))
    assert free.bottleneck_seconds <= fixed.bottleneck_seconds * (1 + 1e-9)


def test_memory_too_small_names_the_memory_that_fits(view_and_profile) -> None:
    view, prof = view_and_profile
    tiny = _two(1.0, 1.0, memory_bytes=1000)
    with pytest.raises(PartitionError, match=r"smallest|would fit|need"):
        plan_pipeline(view, prof, PlanRequest(2, devices=tiny))


def test_training_schedule_choice_is_the_fastest_that_fits(view_and_profile) -> None:
    view, prof = view_and_profile
    cluster = _two(1.0, 1.0)
    best = plan_pipeline(
        view, prof, PlanRequest(2, devices=cluster, schedule=ScheduleRequest("auto", batch=4))
    )
    assert best.timeline is not None and best.timeline.kind in ("gpipe", "1f1b")
    for kind in ("gpipe", "1f1b"):
        for m in (1, 2, 4):
            other = plan_pipeline(
                view,
                prof,
                PlanRequest(2, devices=cluster, schedule=ScheduleRequest(kind, microbatches=m, batch=4)),
            )
            assert other.timeline is not None
            assert best.timeline.makespan <= other.timeline.makespan * (1 + 1e-9)


def test_bad_requests(view_and_profile) -> None:
    view, prof = view_and_profile
    with pytest.raises(UsageError, match="`stages=auto` needs `devices`"):
        plan_pipeline(view, prof, PlanRequest("auto"))
    with pytest.raises(PartitionError, match="choose `stages` between 1 and 4"):
        plan_pipeline(view, prof, PlanRequest(5, devices=load_cluster(EDGE)))
    with pytest.raises(UsageError, match="does not split `batch=4`"):
        plan_pipeline(view, prof, PlanRequest(2, schedule=ScheduleRequest("gpipe", microbatches=3, batch=4)))


def test_cli_plan_prints_table_and_draws(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "plan.png"
    code = main(
        [
            "plan",
            str(TRANSFORMER),
            "--devices",
            str(EDGE),
            "--stages",
            "4",
            "--cost",
            "static",
            "--schedule",
            "1f1b",
            "--microbatches",
            "4",
            "--batch",
            "8",
            "--plot",
            str(png),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "board-x8" in out and "schedule 1f1b: 4 micro-batches of 2 sample(s)" in out
    assert png.stat().st_size > 10_000


def test_split_with_devices_names_devices_in_manifest(tmp_path: Path) -> None:
    out = tmp_path / "stages"
    result = onnxpipe.split(
        TRANSFORMER,
        SplitOptions(
            out=out,
            plan=PlanRequest(2, devices=load_cluster(ROOT / "examples/devices/two_cpus.json")),
            profile=ProfileOptions(cost="static"),
        ),
    )
    assert result.report is not None and result.report.ok
    manifest = json.loads((out / "manifest.json").read_text())
    names = [d["name"] for d in json.loads((ROOT / "examples/devices/two_cpus.json").read_text())["devices"]]
    assert [s["device"] for s in manifest["stages"]] == names[:2]
