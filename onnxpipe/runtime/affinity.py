"""Pinning local workers to CPUs of their own (``onnxpipe run --pin``, ``LocalConfig(pin=True)``).

Why: a pipeline's workers block whenever they wait for input or room, and the scheduler may wake them on
another core, whose caches hold the other stage's weights; a replica or a lone session, always busy,
rarely moves.  The ``pipeline`` benchmark runs pinned and unpinned pipelines side by side
(``benchmarks/results/pipeline_pinned.json`` against ``pipeline.json``).

How: :func:`cpu_sets` gives each worker of each lane, in order, as many of the CPUs this process may
use (``os.sched_getaffinity``) as it has intra-op threads, never one that shares a physical core with
another worker's: hyperthread siblings share a core's execution units and its L1 and L2 caches, so two
stages on siblings slow each other down and evict each other's weights.  When there are at least as many
physical cores as threads, every thread gets a core of its own (one logical CPU of it); else each worker
gets whole cores, its threads sharing them with each other only; else, as a last resort, consecutive
CPUs.  Each worker takes its cores from the first package (socket) with room for all its threads, which
then share one L3; only a worker that no package can hold spans two.  Cores go in the order of the CPUs
given.  The topology comes from sysfs (``/sys/devices/system/cpu/cpuN/topology``); where it
cannot be read, every CPU counts as a core of its own.

A worker pins itself (:func:`pin_thread`: a thread pins only itself on Linux), and its session is created
while the creating thread is pinned to the worker's CPUs (:func:`pinned`), so that onnxruntime's intra-op
threads, which inherit their creator's mask, stay there too.  Workers that together want more CPUs than
there are are not pinned at all: oversubscribed cores are the scheduler's to share.  It is opt-in because
two pinned pipelines in one process, or in two processes started alike, would pin to the same CPUs; give
each process its own CPUs (``taskset -c``) and pinning picks from those.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from itertools import accumulate
from pathlib import Path

from onnxpipe.runtime.spec import WorkerSpec


def available_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on: its main thread's mask, whichever thread asks (a caller inside
    :func:`pinned` would otherwise see only its own CPUs); none where the platform cannot pin."""
    if not hasattr(os, "sched_getaffinity"):
        return ()
    return tuple(sorted(os.sched_getaffinity(os.getpid())))


SYSFS_CPUS = Path("/sys/devices/system/cpu")
"""Where Linux describes each CPU's place: ``cpuN/topology/{thread_siblings_list,physical_package_id}``."""


@dataclass(frozen=True)
class Core:
    """One physical core: its package (socket) and those of its logical CPUs (hyperthread siblings)
    that were asked about, in the order they were given."""

    package: int
    cpus: tuple[int, ...]


def physical_cores(cpus: Sequence[int], sysfs: Path = SYSFS_CPUS) -> list[Core]:
    """``cpus`` grouped by physical core, package by package, each in the order its first CPU was given.

    A CPU whose topology cannot be read (no sysfs: another platform, or a container that hides it) is a
    core of its own, in a package of its own.
    """
    groups: dict[tuple[int, frozenset[int]], list[int]] = {}
    for cpu in cpus:
        topology = sysfs / f"cpu{cpu}" / "topology"
        try:
            siblings = parse_cpu_list((topology / "thread_siblings_list").read_text())
            package = int((topology / "physical_package_id").read_text())
        except (OSError, ValueError):
            siblings, package = frozenset((cpu,)), -1 - cpu
        groups.setdefault((package, siblings | {cpu}), []).append(cpu)
    # groups are in the order of their first CPU: a stable sort by package keeps the cores in it
    packages = list(dict.fromkeys(package for package, _ in groups))
    ordered = sorted(groups.items(), key=lambda g: packages.index(g[0][0]))
    return [Core(package, tuple(members)) for (package, _), members in ordered]


