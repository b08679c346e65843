"""Calibration for two devices that differ only by speed, on a real model (issue 31): the plan, its cost
records and its note agree with each other and with the devices file.  Nothing here compares a
measured time with anything: what the stages measure is the machine's, the consistency is the code's
(the rules on plain numbers: tests/unit/test_calibrate_devices.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from paths import DEVICES

from onnxpipe import api
from onnxpipe.api import CalibrationOptions, PlanRequest, SplitOptions
from onnxpipe.cluster.devicesfile import load_cluster

pytestmark = pytest.mark.slow

ROUNDS = 3


def test_a_speed_1_and_3_plan_its_costs_and_its_note_agree(
    bert_tiny_dynamo_path: Path, tmp_path: Path
) -> None:
    cluster = load_cluster(DEVICES / "speeds_1_3.json")
    done = api.split(
        bert_tiny_dynamo_path,
        SplitOptions(
            out=tmp_path / "split",
            plan=PlanRequest(2, devices=cluster),
            calibration=CalibrationOptions(rounds=ROUNDS),
        ),
    )
    assert done.report is not None and done.report.ok  # the stages still compute the model
    the_plan, manifest = done.plan, done.manifest
    # the devices as the file wrote them: the declared speeds, no scratch profile of calibration's
    assert manifest.cluster is not None and manifest.cluster.devices == cluster.devices
    assert [st.device for st in manifest.stages] == ["slow", "fast"]
    # both devices' costs are the one calibrated reference divided by their declared speed
    rows = {r.device: r.node_seconds for r in the_plan.device_costs}
    assert rows["slow"].keys() == rows["fast"].keys()
    assert all(rows["fast"][n] == pytest.approx(t / 3.0, rel=1e-12) for n, t in rows["slow"].items())
    for record in manifest.device_costs:
        assert record.method == "scaled" and "the speed kept" in record.source, record.source
    # each stage's estimate is the sum of its nodes' costs on its device, in the plan and the manifest
    for stage, entry in zip(the_plan.stages, manifest.stages, strict=True):
        row = rows[stage.device]
        assert stage.compute_seconds == pytest.approx(
            sum(row.get(n, 0.0) for n in stage.node_names), rel=1e-9
        )
        assert entry.estimated_compute_seconds == pytest.approx(stage.compute_seconds, rel=1e-12)
    # the note: one error per round timed, the rounds' evenness when there were several, and a stop
    # only with the cut it kept named, an earlier round than the one that stopped it
    note = next(n for n in manifest.plan.notes if n.startswith("calibrated in"))
    n = int(re.match(r"calibrated in (\d+) round\(s\)", note).group(1))  # type: ignore[union-attr]
    assert 1 <= n <= ROUNDS
    assert "by the CPU time of its one thread" in note and "divided by the device's speed" in note
    errors = re.findall(r"(\d+\.\d)% in round (\d+)", note)
    assert [int(r) for _, r in errors] == list(range(1, n + 1))
    evenness = re.search(r"as timed in each round: ([\d., ]+)", note)
    assert (evenness is not None) == (n > 1)
    if evenness is not None:
        assert len(evenness.group(1).strip(" ,").split(", ")) == n
    stopped = re.search(r"round (\d+) ran less evenly than round (\d+), so calibration stopped", note)
    kept = re.search(r"kept the cut timed in round (\d+)", note)
    if stopped is not None:
        assert int(stopped.group(1)) == n and kept is not None and int(kept.group(1)) < n
    if kept is not None:
        assert note.endswith("its estimates are those it was planned with")
    else:
        assert note.endswith("the estimates below come from the corrected costs")
