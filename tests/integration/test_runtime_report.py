"""The measurements of ``onnxpipe run``: what each number is computed from, not how fast anything runs.

Most tests feed synthetic worker records to :mod:`onnxpipe.runtime.report` and check the logic (which
clock a rate comes from, what the estimates are compared with, what memory may be compared); a few run
the tiny sample split to check the report's structure end to end.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import numpy_helper
from runtime_support import (
    CPU,
    MODES,
    FakeBackend,
    FakePipeline,
    as_pipeline,
    assert_same,
    entry,
    measurement,
    original_outputs,
    parse,
    records,
    spec,
    split_on_devices,
    stats,
    token_batches,
)

from onnxpipe import api
from onnxpipe.api import PlanRequest, ProfileOptions, SplitOptions
from onnxpipe.cli import run as run_command
from onnxpipe.core import engine_onnxruntime, ortsession
from onnxpipe.core.choices import LocalMode
from onnxpipe.core.text import human_bytes
from onnxpipe.manifest import Manifest, load_manifest
from onnxpipe.runtime.base import LocalConfig
from onnxpipe.runtime.inputs import input_shapes_for, random_inputs
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.report import baselines as compare
from onnxpipe.runtime.report.build import build_report, check_estimates
from onnxpipe.runtime.report.measure import measure
from onnxpipe.runtime.report.model import BaselineReport, RunReport
from onnxpipe.runtime.report.text import format_report, memory_line
from onnxpipe.runtime.spec import (
    CUDA_PROVIDER,
    Placement,
    manifest_placements,
    stage_specs,
)


@pytest.fixture(scope="module")
def devices_split(tmp_path_factory: pytest.TempPathFactory, sample_models_dir: Path) -> Path:
    """The tiny transformer split with ``--devices``: stage 0 on a 2-thread device, stage 1 on 1 thread."""
    base = tmp_path_factory.mktemp("devices")
    return split_on_devices(base, sample_models_dir, ("board-a", CPU, 2), ("board-b", CPU, 1))


@pytest.fixture(scope="module")
def interleaved_split(tmp_path_factory: pytest.TempPathFactory, sample_models_dir: Path) -> Path:
    """The sample MLP in 4 stages dealt out to 2 workers (stage s on worker s % 2, static costs)."""
    out = tmp_path_factory.mktemp("interleaved") / "split"
    api.split(
        sample_models_dir / "mlp.onnx",
        SplitOptions(
            out=out, plan=PlanRequest(4, workers=2), profile=ProfileOptions(cost="static"), verify=False
        ),
    )
    return out


def test_measure_runs_single_micro_batches_after_the_stream(tiny_split: Path) -> None:
    with Pipeline.from_manifest(tiny_split, LocalConfig(mode="threads")) as pipe:
        m = measure(pipe, token_batches(10), warmup=1, single=3)
        capacity = pipe.capacity
    assert m.microbatches == 10 and len(m.single_latencies_s) == 3
    assert m.outputs == ()  # dropped as they came (see measure)
    assert all(t > 0 for t in m.single_latencies_s)
    assert m.in_flight == min(capacity, 10)
    assert m.output_workers == (1,)
    assert [len(s.records) for s in m.stats] == [10, 10]  # the single runs came after the stats
    assert m.steady_throughput_from == "worker"


def test_measure_keeps_the_outputs_in_order_when_asked(tiny_split: Path, sample_models_dir: Path) -> None:
    batches = token_batches(9, seed=4)
    with Pipeline.from_manifest(tiny_split, LocalConfig(mode="threads")) as pipe:
        m = measure(pipe, batches, keep_outputs=True)
    assert m.microbatches == 9
    assert_same(original_outputs(sample_models_dir / "transformer_tiny.onnx", batches), list(m.outputs))


def test_compare_checks_the_outputs_and_fails_on_a_mismatch(
    tiny_split: Path, tmp_path: Path, sample_models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--compare checks each distinct input's outputs in a pass of their own: a wrong model is caught."""
    model = onnx.load(str(sample_models_dir / "transformer_tiny.onnx"))
    weight = next(t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT)
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) + 1.0, weight.name))
    other = tmp_path / "other.onnx"
    onnx.save(model, str(other))
    report = tmp_path / "report.json"
    argv = ["-m", "6", "--compare", "--report", str(report)]
    code = run_command(parse(str(tiny_split), *argv, "--model", str(other)))
    assert code == 1
    assert "DO NOT match" in capsys.readouterr().out
    assert json.loads(report.read_text())["outputs_match"] is False


