"""Calibration: stages timed (alone or as a pipeline) correct the profile, and the cut follows."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from cli_runner import run
from paths import SAMPLE_MODELS

from onnxpipe import api
from onnxpipe.api import CalibrationOptions, PlanRequest, ProfileOptions, SplitOptions
from onnxpipe.calibrate import timing
from onnxpipe.calibrate.loop import (
    CalibrationRound,
    calibrate_phases,
    measured_balance,
    stage_estimates,
)
from onnxpipe.calibrate.timing import (
    StageTimer,
    choose_timer,
    time_stages,
    time_stages_in_pipeline,
    timed_runs,
)
from onnxpipe.cluster.model import Cluster, Device, Link
from onnxpipe.core.choices import Phase
from onnxpipe.core.errors import UsageError
from onnxpipe.core.runtime_kinds import EngineConfig
from onnxpipe.core.runtimes import time_in_turns
from onnxpipe.cost.phases import phase_profiles
from onnxpipe.cost.profile import Profile, corrected
from onnxpipe.cost.static import static_profile
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.decoder_kinds import phase_shape
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.planning.planner import plan
from onnxpipe.planning.types import Plan
from onnxpipe.planning.workers import make_plan
from onnxpipe.runtime import affinity
from onnxpipe.runtime.pipeline import Pipeline


@pytest.fixture(scope="module")
def view(sample_models_dir: Path) -> ModelView:
    return load_model(sample_models_dir / "transformer_tiny.onnx")


def true_costs(view: ModelView, profile: Profile) -> dict[str, float]:
    """What the stages "really" cost in these tests: the first half of the nodes twice the estimate."""
    names = [n.name for n in view.compute_nodes]
    half = set(names[: len(names) // 2])
    return {n: t * (2.0 if n in half else 1.0) for n, t in profile.node_seconds.items()}


def fake_timer(truth: dict[str, float]) -> StageTimer:
    def timer(view: ModelView, plan: Plan, profile: Profile) -> list[float]:
        return [sum(truth[n] for n in st.node_names if n in truth) for st in plan.stages]

    return timer


def bottleneck(plan: Plan, truth: dict[str, float]) -> float:
    return max(sum(truth[n] for n in st.node_names if n in truth) for st in plan.stages)


def test_corrected_scales_each_stages_nodes_by_its_factor(view: ModelView) -> None:
    prof = static_profile(view)
    plan = make_plan(view, prof, 2)
    fixed = corrected(prof, [s.node_names for s in plan.stages], [2.0, 0.5])
    for st, f in zip(plan.stages, (2.0, 0.5), strict=True):
        for n in st.node_names:
            if n in prof.node_seconds:
                assert fixed.node_seconds[n] == pytest.approx(prof.node_seconds[n] * f)
    assert fixed.total_seconds == pytest.approx(sum(fixed.node_seconds.values()))
    assert fixed.model_sha256 == prof.model_sha256  # still the same model's profile


def test_the_cut_follows_what_the_stages_really_cost(view: ModelView) -> None:
    prof = static_profile(view)
    truth = true_costs(view, prof)
    before = make_plan(view, prof, 2)
    done = calibrate_phases(
        view, {None: prof}, lambda p: make_plan(view, p[None], 2), rounds=4, timer=fake_timer(truth)
    )
    fixed, after, rounds = done.profiles[None], done.plan, [r[None] for r in done.rounds]
    assert rounds[0].factors[0] == pytest.approx(2.0, rel=0.2) and rounds[0].worst_error > 0.1
    assert len(after.stages[0].node_names) < len(before.stages[0].node_names)  # the dear half got shorter
    assert bottleneck(after, truth) < bottleneck(before, truth)
    assert fixed is not prof


def test_a_profile_that_already_holds_stops_after_one_round(view: ModelView) -> None:
    prof = static_profile(view)
    done = calibrate_phases(
        view, {None: prof}, lambda p: make_plan(view, p[None], 2), timer=fake_timer(dict(prof.node_seconds))
    )
    fixed, rounds = done.profiles[None], [r[None] for r in done.rounds]
    assert len(rounds) == 1 and rounds[0].worst_error < 1e-12 and fixed is prof


def test_round_arithmetic() -> None:
    r = CalibrationRound(bounds=(3, 4), estimated_seconds=(1.0, 2.0), measured_seconds=(2.0, 2.0))
    assert r.factors == (2.0, 1.0) and r.worst_error == pytest.approx(0.5)


def test_time_stages_times_every_stage(view: ModelView) -> None:
    prof = static_profile(view)
    plan = make_plan(view, prof, 3)
    seconds = time_stages(view, plan, prof, runs=3, warmup=1)
    assert len(seconds) == 3 and all(s > 0 for s in seconds)


class _CountingSession:
    """A stand-in session that records which stage ran when, and takes ``seconds`` of a fake clock."""

    def __init__(self, stage: int, log: list[int], clock: list[float], seconds: float) -> None:
        self.stage, self.log, self.clock, self.seconds = stage, log, clock, seconds

    def run(self, names: object, feeds: object) -> list[object]:
        self.log.append(self.stage)
        self.clock[0] += self.seconds
        return []


def test_stages_timed_alone_take_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of timed runs after an untimed one, the order reversed each turn, each stage's runs exact;
    and a drift of the machine's speed then reaches every stage alike."""
    log: list[int] = []
    clock = [0.0]
    speed = {"factor": 1.0}
    monkeypatch.setattr("onnxpipe.calibrate.timing.time.perf_counter", lambda: clock[0])

    class Drifting(_CountingSession):
        def run(self, names: object, feeds: object) -> list[object]:
            self.log.append(self.stage)
            self.clock[0] += self.seconds * speed["factor"]
            speed["factor"] *= 1.01  # the machine slows as the timing goes on
            return []

    stages = [(_CountingSession(s, log, clock, 0.01 * (s + 1)), [], {}) for s in range(3)]
    seconds = time_in_turns(stages, runs=4, block=2)
    assert seconds == pytest.approx([0.01, 0.02, 0.03])
    # turn 1: 0 1 2 forward, turn 2: 2 1 0 backward; each block one untimed run and two timed
    assert log == [0] * 3 + [1] * 3 + [2] * 3 + [2] * 3 + [1] * 3 + [0] * 3
    same = [(Drifting(s, [], clock, 0.01), [], {}) for s in range(2)]
    turns = time_in_turns(same, runs=30, block=5)
    speed["factor"] = 1.0
    blocked = time_in_turns(same, runs=30, block=30)
    assert abs(turns[1] / turns[0] - 1) < 0.1  # two equal stages look equal in turns
    assert blocked[1] / blocked[0] > 1.3  # one after the other, the later looks dearer


