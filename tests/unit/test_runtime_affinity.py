"""Pinning local workers to CPUs of their own: the assignment, the masks the workers really get, and the
same outputs as without pinning."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from runtime_support import spec

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
from onnxpipe.runtime.spec import Placement, WorkerSpec


def worker(index: int, threads: int) -> WorkerSpec:
    return spec(index, Placement(threads=threads))


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
