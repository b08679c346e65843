"""Pinning local workers to CPUs of their own: the assignment, the masks the workers really get, and the
same outputs as without pinning."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run
from runtime_support import assert_same, original_outputs, parse, token_batches

from onnxpipe.cli import run as run_command
from onnxpipe.core.errors import RuntimeStageError
from onnxpipe.runtime.affinity import (
    available_cpus,
    cpu_sets,
)
from onnxpipe.runtime.base import LocalConfig, RayConfig
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.spec import Placement

needs_two_cpus = pytest.mark.skipif(
    len(available_cpus()) < 2, reason="pinning two workers apart needs two CPUs this process may use"
)


@needs_two_cpus
@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_pinned_workers_run_on_their_cpus_and_compute_the_same(
    tiny_split: Path, sample_models_dir: Path, mode: str
) -> None:
    batches = token_batches(12)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    sets = cpu_sets([1, 1])
    assert sets is not None
    cpus = [s[0] for s in sets]
    main_mask = os.sched_getaffinity(0)
    with Pipeline.from_manifest(tiny_split, LocalConfig(mode=mode, pin=True)) as pipe:  # type: ignore[arg-type]
        assert pipe.pin_note is None
        assert [s.placement.cpus for s in pipe.lanes[0]] == [(cpus[0],), (cpus[1],)]
        assert_same(expected, pipe.run_many(batches))
        if mode == "processes":
            masks = [os.sched_getaffinity(pid) for pid in pipe.worker_pids()]
        else:
            workers = [t for t in threading.enumerate() if t.name.startswith("onnxpipe stage")]
            masks = [os.sched_getaffinity(t.native_id or 0) for t in sorted(workers, key=lambda t: t.name)]
        assert masks == [{cpus[0]}, {cpus[1]}]
    assert os.sched_getaffinity(0) == main_mask  # creating pinned sessions left the caller as it was


def test_pinning_a_ray_pipeline_is_refused(tiny_split: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A Ray config has nothing to pin with; the CLI refuses ``--pin`` with ``--backend ray`` before any
    actor starts."""
    assert "pin" not in {f.name for f in dataclasses.fields(RayConfig)}
    code, out, err = run(["run", tiny_split, "--backend", "ray", "--pin"], capfd)
    assert code == 2 and out == "" and "--pin is for local workers; Ray places its actors itself" in err


def test_too_many_threads_run_unpinned_with_a_note(tiny_split: Path) -> None:
    threads = len(available_cpus())  # two stages of this many threads cannot each have their own
    with Pipeline.from_manifest(tiny_split, LocalConfig(mode="threads", pin=True), threads=threads) as pipe:
        assert pipe.pin_note is not None and "not pinned" in pipe.pin_note
        assert all(s.placement.cpus == () for s in pipe.lanes[0])
        out = pipe.run(token_batches(1)[0])
        assert all(isinstance(v, np.ndarray) for v in out.values())


@needs_two_cpus
def test_cli_run_pin_reports_each_stages_cpus_and_pins_the_baselines(
    tiny_split: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.json"
    code = run_command(parse(str(tiny_split), "-m", "8", "--pin", "--compare", "--report", str(report)))
    printed = capsys.readouterr().out
    assert code == 0, printed
    obj = json.loads(report.read_text())
    cpus = [s[0] for s in cpu_sets([1, 1]) or []]
    assert [s["cpus"] for s in obj["stages"]] == [[cpus[0]], [cpus[1]]]
    assert all("pinned" in b["description"] for b in obj["baselines"].values())
    assert f"1 @{cpus[0]}" in printed


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_a_cpu_this_process_may_not_use_fails_naming_the_stage_and_cpu(tiny_split: Path, mode: str) -> None:
    bad = max(available_cpus()) + 4096
    placements = [Placement(threads=1), Placement(threads=1, cpus=(bad,))]
    with pytest.raises(RuntimeStageError, match=rf"stage 1 .*cannot pin to CPUs \[{bad}\]"):
        Pipeline.from_manifest(tiny_split, LocalConfig(mode=mode), placements=placements)  # type: ignore[arg-type]
    assert not [t for t in threading.enumerate() if t.name.startswith("onnxpipe")]