def parse_cpu_list(text: str) -> frozenset[int]:
    """A kernel CPU list (``"0-3,8,10-11"``) as a set of CPU numbers."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if part:
            low, _, high = part.partition("-")
            out.update(range(int(low), int(high or low) + 1))
    return frozenset(out)


def cpu_sets(
    threads: Sequence[int], cpus: Sequence[int] | None = None, sysfs: Path = SYSFS_CPUS
) -> list[tuple[int, ...]] | None:
    """CPUs for workers of ``threads`` intra-op threads each, in order (see the module docstring), or
    None when they want more than the CPUs of ``cpus`` (default :func:`available_cpus`)."""
    pool = tuple(available_cpus() if cpus is None else cpus)
    if not pool or sum(threads) > len(pool):
        return None
    cores = physical_cores(pool, sysfs)
    if sum(threads) <= len(cores):  # a physical core for every thread: one logical CPU of each
        return _by_package([Core(c.package, c.cpus[:1]) for c in cores], threads)
    whole = _by_package(cores, threads)  # whole cores: a worker's threads share only its own cores
    if whole is not None:
        return whole
    # the last resort: consecutive CPUs
    return [pool[end - n : end] for n, end in zip(threads, accumulate(threads), strict=True)]


def _by_package(cores: Sequence[Core], threads: Sequence[int]) -> list[tuple[int, ...]] | None:
    """Each worker on cores of its own, enough for its threads (a last core's spare CPUs left idle),
    from the first package with room for all of them, else across packages; None if the cores run out.
    """
    packages: dict[int, list[Core]] = {}
    for core in cores:
        packages.setdefault(core.package, []).append(core)
    out: list[tuple[int, ...]] = []
    for n in threads:
        source = next((free for free in packages.values() if _cores_for(free, n) is not None), None)
        if source is None:  # no package holds it alone: span them, in order
            source = [core for free in packages.values() for core in free]
        taken = _cores_for(source, n)
        if taken is None:
            return None
        gone = source[:taken]
        for free in packages.values():
            free[:] = [core for core in free if core not in gone]
        out.append(tuple([cpu for core in gone for cpu in core.cpus][:n]))
    return out


def _cores_for(cores: Sequence[Core], n: int) -> int | None:
    """How many of ``cores``, from the first, give ``n`` CPUs; None if all of them do not."""
    counts = list(accumulate(len(core.cpus) for core in cores))
    taken = bisect_left(counts, n)
    return taken + 1 if taken < len(counts) else None


def assign_cpus(
    lanes: Sequence[Sequence[WorkerSpec]],
    cpus: Sequence[int] | None = None,
    sysfs: Path = SYSFS_CPUS,
    *,
    workers: Sequence[int] | None = None,
) -> tuple[list[list[WorkerSpec]], str | None]:
    """``lanes`` with each worker's placement pinned to CPUs of its own (:func:`cpu_sets`, in lane and
    stage order), and a note when it cannot be: then nothing is pinned.

    ``workers[s]`` (the same for every lane) groups stages that share a worker, as an interleaved split's
    do: a group gets one set of CPUs, as many as its hungriest stage's threads, and its stages share
    it, which is what the plan's per-worker time assumes.
    """
    pool = tuple(available_cpus() if cpus is None else cpus)
    groups = [list(range(len(lane))) if workers is None else list(workers) for lane in lanes]
    for lane, group in zip(lanes, groups, strict=True):
        if len(group) != len(lane):
            raise ValueError(f"workers names {len(group)} stages, the lane has {len(lane)}")
    need: list[int] = []  # threads per (lane, worker), in order of first appearance
    slot: list[list[int]] = []  # per lane and stage: index into need
    for lane, group in zip(lanes, groups, strict=True):
        order = list(dict.fromkeys(group))
        slot.append([len(need) + order.index(w) for w in group])
        need += [max(s.placement.threads for s, v in zip(lane, group, strict=True) if v == w) for w in order]
    if not pool:
        return [list(lane) for lane in lanes], "workers not pinned: this platform cannot pin threads to CPUs"
    sets = cpu_sets(need, pool, sysfs)
    if sets is None:
        note = (
            f"workers not pinned: they run {sum(need)} intra-op threads in all and this process may use "
            f"{len(pool)} CPU(s)"
        )
        return [list(lane) for lane in lanes], note
    out = [
        [replace(s, placement=replace(s.placement, cpus=sets[i])) for s, i in zip(lane, row, strict=True)]
        for lane, row in zip(lanes, slot, strict=True)
    ]
    return out, None


def pin_thread(cpus: Sequence[int]) -> None:
    """Pin the calling thread to ``cpus`` (nothing for an empty tuple)."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


@contextmanager
def pinned(cpus: Sequence[int]) -> Iterator[None]:
    """Run the body pinned to ``cpus``, then give the calling thread its mask back.

    Threads started in the body (onnxruntime's intra-op pool, while a session is created) keep ``cpus``.
    """
    if not cpus or not hasattr(os, "sched_getaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    try:  # set inside the try: a Ctrl-C right after it still gives the mask back
        os.sched_setaffinity(0, cpus)
        yield
    finally:
        os.sched_setaffinity(0, before)