def test_large_stages_are_timed_one_session_at_a_time(
    view: ModelView, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the weight limit the stages are timed one after the other, never two sessions open at once."""
    import onnxpipe.calibrate.timing as cal

    open_now: list[int] = []
    most = [0]
    real_open = cal.open_engine

    class Tracked:
        def __init__(self, engine: Any) -> None:
            self.engine = engine
            open_now.append(1)
            most[0] = max(most[0], len(open_now))

        def __getattr__(self, name: str) -> Any:
            return getattr(self.engine, name)

        def __del__(self) -> None:
            open_now.pop()

    monkeypatch.setattr(cal, "open_engine", lambda *a, **k: Tracked(real_open(*a, **k)))
    monkeypatch.setattr(cal, "TURNS_MAX_PARAM_BYTES", 0)
    prof = static_profile(view)
    seconds = time_stages(view, make_plan(view, prof, 3), prof, runs=3, warmup=1)
    assert len(seconds) == 3 and all(s > 0 for s in seconds)
    assert most[0] == 1
    monkeypatch.setattr(cal, "TURNS_MAX_PARAM_BYTES", 1 << 40)
    most[0] = 0
    time_stages(view, make_plan(view, prof, 3), prof, runs=3, warmup=1)
    assert most[0] == 3  # in turns: every stage's session open at once


def test_turns_need_a_block_of_at_least_one_run() -> None:
    with pytest.raises(ValueError, match="block of at least 1"):
        time_in_turns([], runs=3, block=0)


def test_time_stages_in_pipeline_times_every_worker(view: ModelView) -> None:
    prof = static_profile(view)
    plan = make_plan(view, prof, 2)
    seconds = time_stages_in_pipeline(view, plan, prof, microbatches=4, repeats=2, warmup=2)
    assert len(seconds) == 2 and all(s > 0 for s in seconds)


def test_time_stages_in_pipeline_rotates_the_cpus_among_the_stages(
    view: ModelView, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each stage is timed on each CPU, so that a slower CPU does not make its stage look dear."""
    sets = affinity.cpu_sets([1, 1])
    if sets is None:
        pytest.skip("rotating needs 2 CPUs")
    seen: list[tuple[tuple[int, ...], ...]] = []
    real = Pipeline.from_manifest

    def spy(directory: Path, *args: Any, **kwargs: Any) -> Pipeline:
        seen.append(tuple(p.cpus for p in kwargs["placements"]))
        return real(directory, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "from_manifest", spy)
    prof = static_profile(view)
    seconds = time_stages_in_pipeline(
        view, make_plan(view, prof, 2), prof, microbatches=3, repeats=1, warmup=1
    )
    a, b = sets
    assert seen == [(a, b), (b, a)]
    assert len(seconds) == 2 and all(s > 0 for s in seconds)


def test_auto_times_in_a_pipeline_only_with_a_cpu_for_every_stage_thread() -> None:
    assert "pipeline" in choose_timer("auto", 2, 1, cpus=2, cores=2)[1]
    assert "alone" in choose_timer("auto", 2, 2, cpus=3, cores=3)[1]  # stages would share CPUs: alone
    assert "alone" in choose_timer("auto", 2, 1, cpus=2, cores=1)[1]  # or hyperthread siblings of a core
    assert "pipeline" in choose_timer("pipeline", 2, 1, cpus=2, cores=1)[1]  # asked for: siblings it is
    assert "alone" in choose_timer("alone", 2, 1, cpus=64, cores=64)[1]
    assert "pipeline" in choose_timer("pipeline", 4, 2, cpus=8, cores=8)[1]
    with pytest.raises(
        UsageError, match=r"6 CPUs, and this process may use 4; use `CalibrationOptions\.mode=alone`"
    ):
        choose_timer("pipeline", 3, 2, cpus=4, cores=4)
    with pytest.raises(UsageError, match="choose one of alone, pipeline, auto"):
        choose_timer("later", 2, 1, cpus=2, cores=2)  # type: ignore[arg-type]


def test_calibrating_in_a_pipeline_on_too_few_cpus_is_refused(
    sample_models_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(timing, "available_cpus", lambda: (0,))  # what calibration asks
    with pytest.raises(UsageError, match=r"`CalibrationOptions\.mode=pipeline`"):
        api.split(
            sample_models_dir / "transformer_tiny.onnx",
            SplitOptions(
                out=tmp_path / "out",
                plan=PlanRequest(2),
                profile=ProfileOptions(cost="static"),
                calibration=CalibrationOptions(rounds=1, mode="pipeline"),
            ),
        )
    assert not (tmp_path / "out").exists()


def test_calibrate_with_a_device_missing_here_times_it_as_the_reference(
    sample_models_dir: Path, tmp_path: Path
) -> None:
    """--calibrate with --devices times a device that is not here (its provider missing, so its costs are
    scaled from the reference) as the reference profile was measured, its speed kept; timing in a
    pipeline is refused with devices (calibration on the devices' runtimes:
    tests/integration/test_runtimes.py, on plain numbers: tests/unit/test_calibrate_devices.py)."""
    gpu = Device(
        name="gpu", speed=4.0, profile_here=True, engine=EngineConfig(provider="MIGraphXExecutionProvider")
    )
    cluster = Cluster(devices=(Device(name="a"), gpu), links=(Link(),))
    done = api.split(
        sample_models_dir / "transformer_tiny.onnx",
        SplitOptions(
            out=tmp_path / "out",
            plan=PlanRequest(2, devices=cluster),
            profile=ProfileOptions(cost="static"),
            calibration=CalibrationOptions(rounds=1),
            verify=False,
        ),
    )
    records = {r.device: r for r in done.plan.device_costs}
    assert records["gpu"].method == "scaled" and "MIGraphXExecutionProvider is not available here" in (
        records["gpu"].source
    )
    assert "the speed kept" in records["gpu"].source
    assert done.manifest.cluster is not None and done.manifest.cluster.speeds == (1.0, 4.0)
    with pytest.raises(UsageError, match=r"leave out `CalibrationOptions\.mode=pipeline`"):
        api.split(
            sample_models_dir / "transformer_tiny.onnx",
            SplitOptions(
                out=tmp_path / "out2",
                plan=PlanRequest(
                    2, devices=Cluster(devices=(Device(name="a"), Device(name="b")), links=(Link(),))
                ),
                calibration=CalibrationOptions(rounds=1, mode="pipeline"),
            ),
        )
    assert not (tmp_path / "out2").exists()


def test_cli_split_calibrate_records_it_and_verifies(
    sample_models_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "stages"
    model = sample_models_dir / "transformer_tiny.onnx"
    argv = ["split", model, "--stages", "2", "--out", out, "--calibrate", "-q"]  # timed alone by default
    code, stdout, stderr = run(argv, capfd)
    assert code == 0, stderr
    assert "calibrated in" in stdout and "match the original" in stdout
    plan = json.loads((out / "manifest.json").read_text())["plan"]
    assert any(n.startswith("calibrated in") and "each stage timed alone" in n for n in plan["notes"])
    assert plan["reference_seconds"] > 0  # the whole model, timed right after the stages were


def test_the_reference_time_is_the_measured_profiles_or_none(sample_models_dir: Path, tmp_path: Path) -> None:
    """A measured profile's median run is the machine's speed the estimates were made at; static costs
    were made at none."""
    from onnxpipe.cost.measure import profile_model

    model = sample_models_dir / "resnet_tiny.onnx"
    prof = profile_model(load_model(model), runs=5, warmup=1)
    measured = api.split(
        model,
        SplitOptions(
            out=tmp_path / "measured", plan=PlanRequest(2), profile=ProfileOptions(saved=prof), verify=False
        ),
    )
    assert measured.manifest.plan.reference_seconds == prof.total_seconds > 0
    static = api.split(
        model,
        SplitOptions(
            out=tmp_path / "static",
            plan=PlanRequest(2),
            profile=ProfileOptions(saved=static_profile(load_model(model))),
            verify=False,
        ),
    )
    assert static.manifest.plan.reference_seconds is None


def test_cli_calibrate_in_a_pipeline(
    sample_models_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    if len(affinity.available_cpus()) < 2:
        pytest.skip("a pinned 2-stage pipeline needs 2 CPUs")
    out = tmp_path / "stages"
    model = sample_models_dir / "transformer_tiny.onnx"
    argv = ["split", model, "-k", "2", "--out", out, "--calibrate", "1", "-q", "--calibrate-in", "pipeline"]
    code, stdout, stderr = run(argv, capfd)
    assert code == 0, stderr
    assert "timed running together as a pinned thread pipeline" in stdout and "match the original" in stdout


def test_cli_calibrate_needs_a_positive_number_of_rounds(
    sample_models_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    model = sample_models_dir / "transformer_tiny.onnx"
    code, _, stderr = run(["split", model, "-k", "2", "--out", tmp_path / "o", "--calibrate", "0"], capfd)
    assert code == 2 and "--calibrate" in stderr and not (tmp_path / "o").exists()


def _decoder_phases() -> tuple[ModelView, dict[Phase, Profile]]:
    view = load_model(SAMPLE_MODELS / "decoders" / "gpt2.onnx")
    shapes = [phase_shape(Phase.PREFILL), phase_shape(Phase.DECODE)]
    return view, phase_profiles(view, ProfileOptions(cost="static"), shapes)


def _phase_timer(profiles: dict[Phase, Profile], truth: dict[Phase, dict[str, float]]) -> StageTimer:
    """A stand-in timer: each stage costs the sum of ``truth`` at the phase whose shapes it is timed at."""

    def timer(view: ModelView, plan: Plan, profile: Profile) -> list[float]:
        phase = next(p for p, q in profiles.items() if q.input_shapes == profile.input_shapes)
        return [sum(truth[phase].get(n, 0.0) for n in st.node_names) for st in plan.stages]

    return timer


def test_a_decoder_is_calibrated_at_both_phases() -> None:
    """The first layer costs four times its estimate at both shapes: a two-phase plan's cut moves off it,
    each phase's profile corrected by its own stage times."""
    view, profiles = _decoder_phases()
    dec = find_decoder(view)
    assert dec is not None
    layer0 = {name for name, layer in dec.node_layer.items() if layer == 0}
    truth = {
        p: {n: t * (4.0 if n in layer0 else 1.0) for n, t in q.node_seconds.items()}
        for p, q in profiles.items()
    }
    request = PlanRequest(2)

    def make(ps: Mapping[Phase | None, Profile]) -> Plan:
        return plan(
            view, ps[Phase.DECODE], request, phase_profiles={p: q for p, q in ps.items() if p is not None}
        )

    first = make(dict(profiles))
    done = calibrate_phases(view, dict(profiles), make, rounds=4, timer=_phase_timer(profiles, truth))
    fixed, after, rounds = done.profiles, done.plan, done.rounds
    assert done.went_back is None and "from the corrected costs" in done.note("timed")
    assert set(rounds[0]) == {Phase.PREFILL, Phase.DECODE}
    assert all(r.factors[0] > 1.5 and r.worst_error > 0.3 for r in rounds[0].values())  # stage 0 was dear
    assert after.stages[0].kv_layers == (0,) and first.stages[0].kv_layers != (0,)
    for phase in (Phase.PREFILL, Phase.DECODE):
        true_stage = [sum(truth[phase].get(n, 0.0) for n in st.node_names) for st in after.stages]
        before = [sum(truth[phase].get(n, 0.0) for n in st.node_names) for st in first.stages]
        assert max(true_stage) < max(before)
        assert fixed[phase] is not profiles[phase]
    # the estimates the plan keeps per phase are the corrected ones
    assert stage_estimates(after, Phase.PREFILL) != stage_estimates(first, Phase.PREFILL)


def test_a_decoder_whose_profiles_hold_is_calibrated_in_one_round() -> None:
    view, profiles = _decoder_phases()
    request = PlanRequest(2)
    truth = {p: dict(q.node_seconds) for p, q in profiles.items()}
    done = calibrate_phases(
        view,
        dict(profiles),
        lambda ps: plan(view, ps[Phase.DECODE], request, phase_profiles={p: q for p, q in ps.items() if p}),
        timer=_phase_timer(profiles, truth),
    )
    assert len(done.rounds) == 1 and all(r.worst_error < 1e-9 for r in done.rounds[0].values())
    assert done.profiles[Phase.DECODE] is profiles[Phase.DECODE]


def test_short_stages_are_timed_over_more_runs() -> None:
    assert timed_runs(1.0) == timing.MIN_RUNS and timed_runs(0.0) == timing.MIN_RUNS
    assert timed_runs(1e-3) == 250 and timed_runs(1e-7) == timing.MAX_RUNS


def test_cli_split_calibrates_a_decoder_at_both_phases(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "stages"
    model = SAMPLE_MODELS / "decoders" / "gpt2.onnx"
    code, stdout, stderr = run(["split", model, "-k", "2", "--out", out, "--calibrate", "1", "-q"], capfd)
    assert code == 0, stderr
    assert "match the original" in stdout
    manifest = json.loads((out / "manifest.json").read_text())
    note = next(n for n in manifest["plan"]["notes"] if n.startswith("calibrated in"))
    assert "at prefill" in note and "at decode" in note
    assert all(set(st["estimated_phase_seconds"]) == {"prefill", "decode"} for st in manifest["stages"])


def test_calibration_goes_back_to_a_timed_cut_that_ran_more_evenly(view: ModelView) -> None:
    """Stage times that are not the sum of their nodes' (here: any cut but the first runs its second
    stage 60% slower): the correction moves the cut to one that runs worse, and calibration goes back to
    the first cut, as it was planned, rather than keep a worse one or one never timed."""
    prof = static_profile(view)
    first = make_plan(view, prof, 2)
    first_cut = [len(s.node_names) for s in first.stages]

    def timer(view: ModelView, plan: Plan, profile: Profile) -> list[float]:
        est = [s.compute_seconds for s in plan.stages]
        if [len(s.node_names) for s in plan.stages] == first_cut:
            return [est[0] * 1.2, est[1]]
        return [est[0], est[1] * 1.6]

    done = calibrate_phases(
        view, {None: prof}, lambda ps: make_plan(view, ps[None], 2), rounds=2, timer=timer
    )
    assert len(done.rounds) == 2 and done.rounds[0][None].bounds != done.rounds[1][None].bounds
    assert done.went_back == 0 and done.balances[0] < done.balances[1]
    assert [len(s.node_names) for s in done.plan.stages] == first_cut
    assert done.profiles[None] is prof  # the profile the kept cut was planned with
    note = done.note("each stage timed alone")
    assert "kept the cut timed in round 1" in note and "planned with" in note


def test_one_round_moves_the_cut_as_the_stages_ran(view: ModelView) -> None:
    """A single round times the first cut and plans again from the corrected costs: that correction
    stands (no other cut was timed to prefer)."""
    prof = static_profile(view)
    truth = true_costs(view, prof)
    before = make_plan(view, prof, 2)
    done = calibrate_phases(
        view, {None: prof}, lambda ps: make_plan(view, ps[None], 2), rounds=1, timer=fake_timer(truth)
    )
    assert len(done.rounds) == 1 and done.went_back is None
    assert len(done.plan.stages[0].node_names) < len(before.stages[0].node_names)
    assert done.profiles[None] is not prof and "from the corrected costs" in done.note("timed")


def test_balance_is_the_busiest_worker_over_the_mean() -> None:
    r = CalibrationRound(
        bounds=(1, 2, 3, 4), estimated_seconds=(1.0,) * 4, measured_seconds=(3.0, 1.0, 1.0, 3.0)
    )
    assert measured_balance({None: r}) == pytest.approx(1.5)  # stages: 3 over a mean of 2
    assert measured_balance({None: r}, workers=(0, 1, 0, 1)) == pytest.approx(1.0)  # each worker 4
    nothing = CalibrationRound(bounds=(1, 2), estimated_seconds=(1.0, 1.0), measured_seconds=(0.0, 0.0))
    assert measured_balance({None: nothing}) == math.inf


def test_stages_on_devices_are_timed_on_the_profiles_sample(view: ModelView) -> None:
    """Calibration on devices opens each stage on its device's engine and feeds the first stage the user's
    sample the profile was made with (``--inputs``), as timing on this machine does; random inputs only
    without one."""
    import dataclasses

    import numpy as np

    from onnxpipe.calibrate.timing import ready_engines, scratch_stages
    from onnxpipe.ir.feeds import random_feeds
    from onnxpipe.ir.samples import Samples

    prof = static_profile(view)
    random = dict(random_feeds(view, prof.input_shapes))
    sample = {
        n: np.full_like(a, 3) if a.dtype.kind in "iu" else np.full_like(a, 0.5) for n, a in random.items()
    }
    sampled = dataclasses.replace(prof, samples=Samples(feeds=(sample,), records=()))
    the_plan = make_plan(view, prof, 2)
    for profile, expected in ((sampled, sample), (prof, random)):
        with scratch_stages(view, the_plan, profile) as (out, manifest):
            configs = {st.device: EngineConfig(threads=1) for st in manifest.stages}
            ready = list(ready_engines(view, profile, out, manifest, configs, warmup=1))
            try:
                first_feeds = ready[0][2]
                assert first_feeds
                assert first_feeds.keys() <= expected.keys()
                assert all(np.array_equal(first_feeds[n], expected[n]) for n in first_feeds)
            finally:
                for engine, _, _ in ready:
                    engine.close()


def test_a_stage_that_fails_when_timed_says_what_can_be_done(
    view: ModelView, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One line, a usage error: on a device, give it another runtime; on this machine's onnxruntime,
    where there is no device to change, leave calibration out."""
    import onnxpipe.calibrate.timing as cal

    class Failing:
        def run(self, names: Any, feeds: Any) -> Any:
            raise RuntimeError("boom")

        def close(self) -> None:
            pass

    monkeypatch.setattr(cal, "open_engine", lambda *a, **k: Failing())
    prof = static_profile(view)
    with cal.scratch_stages(view, make_plan(view, prof, 2)) as (out, manifest):
        with pytest.raises(
            UsageError, match=r"stage 0 fails in .*\(boom\); leave out `CalibrationOptions\.rounds`"
        ):
            next(cal.ready_engines(view, prof, out, manifest, warmup=1))
        configs = {st.device: EngineConfig(threads=1) for st in manifest.stages}
        with pytest.raises(UsageError, match=r"\(boom\); give its device another runtime"):
            next(cal.ready_engines(view, prof, out, manifest, configs, warmup=1))
