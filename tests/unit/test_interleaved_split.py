"""``onnxpipe split --stages K --workers W``: interleaved stages from the schedule to a running pipeline.

The partitioner itself is checked against brute force in ``test_interleave.py``; here: the shared-worker
schedule against a hand-computed one, the manifest fields and their validation, the command line and its
refusals, and a pipeline over an interleaved split that equals the model, pinned per worker.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from cli_runner import run

from onnxpipe.api import PlanRequest, ProfileOptions
from onnxpipe.core.errors import ManifestError, UsageError
from onnxpipe.core.jsonread import Document, Value
from onnxpipe.cost.source import get_profile
from onnxpipe.manifest import layout
from onnxpipe.manifest.layout import timeline_obj
from onnxpipe.planning.planner import plan as make_plan
from onnxpipe.runtime.affinity import assign_cpus
from onnxpipe.runtime.spec import Placement, WorkerSpec
from onnxpipe.schedule.simulate import simulate
from onnxpipe.schedule.timeline import Timeline


def test_shared_workers_take_turns_deeper_stage_first() -> None:
    tl = simulate("stream", [1.0, 1.0, 1.0, 1.0], None, [0.0] * 4, 4, workers=[0, 1, 0, 1])
    starts = [[st.start for st in row] for row in tl.stages]
    # worker 0 runs stage 0 for micro-batches 0 and 1, then stage 2 whenever its input is there (ties
    # go to the deeper stage), and so on: the hand-worked timeline
    assert starts == [[0, 1, 4, 5], [1, 2, 5, 6], [2, 3, 6, 7], [3, 4, 7, 8]]
    assert tl.makespan == 9.0 and tl.steady_state_throughput_per_s == 0.5
    assert tl.devices == 2 and tl.workers == (0, 1, 0, 1)
    assert tl.bubble_fraction == pytest.approx(1 - 16 / 18)
    for w in (0, 1):  # a worker never runs two steps at once
        spans = sorted((st.start, st.end) for s, row in enumerate(tl.stages) if s % 2 == w for st in row)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


def _read(obj: object) -> Timeline:
    """The schedule read back as the manifest reads its ``schedule`` field."""
    return layout.timeline(
        Value(obj, "schedule", Document("manifest.json", ManifestError, "re-run onnxpipe split"))
    )


def test_shared_schedule_round_trips_and_plain_ones_stay_as_they_were() -> None:
    tl = simulate("stream", [2.0, 1.0, 1.0, 2.0], None, [0.0, 0.5, 0.5, 0.5], 3, workers=[0, 1, 0, 1])
    obj = timeline_obj(tl)
    assert [d["worker"] for d in obj["devices"]] == [0, 1, 0, 1]
    assert _read(json.loads(json.dumps(obj))) == tl
    assert tl.steady_state_throughput_per_s == 1 / 3.0  # worker 0: 2 + 1 s per micro-batch
    plain = simulate("stream", [1.0, 1.0], None, [0.0, 0.0], 2)
    assert "worker" not in timeline_obj(plain)["devices"][0] and plain.workers is None


def test_shared_schedule_refusals() -> None:
    with pytest.raises(UsageError, match="inference only"):
        simulate("gpipe", [1.0, 1.0], [2.0, 2.0], [0.0, 0.0], 2, workers=[0, 0])
    with pytest.raises(ValueError, match="each of the 2 stages a worker"):
        simulate("stream", [1.0, 1.0], None, [0.0, 0.0], 2, workers=[0])
    obj = timeline_obj(simulate("stream", [1.0, 1.0], None, [0.0, 0.0], 2, workers=[0, 0]))
    del obj["devices"][1]["worker"]
    with pytest.raises(
        ManifestError, match=r"devices\[1\]\.worker: give a worker for every stage or for none"
    ):
        _read(obj)


def test_zero_costs_split_on_workers(sample_models_dir: Path, tmp_path: Path) -> None:
    """Every split ties at 0 s: the least memory wins, and nothing divides by the zero bottleneck."""
    from onnxpipe.cost.profile import Profile
    from onnxpipe.ir.load import load_model

    view = load_model(sample_models_dir / "mlp.onnx")
    prof = get_profile(view, ProfileOptions(cost="static"))
    zero = Profile.__new__(Profile)
    zero.__dict__.update(prof.__dict__)
    object.__setattr__(zero, "node_seconds", dict.fromkeys(prof.node_seconds, 0.0))
    plan = make_plan(view, zero, PlanRequest(4, workers=2))
    assert plan.bottleneck_seconds == 0.0 and any("0.00% slower" in n for n in plan.notes)


def test_time_slack_must_be_a_share(
    sample_models_dir: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(
        [
            "split",
            sample_models_dir / "mlp.onnx",
            "-k",
            "4",
            "--workers",
            "2",
            "--time-slack",
            "-1",
            "--out",
            "o",
        ],
        capfd,
    )
    assert code == 2 and "must be a finite number of 0 or more" in err and not (work / "o").exists()


def _spec(index: int, threads: int) -> WorkerSpec:
    return WorkerSpec(index, f"s{index}", "m.onnx", (), (), (), (), Placement(threads=threads))


def test_pinning_gives_each_worker_one_set_sized_for_its_hungriest_stage(tmp_path: Path) -> None:
    lanes, note = assign_cpus(
        [[_spec(0, 1), _spec(1, 2), _spec(2, 2), _spec(3, 1)]],
        cpus=[0, 1, 2, 3],
        sysfs=tmp_path,
        workers=[0, 1, 0, 1],
    )
    assert note is None
    assert [s.placement.cpus for s in lanes[0]] == [(0, 1), (2, 3), (0, 1), (2, 3)]
    _, note = assign_cpus(
        [[_spec(0, 2), _spec(1, 2), _spec(2, 2), _spec(3, 1)]],
        cpus=[0, 1, 2],
        sysfs=tmp_path,
        workers=[0, 1, 0, 1],
    )
    assert note is not None and "4 intra-op threads" in note
    with pytest.raises(ValueError, match="workers names 2 stages, the lane has 4"):
        assign_cpus([[_spec(i, 1) for i in range(4)]], cpus=[0, 1], sysfs=tmp_path, workers=[0, 1])
