"""What the CLI says before and after its work: shapes guessed, threads against CPUs, a busy machine."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import run

from onnxpipe.api.preamble import before_work, input_lines, threads_warning
from onnxpipe.cli.parsers import worded
from onnxpipe.core.events import Silent
from onnxpipe.core.machine import BUSY_WARNING_CPUS, CpuSample, available_cpu_count, busy_elsewhere, sample
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.ir.load import load_model
from onnxpipe.planning.request import PlanRequest


def test_guessed_dims_are_named_with_the_option_that_sets_them(resnet: Path) -> None:
    view = load_model(resnet)
    (name,) = view.inputs
    lines = input_lines(view, {})
    assert "guessed" in lines[0] and f"`shapes={name}=1,3,32,32`" in lines[-1]
    assert f"--shape {name}=1,3,32,32" in worded(lines[-1], "split")
    given = input_lines(view, {name: (1, 3, 32, 32)})
    assert len(given) == 1 and given[0].endswith("-> run at 1x3x32x32 (given by `shapes`)")


def test_threads_beyond_the_cpus_are_flagged() -> None:
    assert threads_warning(2, 1, cpus=2) is None
    too_many_stages = threads_warning(4, 1, cpus=2)
    assert too_many_stages is not None and "4 threads on 2 CPU(s)" in too_many_stages
    assert "`stages=2` or fewer" in too_many_stages and "--stages 2 or fewer" in worded(
        too_many_stages, "plan"
    )
    assert threads_warning(4, 1, cpus=2, workers=2) is None  # interleaved: 2 workers run at once
    too_many_workers = threads_warning(4, 1, cpus=2, workers=3)
    assert too_many_workers is not None and "3 workers x 1 thread(s)" in too_many_workers
    assert "`workers=2` or fewer" in too_many_workers
    too_many_threads = threads_warning(None, 8, cpus=2)
    assert too_many_threads is not None and "--threads 2 or fewer" in worded(too_many_threads, "run")


def test_threads_warning_in_the_output(resnet: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["plan", resnet, "-k", "2", "--cost", "static", "--threads", "512"], capfd)
    assert code == 0, err
    assert "warning: 512 thread(s) per stage on" in out
    assert out.splitlines()[-1].startswith("planned in ")


class _Warnings(Silent):
    def __init__(self) -> None:
        self.said: list[str] = []

    def warn(self, text: str) -> None:
        self.said.append(text)


def test_stages_calibrated_on_a_cluster_are_not_counted_against_this_machine_s_cpus(resnet: Path) -> None:
    """More stages than this machine has CPUs: a warning when they run here, none when they run on the
    cluster's nodes (``on_cluster``), whose CPUs this machine's say nothing of."""
    view = load_model(resnet)
    request = PlanRequest(available_cpu_count() + 1)
    here, there = _Warnings(), _Warnings()
    before_work(here, view, ProfileOptions(), request)
    before_work(there, view, ProfileOptions(), request, on_cluster=True)
    assert len(here.said) == 1 and "CPU(s)" in here.said[0]
    assert there.said == []


def _sample(busy: float, own: float, wall: float) -> CpuSample:
    return CpuSample(machine_busy_seconds=busy, own_seconds=own, wall_seconds=wall, load_1min=1.0)


def test_busy_elsewhere_subtracts_this_process() -> None:
    # 10 s of wall time; the machine was busy 25 CPU-seconds, 20 of them this process's own
    assert busy_elsewhere(_sample(100, 50, 0), _sample(125, 70, 10)) == pytest.approx(0.5)
    assert busy_elsewhere(_sample(100, 50, 0), _sample(120, 70, 10)) == 0.0
    assert busy_elsewhere(None, _sample(1, 1, 1)) is None
    assert busy_elsewhere(_sample(0, 0, 0), _sample(9, 0, 0.01)) is None  # too short to tell
    assert BUSY_WARNING_CPUS > 0


def test_sample_reads_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 1000 20 0 0 0 0 0\ncpu0 1 2 3\n")
    got = sample(stat)
    assert got is not None and got.machine_busy_seconds > 0
    stat.write_text("garbage\n")
    assert sample(stat) is None


def test_the_plan_shows_what_a_stage_needs_against_the_device(
    resnet: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    devices = work / "one.json"
    devices.write_text(
        '{"devices": [{"name": "small", "provider": "CPUExecutionProvider", "threads": 1, '
        '"memory_bytes": "1 GiB"}], "links": []}'
    )
    code, out, err = run(["plan", resnet, "-k", "1", "--cost", "static", "--devices", devices], capfd)
    assert code == 0, err
    assert "memory need" in out and " of 1.0 GiB" in out


def test_a_measuring_step_on_a_busy_machine_is_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a step that measured, other processes' CPU time past the threshold is one warning with the
    load averages; a step that measured nothing (a saved or static profile) is not warned about."""
    import onnxpipe.api.preamble as preamble

    busy = BUSY_WARNING_CPUS + 1.0  # CPUs other processes kept busy over the 10 s
    samples = [_sample(100, 50, 0), _sample(100 + 10 * busy, 50, 10)]

    class Heard(Silent):
        def __init__(self) -> None:
            self.warnings: list[str] = []

        def warn(self, text: str) -> None:
            self.warnings.append(text)

    for measuring in (True, False):
        monkeypatch.setattr(preamble, "sample", iter(samples).__next__)
        heard = Heard()
        with preamble.busy_watch(heard, "profiling", measuring=measuring):
            pass
        if measuring:
            (warning,) = heard.warnings
            assert warning.startswith(f"other processes kept {busy:.1f} CPU(s) busy during profiling")
            assert "(load average 1.00 before, 1.00 after)" in warning
        else:
            assert heard.warnings == []
