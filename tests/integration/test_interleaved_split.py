"""``onnxpipe split --stages K --workers W``: interleaved stages from the schedule to a running pipeline.

The partitioner itself is checked against brute force in ``test_interleave.py``; here: the shared-worker
schedule against a hand-computed one, the manifest fields and their validation, the command line and its
refusals, and a pipeline over an interleaved split that equals the model, pinned per worker.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import run
from manifest_edits import sealed
from runtime_support import MODES, assert_same, original_outputs, token_batches

from onnxpipe import api
from onnxpipe.api import PlanRequest, ProfileOptions, SplitOptions
from onnxpipe.core.errors import ManifestError, UsageError
from onnxpipe.manifest import Manifest, load_manifest
from onnxpipe.runtime.base import LocalConfig
from onnxpipe.runtime.pipeline import Pipeline


@pytest.fixture(scope="module")
def interleaved(tmp_path_factory: pytest.TempPathFactory, sample_models_dir: Path) -> Path:
    """The sample transformer in 4 stages on 2 workers (static costs)."""
    out = tmp_path_factory.mktemp("interleaved") / "split"
    api.split(
        sample_models_dir / "transformer_tiny.onnx",
        SplitOptions(out=out, plan=PlanRequest(4, workers=2), profile=ProfileOptions(cost="static")),
    )
    return out


def test_manifest_records_the_workers(interleaved: Path) -> None:
    m = load_manifest(interleaved)
    assert m.k == 4 and m.workers == 2 and m.plan.workers == 2 and m.plan.time_slack == 0.01
    assert [m.worker_of(s) for s in range(4)] == [0, 1, 0, 1]
    assert m.stages_of(0) == (0, 2) and m.stages_of(1) == (1, 3)
    assert m.schedule.workers == (0, 1, 0, 1)
    loads = [sum(m.stages[s].estimated_compute_seconds for s in m.stages_of(w)) for w in (0, 1)]
    assert m.plan.bottleneck_seconds == pytest.approx(max(loads))
    assert any("interleaved on 2 workers" in n for n in m.plan.notes)
    assert any(n.startswith("a contiguous split into 2 stages: slowest stage") for n in m.plan.notes)


def _edited(folder: Path, edit: object) -> str:
    obj = json.loads((folder / "manifest.json").read_text())
    edit(obj)  # type: ignore[operator]
    return sealed(obj)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda o: o["stages"][1].update(worker=0), r"stages\[1\]\.worker: expected 1 \(stage s runs on"),
        (lambda o: o["stages"][2].pop("worker"), r"stages\[2\]\.worker: missing"),
        (lambda o: o["plan"].update(workers=5), r"plan\.workers: 5 workers cannot each run"),
        (lambda o: o["plan"].update(worker_param_bytes=[1]), r"plan\.worker_param_bytes: gives 1 workers'"),
        (lambda o: o["plan"].pop("workers"), r"stages\[0\]\.worker: is given but plan\.workers is not"),
        (lambda o: o["stages"][0].update(worker=-1), r"stages\[0\]\.worker"),
        (
            lambda o: o["schedule"]["devices"][1].update(worker=99),
            r"schedule\.devices\[1\]\.worker: expected 1",
        ),
        (
            lambda o: o["schedule"]["devices"][2].pop("worker"),
            r"schedule\.devices\[2\]\.worker: give a worker",
        ),
        (
            lambda o: o["schedule"]["devices"][0].pop("worker"),
            r"schedule\.devices\[0\]\.worker: give a worker",
        ),
        (lambda o: o["plan"].update(time_slack=None), r"plan\.time_slack: expected a number"),
        (lambda o: o["plan"].update(time_slack=-0.5), r"plan\.time_slack: expected a share of 0 or more"),
    ],
)
def test_manifest_worker_fields_are_validated(interleaved: Path, edit: object, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        Manifest.from_json(_edited(interleaved, edit))


def test_a_manifest_without_workers_means_one_per_stage(interleaved: Path) -> None:
    def strip(o: dict) -> None:  # type: ignore[type-arg]
        o["plan"].pop("workers")
        o["plan"].pop("time_slack")
        o["plan"].pop("worker_param_bytes")
        for st in o["stages"]:
            st.pop("worker")
        for d in o["schedule"]["devices"]:
            d.pop("worker")

    m = Manifest.from_json(_edited(interleaved, strip))
    assert m.workers == 4 and [m.worker_of(s) for s in range(4)] == [0, 1, 2, 3] and m.stages_of(3) == (3,)

    def slack_only(o: dict) -> None:  # type: ignore[type-arg]
        strip(o)
        o["plan"]["time_slack"] = 0.01

    def schedule_only(o: dict) -> None:  # type: ignore[type-arg]
        strip(o)
        for i, d in enumerate(o["schedule"]["devices"]):
            d["worker"] = i % 2

    with pytest.raises(ManifestError, match=r"plan\.time_slack: is given but plan\.workers is not"):
        Manifest.from_json(_edited(interleaved, slack_only))
    with pytest.raises(ManifestError, match=r"schedule\.devices\[0\]\.worker: is given but plan\.workers"):
        Manifest.from_json(_edited(interleaved, schedule_only))


def test_split_workers_on_the_command_line(
    sample_models_dir: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    model = sample_models_dir / "resnet_tiny.onnx"
    code, out, err = run(
        ["split", model, "--stages", "4", "--workers", "2", "--time-slack", "0.05", "--out", "o",
         "--cost", "static"],
        capfd,
    )  # fmt: skip
    assert code == 0, err
    assert "interleaved on 2 workers" in out and "verify: 1 output(s) match the original" in out
    assert "worker 0: stages 0, 2" in out and "worker 1: stages 1, 3" in out
    m = load_manifest(work / "o")
    assert m.plan.time_slack == 0.05 and m.workers == 2
    code, out, _ = run(["inspect", "o"], capfd)
    assert code == 0 and "worker 1: stages 1, 3" in out
    code, out, _ = run(["plan", model, "--stages", "4", "--workers", "2", "--cost", "static"], capfd)
    assert code == 0 and "worker 0: stages 0, 2" in out
    lines = out.splitlines()
    table = next(i for i, line in enumerate(lines) if line.split()[:2] == ["stage", "device"])
    assert [line.split()[:3] for line in lines[table + 2 : table + 4]] == [
        ["0", "worker", "0"],
        ["1", "worker", "1"],
    ]
    code, out, err = run(
        ["split", model, "-k", "2", "--workers", "2", "--out", "same", "--cost", "static"], capfd
    )
    assert code == 0, err
    assert load_manifest(work / "same").plan.workers is None  # a worker per stage: an ordinary split


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--stages", "5", "--workers", "3"], "give a multiple of 3 stages, or one more"),
        (["--stages", "4", "--workers", "2", "--schedule", "gpipe"], "planned for inference"),
        (
            ["--stages", "4", "--workers", "2", "--order", "free"],
            "cannot be combined with --devices or --order",
        ),
        (["--stages", "auto", "--workers", "2"], "--workers needs a number of --stages"),
        (["--stages", "4", "--time-slack", "0.1"], "--time-slack 0.1: it trades time for balanced weights"),
        (
            ["--stages", "2", "--workers", "2", "--time-slack", "0.1"],
            "give --workers W with --stages a multiple",
        ),
        (
            ["--stages", "4", "--workers", "2", "--calibrate", "1", "--calibrate-in", "pipeline"],
            "interleaved stages share their workers' CPUs: use --calibrate-in alone",
        ),
    ],
)
def test_split_workers_refusals_leave_nothing(
    sample_models_dir: Path, work: Path, capfd: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    code, _, err = run(["split", sample_models_dir / "mlp.onnx", "--out", "o", *extra], capfd)
    assert code == UsageError.exit_code and message in err and len(err.strip().splitlines()) == 1
    assert not (work / "o").exists()


@pytest.mark.parametrize("mode", MODES)
def test_interleaved_pipeline_equals_the_model(interleaved: Path, sample_models_dir: Path, mode: str) -> None:
    batches = token_batches(24, seed=5)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    with Pipeline.from_manifest(interleaved, LocalConfig(mode=mode, pin=True)) as pipe:  # type: ignore[arg-type]
        actual = list(pipe.stream(batches))
        lanes = pipe.lanes
    assert_same(expected, actual)
    if pipe.pin_note is None:  # pinned: the stages of a worker share its CPUs, the workers do not
        cpus = [spec.placement.cpus for spec in lanes[0]]
        assert cpus[0] == cpus[2] and cpus[1] == cpus[3] and not set(cpus[0]) & set(cpus[1])


def test_interleaved_split_runs_from_the_command_line(
    interleaved: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """``--compare`` sets the pipeline's 2 workers, not its 4 stages, against 2 replicas."""
    code, out, err = run(
        ["run", interleaved, "--microbatches", "4", "--warmup", "1", "--compare", "--report", "r.json"], capfd
    )
    assert code == 0, err
    assert "2 replicas of the model" in out
    report = json.loads((work / "r.json").read_text())
    assert report["baselines"]["replicas"]["workers"] == 2
    assert report["baselines"]["session_total_threads"]["total_threads"] == 2
