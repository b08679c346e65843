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

from onnxpipe.cli.run import run as run_command
from onnxpipe.core.errors import RuntimeStageError
from onnxpipe.runtime.affinity import (
    Core,
    assign_cpus,
    available_cpus,
    cpu_sets,
    parse_cpu_list,
    physical_cores,
    pin_thread,
    pinned,
)
from onnxpipe.runtime.base import LocalConfig, RayConfig
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


def fake_sysfs(root: Path, cores: list[list[int]], packages: list[int] | None = None) -> Path:
    """A ``/sys/devices/system/cpu`` whose physical cores hold the logical CPUs ``cores``."""
    for i, siblings in enumerate(cores):
        for cpu in siblings:
            topology = root / f"cpu{cpu}" / "topology"
            topology.mkdir(parents=True)
            (topology / "thread_siblings_list").write_text(",".join(map(str, siblings)) + "\n")
            (topology / "physical_package_id").write_text(f"{packages[i] if packages else 0}\n")
    return root


def test_without_a_topology_each_worker_gets_consecutive_cpus_in_lane_order(tmp_path: Path) -> None:
    lanes, note = assign_cpus(
        [[worker(0, 1), worker(1, 2)], [worker(0, 1)]], cpus=[4, 5, 6, 7, 9], sysfs=tmp_path
    )
    assert note is None
    assert [[s.placement.cpus for s in lane] for lane in lanes] == [[(4,), (5, 6)], [(7,)]]
    assert [[s.placement.threads for s in lane] for lane in lanes] == [[1, 2], [1]]  # nothing else changes


def test_two_workers_never_land_on_hyperthread_siblings(tmp_path: Path) -> None:
    """Siblings numbered next to each other (0 and 1 share a core): each thread gets a core of its own."""
    sysfs = fake_sysfs(tmp_path, [[0, 1], [2, 3], [4, 5], [6, 7]])
    assert cpu_sets([1, 1], list(range(8)), sysfs) == [(0,), (2,)]
    assert cpu_sets([2, 2], list(range(8)), sysfs) == [(0, 2), (4, 6)]
    # siblings numbered half the machine apart (0 and 4 share a core): the same rule
    apart = fake_sysfs(tmp_path / "apart", [[0, 4], [1, 5], [2, 6], [3, 7]])
    assert cpu_sets([1, 1, 1, 1], list(range(8)), apart) == [(0,), (1,), (2,), (3,)]


def test_more_threads_than_cores_give_each_worker_whole_cores(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path, [[0, 1], [2, 3], [4, 5], [6, 7]])
    # 6 threads on 4 cores: a worker's threads share its own cores, never another worker's
    assert cpu_sets([3, 3], list(range(8)), sysfs) == [(0, 1, 2), (4, 5, 6)]
    # whole cores do not fit (the first worker needs two, the others one each): consecutive CPUs
    small = fake_sysfs(tmp_path / "small", [[0, 1], [2, 3]])
    assert cpu_sets([3, 1], [0, 1, 2, 3], small) == [(0, 1, 2), (3,)]
    assert cpu_sets([3, 2], [0, 1, 2, 3], small) is None  # more threads than CPUs


def test_a_workers_cores_are_taken_package_by_package(tmp_path: Path) -> None:
    """Cores numbered alternately across two sockets: a two-thread worker stays on one socket's L3."""
    sysfs = fake_sysfs(tmp_path, [[0], [1], [2], [3]], packages=[0, 1, 0, 1])
    assert [c.package for c in physical_cores([0, 1, 2, 3], sysfs)] == [0, 0, 1, 1]
    assert cpu_sets([2, 2], [0, 1, 2, 3], sysfs) == [(0, 2), (1, 3)]


def test_a_worker_moves_to_the_next_socket_rather_than_span_two(tmp_path: Path) -> None:
    two_by_four = fake_sysfs(tmp_path, [[c] for c in range(8)], packages=[0, 0, 0, 0, 1, 1, 1, 1])
    assert cpu_sets([3, 3], list(range(8)), two_by_four) == [(0, 1, 2), (4, 5, 6)]
    # the third fits neither socket's one free core: it spans them
    assert cpu_sets([3, 3, 2], list(range(8)), two_by_four) == [(0, 1, 2), (4, 5, 6), (3, 7)]
    # hyperthreads (cpu c and c + 8 share a core), more threads than cores: whole cores, a socket each
    smt = fake_sysfs(tmp_path / "smt", [[c, c + 8] for c in range(8)], packages=[0, 0, 0, 0, 1, 1, 1, 1])
    assert cpu_sets([6, 6], list(range(16)), smt) == [(0, 8, 1, 9, 2, 10), (4, 12, 5, 13, 6, 14)]


def test_only_the_cpus_given_count_and_their_order_is_kept(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path, [[0, 1], [2, 3], [4, 5]])
    cores = physical_cores([5, 3, 2, 4], sysfs)  # a taskset that left out CPUs 0 and 1
    assert cores == [Core(0, (5, 4)), Core(0, (3, 2))]
    assert cpu_sets([1, 1], [5, 3, 2, 4], sysfs) == [(5,), (3,)]


def test_kernel_cpu_lists_parse() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list("5") == {5}


def test_this_machines_topology_reads_without_error() -> None:
    cpus = available_cpus()
    cores = physical_cores(cpus)
    assert sorted(c for core in cores for c in core.cpus) == sorted(cpus)
    sets = cpu_sets([1] * len(cores), cpus)
    assert sets is not None and len({c for s in sets for c in s}) == len(cores)


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


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_a_cpu_this_process_may_not_use_fails_naming_the_stage_and_cpu(tiny_split: Path, mode: str) -> None:
    bad = max(available_cpus()) + 4096
    placements = [Placement(threads=1), Placement(threads=1, cpus=(bad,))]
    with pytest.raises(RuntimeStageError, match=rf"stage 1 .*cannot pin to CPUs \[{bad}\]"):
        Pipeline.from_manifest(tiny_split, LocalConfig(mode=mode), placements=placements)  # type: ignore[arg-type]
    assert not [t for t in threading.enumerate() if t.name.startswith("onnxpipe")]