def test_a_devices_split_is_comparable_on_its_own_devices(devices_split: Path) -> None:
    """Regression: a split made with --devices was compared with the reference profile's threads."""
    manifest = load_manifest(devices_split)
    shapes = {n: tuple(v) for n, v in manifest.plan.profiled_input_shapes.items()}
    own = stage_specs(devices_split, manifest, manifest_placements(manifest))
    assert [s.placement.threads for s in own] == [2, 1] and manifest.plan.threads == 1
    comparable, notes = check_estimates(manifest, own, shapes)
    assert comparable, notes

    one = stage_specs(devices_split, manifest, manifest_placements(manifest, threads=1))
    comparable, notes = check_estimates(manifest, one, shapes)
    assert not comparable
    assert any("stage 0 ran with 1 thread(s), its estimate is for 2" in n for n in notes)
    assert not any("stage 1 ran" in n for n in notes)

    gpu = [Placement(CUDA_PROVIDER, (), 2), Placement(CPU, (), 1)]
    comparable, notes = check_estimates(manifest, stage_specs(devices_split, manifest, gpu), shapes)
    assert not comparable
    assert any(f"stage 0 ran on {CUDA_PROVIDER}" in n and f"for {CPU}" in n for n in notes)


def test_a_split_without_devices_is_compared_with_the_plans_threads(tiny_split: Path) -> None:
    manifest = load_manifest(tiny_split)
    shapes = {n: tuple(v) for n, v in manifest.plan.profiled_input_shapes.items()}
    plan = manifest.plan.threads
    same = stage_specs(tiny_split, manifest, manifest_placements(manifest))
    assert check_estimates(manifest, same, shapes)[0]
    more = stage_specs(tiny_split, manifest, manifest_placements(manifest, threads=plan + 1))
    comparable, notes = check_estimates(manifest, more, shapes)
    assert not comparable and any(f"its estimate is for {plan}" in n for n in notes)
    other_shapes = {n: (*s[:-1], s[-1] + 1) for n, s in shapes.items()}
    assert not check_estimates(manifest, same, other_shapes)[0]


def test_a_session_baseline_opens_the_model_on_the_given_provider(
    monkeypatch: pytest.MonkeyPatch, sample_models_dir: Path
) -> None:
    seen: list[Any] = []
    real = ortsession.open_session

    def spy(model: Any, options: Any, providers: Any = (CPU,), **kwargs: Any) -> Any:
        seen.append((options.intra_op_num_threads, list(providers)))
        return real(model, options, [CPU], **kwargs)

    monkeypatch.setattr(engine_onnxruntime, "open_session", spy)
    gpu = Placement(CUDA_PROVIDER, (("device_id", "0"),), 3)
    tp = compare.session_throughput(
        sample_models_dir / "transformer_tiny.onnx",
        [{"tokens": t["tokens"][:1]} for t in token_batches(2)],
        placement=gpu,
        warmup=0,
    )
    assert tp > 0
    assert seen == [(3, [(CUDA_PROVIDER, {"device_id": "0"}), CPU])]


