"""Pinning local workers to CPUs of their own: the assignment, the masks the workers really get, and the
same outputs as without pinning."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from runtime_support import assert_same, original_outputs, parse, token_batches

from onnxpipe.errors import UsageError
from onnxpipe.runtime.affinity import assign_cpus, available_cpus, pin_thread, pinned
from onnxpipe.runtime.cli import run_command
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.spec import Placement, WorkerSpec

needs_two_cpus = pytest.mark.skipif(
    len(available_cpus()) < 2, reason="pinning two workers apart needs two CPUs this process may use"
)


def worker(index: int, threads: int) -> WorkerSpec:
    return WorkerSpec(
        index=index,
        label=f"stage {index}",
        path="m.onnx",
        receives=("x",),
        inputs=("x",),
        outputs=("y",),
        sends=("y",),
        placement=Placement(threads=threads),
    )


def test_each_worker_gets_as_many_consecutive_cpus_as_threads_in_lane_order() -> None:
    lanes, note = assign_cpus([[worker(0, 1), worker(1, 2)], [worker(0, 1)]], cpus=[4, 5, 6, 7, 9])
    assert note is None
    assert [[s.placement.cpus for s in lane] for lane in lanes] == [[(4,), (5, 6)], [(7,)]]
    assert [[s.placement.threads for s in lane] for lane in lanes] == [[1, 2], [1]]  # nothing else changes


def test_too_few_cpus_pins_nothing_and_says_why() -> None:
    lanes, note = assign_cpus([[worker(0, 2), worker(1, 2)]], cpus=[0, 1, 2])
    assert [s.placement.cpus for s in lanes[0]] == [(), ()]
    assert note is not None and "4 intra-op threads" in note and "3 CPU(s)" in note


def test_pinned_gives_the_thread_its_mask_back() -> None:
    before = os.sched_getaffinity(0)
    cpu = min(before)
    with pinned((cpu,)):
        assert os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == before
    with pinned(()):  # nothing to pin: nothing changes
        assert os.sched_getaffinity(0) == before


def test_pin_thread_pins_only_the_calling_thread() -> None:
    before = os.sched_getaffinity(0)
    seen: list[set[int]] = []

    def body() -> None:
        pin_thread((min(before),))
        seen.append(os.sched_getaffinity(0))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == [{min(before)}]
    assert os.sched_getaffinity(0) == before


@needs_two_cpus
@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_pinned_workers_run_on_their_cpus_and_compute_the_same(
    tiny_split: Path, sample_models_dir: Path, mode: str
) -> None:
    batches = token_batches(12)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    cpus = available_cpus()
    main_mask = os.sched_getaffinity(0)
    with Pipeline.from_manifest(tiny_split, mode=mode, pin=True) as pipe:  # type: ignore[arg-type]
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


def test_pinning_a_ray_pipeline_is_refused(tiny_split: Path) -> None:
    with pytest.raises(UsageError, match="Ray places its actors itself"):
        Pipeline.from_manifest(tiny_split, backend="ray", pin=True)


def test_too_many_threads_run_unpinned_with_a_note(tiny_split: Path) -> None:
    threads = len(available_cpus())  # two stages of this many threads cannot each have their own
    with Pipeline.from_manifest(tiny_split, mode="threads", threads=threads, pin=True) as pipe:
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
    cpus = available_cpus()
    assert [s["cpus"] for s in obj["stages"]] == [[cpus[0]], [cpus[1]]]
    assert all("pinned" in b["description"] for b in obj["baselines"].values())
    assert f"1 @{cpus[0]}" in printed


def test_a_platform_without_cpus_to_pin_says_so() -> None:
    lanes, note = assign_cpus([[worker(0, 1)]], cpus=[])
    assert lanes[0][0].placement.cpus == () and note is not None and "cannot pin" in note


def test_pinned_gives_the_mask_back_when_the_body_raises() -> None:
    before = os.sched_getaffinity(0)
    with pytest.raises(KeyboardInterrupt), pinned((min(before),)):
        raise KeyboardInterrupt
    assert os.sched_getaffinity(0) == before


def test_available_cpus_are_the_main_threads_not_a_pinned_callers() -> None:
    everything = available_cpus()
    seen: list[tuple[int, ...]] = []

    def pinned_caller() -> None:  # a user's worker thread, pinned, that opens a pipeline
        with pinned(everything[:1]):
            seen.append(available_cpus())

    t = threading.Thread(target=pinned_caller)
    t.start()
    t.join()
    assert seen == [everything]