def _memory_report(shared: bool, manifest: Manifest) -> tuple[str, dict[str, Any]]:
    n = 12
    ws = tuple(stats(i, [float(j) for j in range(n)], shared=shared, peak=500, startup=100) for i in (0, 1))
    kind = "threads" if shared else "processes"
    specs = (spec(0, stage=manifest.stages[0]), spec(1, stage=manifest.stages[1]))
    fake = FakePipeline(lanes=(specs,), backend=FakeBackend(kind), manifest=manifest)
    report = build_report(as_pipeline(fake), measurement(n, ws), warmup=0, input_shapes={})
    replicas = BaselineReport("replicas", "2 replicas", 2, 1, 1.0, 1.0, 300, 200, 150, mode="threads")
    report = replace(report, baselines={"replicas": replicas})
    return format_report(report), report.to_obj()


def test_the_replicas_ceiling_is_printed_and_reported(tiny_split: Path) -> None:
    n = 12
    ws = tuple(stats(i, [float(j) for j in range(n)], shared=True, peak=500, startup=100) for i in (0, 1))
    manifest = load_manifest(tiny_split)
    specs = (spec(0, stage=manifest.stages[0]), spec(1, stage=manifest.stages[1]))
    fake = FakePipeline(lanes=(specs,), backend=FakeBackend("threads"), manifest=manifest)
    report = build_report(as_pipeline(fake), measurement(n, ws), warmup=0, input_shapes={})
    replicas = BaselineReport("replicas", "2 replicas", 2, 1, 1.0, 0.9, balanced_ceiling=0.93)
    with_ceiling = replace(report, baselines={"replicas": replicas})
    assert with_ceiling.to_obj()["baselines"]["replicas"]["balanced_ceiling"] == 0.93
    line = next(x for x in format_report(with_ceiling).splitlines() if x.startswith("ceiling:"))
    assert "about 0.93x the replicas (this one: 0.90x)" in line
    without = replace(report, baselines={"replicas": replace(replicas, balanced_ceiling=None)})
    assert "ceiling:" not in format_report(without)
    assert without.to_obj()["baselines"]["replicas"]["balanced_ceiling"] is None


def test_thread_workers_show_weights_not_a_memory_ratio(tiny_split: Path) -> None:
    """Without a processes run of the stages, thread workers' memory cannot be compared: no ratio."""
    manifest = load_manifest(tiny_split)
    text, obj = _memory_report(True, manifest)
    assert all(s["model_rss_bytes"] is None for s in obj["stages"])
    assert all(s["worker_model_rss_bytes"] is None for s in obj["stages"])
    assert all(s["peak_rss_bytes"] == 500 for s in obj["stages"])  # the process's, still reported
    line = next(x for x in text.splitlines() if x.startswith("memory:"))
    weights = ", ".join(human_bytes(st.param_bytes) for st in manifest.stages)
    assert f"stage weights {weights}" in line and "peaked at 500 B" in line and "300 B" in line
    assert "x a replica" not in line
    assert "model mem" not in text.splitlines()[0]


def test_thread_workers_compare_their_own_process_memory_with_a_replicas(tiny_split: Path) -> None:
    """--compare measures each stage of a thread pipeline in a process of its own: then a ratio."""
    n = 12
    ws = tuple(stats(i, [float(j) for j in range(n)], shared=True, peak=500, startup=100) for i in (0, 1))
    fake = FakePipeline(lanes=((spec(0), spec(1)),), backend=FakeBackend("threads"))
    report = build_report(as_pipeline(fake), measurement(n, ws), warmup=0, input_shapes={})
    alone = [stats(i, [0.0], shared=False, peak=150 + 50 * i, startup=50) for i in (0, 1)]
    report = compare._with_worker_memory(report, alone)
    replicas = BaselineReport("replicas", "2 replicas", 2, 1, 1.0, 1.0, 300, 200, 150, mode="threads")
    report = replace(report, baselines={"replicas": replicas})
    obj = report.to_obj()
    assert [s["worker_model_rss_bytes"] for s in obj["stages"]] == [100, 150]
    assert [s["model_rss_bytes"] for s in obj["stages"]] == [None, None]  # the shared process's: unknown
    line = memory_line(report)
    assert line is not None and "each in a process of its own" in line and "0.75x a replica" in line


def test_process_workers_compare_a_stages_model_memory_with_a_replicas(tiny_split: Path) -> None:
    text, obj = _memory_report(False, load_manifest(tiny_split))
    assert [s["model_rss_bytes"] for s in obj["stages"]] == [400, 400]
    assert [s["worker_model_rss_bytes"] for s in obj["stages"]] == [400, 400]
    line = next(x for x in text.splitlines() if x.startswith("memory:"))
    assert "2.00x a replica" in line and "each in a process of its own" not in line
    assert "model mem" in text.splitlines()[0]


REQUIRED_KEYS = {"throughput_per_s", "steady_throughput_per_s", "latency_ms", "stages", "baselines"}


def test_cli_compare_in_threads_mode_is_like_for_like(
    tiny_split: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.json"
    code = run_command(
        parse(
            str(tiny_split),
            "-m",
            "8",
            "--warmup",
            "1",
            "--compare",
            "--threads",
            "2",
            "--report",
            str(report),
        )
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    obj = json.loads(report.read_text())
    assert set(obj) >= REQUIRED_KEYS and obj["mode"] == "threads"
    for stage in obj["stages"]:
        assert {"measured_ms", "estimated_ms", "peak_rss_bytes", "param_bytes"} <= set(stage)
        assert stage["model_rss_bytes"] is None and stage["param_bytes"] > 0
        assert stage["worker_model_rss_bytes"] > 0  # measured in a short processes run of the stages
    assert obj["latency_in_flight"] >= 1 and obj["latency_single_ms"]["p50"] > 0
    assert obj["steady_throughput_from"] == "worker" and obj["steady_throughput_per_s"] > 0
    replicas = obj["baselines"]["replicas"]
    assert replicas["mode"] == "threads" and replicas["provider"] == CPU
    assert replicas["total_threads"] == 4 and replicas["threads_per_worker"] == 2
    assert replicas["throughput_per_s"] > 0
    assert replicas["peak_rss_bytes"] > 0 and replicas["model_rss_bytes"] > 0  # one replica process
    assert obj["baselines"]["session_total_threads"]["total_threads"] == 4
    assert "each in a process of its own" in printed and "latency at saturation" in printed


def test_memory_runs_that_fail_cost_a_note_not_the_report(
    tiny_split: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_shm(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(compare, "stage_worker_memory", no_shm)
    monkeypatch.setattr(compare, "replica_memory", no_shm)
    code = run_command(parse(str(tiny_split), "-m", "8", "--warmup", "1", "--compare"))
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "the stages' memory could not be measured" in printed
    assert "a replica's memory could not be measured" in printed and "No space left" in printed


@pytest.mark.parametrize("mode", MODES)
def test_an_interleaved_run_sums_each_workers_stages(
    interleaved_split: Path, sample_models_dir: Path, mode: LocalMode
) -> None:
    manifest = load_manifest(interleaved_split)
    assert manifest.plan.workers == 2 and manifest.k == 4
    shapes = input_shapes_for(manifest, None, {})
    inputs = random_inputs(sample_models_dir / "mlp.onnx", shapes, 8)
    with Pipeline.from_manifest(interleaved_split, LocalConfig(mode=mode)) as pipe:
        report = build_report(pipe, measure(pipe, inputs, warmup=1), warmup=1, input_shapes=shapes)
    assert report.worker_stages == ((0, 2), (1, 3))
    stages = {s.index: s for s in report.stages}
    for w in report.workers:
        rows = [stages[i] for i in w.stages]
        assert w.stages == manifest.stages_of(w.index)
        assert w.estimated_ms is not None
        assert w.estimated_ms == pytest.approx(sum(r.estimated_ms or 0.0 for r in rows))
        assert w.measured_ms == pytest.approx(sum(r.measured_ms for r in rows)) and w.measured_ms > 0
        assert w.estimate_error == pytest.approx((w.estimated_ms - w.measured_ms) / w.measured_ms)
        assert w.busy_seconds == pytest.approx(sum(r.busy_seconds for r in rows))
        assert w.busy_fraction == pytest.approx(w.busy_seconds / report.wall_seconds)
        assert w.param_bytes == sum(manifest.stages[i].param_bytes for i in w.stages)
        if mode == "processes":  # one process hosts the worker's stages: its model memory, counted once
            assert {r.hosted_with for r in rows} == {w.stages}
            assert {r.stats.pid for r in rows} == {rows[0].stats.pid}
            assert w.model_rss_bytes == rows[0].worker_model_rss_bytes == rows[1].worker_model_rss_bytes
            assert w.model_rss_bytes is not None and w.model_rss_bytes > 0
        else:  # one shared process: no stage's own memory, so no worker's
            assert w.model_rss_bytes is None
        assert w.cpus == ()
    busiest = max(report.workers, key=lambda w: w.busy_seconds)
    assert report.bottleneck_worker == busiest.index
    assert report.bottleneck_stage == max(report.stages, key=lambda s: s.busy_seconds).index
    assert any("share 2 workers but were not pinned" in n for n in report.notes)

    obj = json.loads(report.to_json())
    keys = list(obj)
    assert keys.index("workers") == keys.index("stages") + 1
    assert keys.index("bottleneck_worker") == keys.index("bottleneck_stage") + 1
    assert obj["bottleneck_worker"] == busiest.index
    assert [w["stages"] for w in obj["workers"]] == [[0, 2], [1, 3]]
    for w, back in zip(report.workers, obj["workers"], strict=True):
        assert back["index"] == w.index and back["cpus"] == []
        for key in ("estimated_ms", "measured_ms", "estimate_error", "busy_seconds", "busy_fraction"):
            assert back[key] == pytest.approx(getattr(w, key))
        assert back["param_bytes"] == w.param_bytes and back["model_rss_bytes"] == w.model_rss_bytes

    lines = format_report(report).splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("worker 0"))
    assert at == 2 + len(report.stages)  # right after the stage table (header, rule, a row per stage)
    for w in report.workers:
        line = lines[at + w.index]
        mark = " *" if w.index == busiest.index else ""
        assert line.startswith(f"worker {w.index}{mark}: stages {w.stages[0]}, {w.stages[1]}: est ")
        assert f"busy {w.busy_fraction * 100:.0f}%, weights {human_bytes(w.param_bytes or 0)}" in line
        assert ("model memory" in line) == (mode == "processes")
    totals = lines[at + 2]
    assert f"on 2 workers (4 interleaved stages, {mode})" in totals
    assert totals.endswith(
        f"bottleneck worker {busiest.index} (*), busiest stage {report.bottleneck_stage} (*)"
    )


def _interleaved_report(
    manifest: Manifest, *, shared: bool, peaks: tuple[int, ...], busy: tuple[float, ...], cpus: bool = False
) -> RunReport:
    """A synthetic run of the 4 interleaved stages: stage i peaks at ``peaks[i]`` (100 before loading)
    and is busy ``busy[i]`` seconds per micro-batch; pinned to its worker's CPU with ``cpus``."""
    n = 12
    done = [float(j) for j in range(n)]
    ws = tuple(
        replace(stats(i, done, shared=shared, peak=peaks[i], startup=100), records=records(done, busy[i] / 2))
        for i in range(4)
    )
    specs = tuple(
        spec(i, Placement(CPU, (), 1, cpus=(manifest.worker_of(i),) if cpus else ()), manifest.stages[i])
        for i in range(4)
    )
    fake = FakePipeline(
        lanes=(specs,), backend=FakeBackend("threads" if shared else "processes"), manifest=manifest
    )
    m = measurement(n, ws, output_workers=(3,))
    return build_report(as_pipeline(fake), m, warmup=0, input_shapes={})


def test_the_bottleneck_worker_is_the_busiest_worker_not_the_busiest_stages(interleaved_split: Path) -> None:
    manifest = load_manifest(interleaved_split)
    # stage 1 is the busiest stage, but worker 0 (stages 0 and 2) is busier than worker 1 (1 and 3)
    report = _interleaved_report(
        manifest, shared=False, peaks=(200, 200, 200, 200), busy=(0.02, 0.03, 0.02, 0.001), cpus=True
    )
    assert report.bottleneck_stage == 1 and report.bottleneck_worker == 0
    assert [w.busy_seconds for w in report.workers] == pytest.approx([12 * 0.04, 12 * 0.031])
    assert [w.cpus for w in report.workers] == [(0,), (1,)]
    assert not any("not pinned" in n for n in report.notes)
    text = format_report(report)
    assert "\nworker 0 *: stages 0, 2: " in text and "\nworker 1: stages 1, 3: " in text
    assert "\n1 *  " in text  # the stage table still marks the busiest stage
    assert "bottleneck worker 0 (*), busiest stage 1 (*)" in text
    assert report.to_obj()["bottleneck_stage"] == 1 and report.to_obj()["bottleneck_worker"] == 0


def test_memory_of_shared_workers_is_their_stages_together(interleaved_split: Path, tiny_split: Path) -> None:
    """The largest worker's model memory (its stages' together) is compared with a replica's; an ordinary
    split keeps comparing its largest stage, and writes no workers."""
    manifest = load_manifest(interleaved_split)
    replicas = BaselineReport("replicas", "2 replicas", 2, 1, 1.0, 1.0, 300, 200, 150, mode="processes")
    busy = (0.01, 0.01, 0.01, 0.01)
    report = _interleaved_report(manifest, shared=False, peaks=(250, 200, 200, 300), busy=busy)
    assert [w.model_rss_bytes for w in report.workers] == [150 + 100, 100 + 200]
    line = memory_line(replace(report, baselines={"replicas": replicas}))
    assert line == (
        "memory: a worker's model (its stages' together) takes 250 B (stages 0, 2), 300 B (stages 1, 3), a "
        "replica's 200 B: the largest worker (stages 1, 3) 1.50x a replica (a replica worker peaks at 300 B)"
    )
    assert "model memory 300 B" in format_report(report)

    # threads: no worker's memory, only its weights, until --compare measures each stage in a process
    threads = replace(_interleaved_report(manifest, shared=True, peaks=(500,) * 4, busy=busy), baselines={})
    assert [w.model_rss_bytes for w in threads.workers] == [None, None]
    line = memory_line(replace(threads, baselines={"replicas": replicas}))
    assert line is not None and "x a replica" not in line
    weights = [human_bytes(sum(manifest.stages[i].param_bytes for i in g)) for g in ((0, 2), (1, 3))]
    assert f"worker weights {weights[0]} (stages 0, 2), {weights[1]} (stages 1, 3)" in line
    assert "peaked at 500 B" in line
    alone = [stats(i, [0.0], peak=150 + 10 * i, startup=50) for i in range(4)]
    measured = replace(compare._with_worker_memory(threads, alone), baselines={"replicas": replicas})
    assert [w.model_rss_bytes for w in measured.workers] == [100 + 120, 110 + 130]  # derived anew
    line = memory_line(measured)
    assert line is not None and "(each stage in a process of its own, a short run)" in line
    assert "the largest worker (stages 1, 3) 1.20x a replica" in line

    plain_text, plain = _memory_report(False, load_manifest(tiny_split))
    assert "workers" not in plain and "bottleneck_worker" not in plain
    assert "worker 0" not in plain_text and "interleaved" not in plain_text
    assert "the largest stage 2.00x a replica" in plain_text


def _report_with(estimated: tuple[float, float], measured: tuple[float, float]) -> RunReport:
    n = 20
    m = measurement(n, (stats(0, [float(j) for j in range(n)]), stats(1, [float(j) for j in range(n)])))
    fake = FakePipeline(lanes=((spec(0), spec(1)),), backend=FakeBackend("threads"))
    report = build_report(as_pipeline(fake), m, warmup=0, input_shapes={})
    stages = tuple(
        replace(s, worker=replace(s.worker, stage=entry(s.index, e)), measured_ms=v)
        for s, e, v in zip(report.stages, estimated, measured, strict=True)
    )
    return replace(report, stages=stages, estimates_comparable=True, estimate_max_error=None)


def test_the_estimates_are_scaled_by_the_machines_slowdown(tiny_split: Path) -> None:
    """A machine that now runs the model in 30 ms where it took 20 ms when the estimates were made: the
    stages, estimated at 10 ms and measured at 15 and 16, were off by 33% and 37.5%, but only by 0% and
    6.25% at the machine's speed."""
    manifest = load_manifest(tiny_split)
    timed = replace(manifest, plan=replace(manifest.plan, reference_seconds=0.020, threads=1))
    report = _report_with((10.0, 10.0), (15.0, 16.0))
    slowdown, worst = compare.machine_speed(report, timed, 1 / 0.030)
    assert slowdown == pytest.approx(1.5)
    assert worst == pytest.approx(1 / 16)
    shown = format_report(
        replace(
            report,
            machine_slowdown=slowdown,
            estimate_max_error_at_machine_speed=worst,
            estimate_max_error=0.375,
        )
    )
    assert (
        "machine: the whole model on one thread ran 1.50x slower than when the estimates were made" in shown
    )
    assert "counting that, the estimates were off by up to 6.2% (not counting it: 37.5%)" in shown
    obj = replace(report, machine_slowdown=slowdown).to_obj()
    assert obj["machine_slowdown"] == pytest.approx(1.5)


def test_no_slowdown_without_a_like_reference(tiny_split: Path) -> None:
    manifest = load_manifest(tiny_split)
    report = _report_with((10.0, 10.0), (15.0, 16.0))
    assert manifest.plan.reference_seconds is None  # static costs: nothing was timed
    assert compare.machine_speed(report, manifest, 33.0) == (None, None)
    plan = manifest.plan
    for why in (
        replace(manifest, plan=replace(plan, reference_seconds=0.02, threads=2)),  # no 2-thread baseline
        replace(manifest, plan=replace(plan, reference_seconds=0.0005, threads=1)),  # under 1 ms
    ):
        assert compare.machine_speed(report, why, 33.0) == (None, None)
    timed = replace(manifest, plan=replace(plan, reference_seconds=0.02, threads=1))
    assert compare.machine_speed(replace(report, estimates_comparable=False), timed, 33.0) == (None, None)
    assert compare.machine_speed(replace(report, backend="ray"), timed, 33.0) == (None, None)
    assert compare.machine_speed(report, timed, 33.0)[0] is not None  # the like case, for contrast
    assert compare.machine_speed(report, None, 33.0) == (None, None)


@pytest.mark.slow
def test_a_measured_split_reports_the_machines_slowdown(
    bert_tiny_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A measured profile of a model of milliseconds: its median run is the reference, and --compare
    prints how fast the machine ran the model since."""
    out = tmp_path / "split"
    shapes = {"input_ids": (2, 64), "attention_mask": (2, 64)}
    api.split(
        bert_tiny_path,
        SplitOptions(
            out=out,
            plan=PlanRequest(2),
            profile=ProfileOptions(shapes=shapes, runs=5, warmup=2),
            verify=False,
        ),
    )
    reference = load_manifest(out).plan.reference_seconds
    assert reference is not None and reference > 1e-3
    report = tmp_path / "report.json"
    code = run_command(parse(str(out), "-m", "12", "--warmup", "2", "--compare", "--report", str(report)))
    printed = capsys.readouterr().out
    assert code == 0, printed
    obj = json.loads(report.read_text())
    tp1 = obj["baselines"]["session_1_thread"]["throughput_per_s"]
    assert obj["machine_slowdown"] == pytest.approx(1 / tp1 / reference)
    assert obj["estimate_max_error_at_machine_speed"] >= 0
    assert "machine: the whole model on one thread ran " in printed
