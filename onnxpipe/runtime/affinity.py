"""Pinning local workers to CPUs of their own (``onnxpipe run --pin``, ``Pipeline.from_manifest(pin=True)``).

Why: a pipeline's workers block whenever they wait for input or room, and the scheduler may wake them on
another core, whose caches hold the other stage's weights; a replica or a lone session, always busy,
rarely moves.  Measured on the 2-core machine of ``benchmarks/bench_pipeline.py``: pinning a tiny GPT-2's
two stages raised the thread pipeline from 1.77x to 1.91x the one-thread session.

How: :func:`assign_cpus` gives each worker of each lane, in order, as many consecutive CPUs of those
this process may use (``os.sched_getaffinity``) as it has intra-op threads.  A worker pins itself
(:func:`pin_thread`: a thread pins only itself on Linux), and its session is created while the creating
thread is pinned to the worker's CPUs (:func:`pinned`), so that onnxruntime's intra-op threads, which
inherit their creator's mask, stay there too.  Workers that together want more CPUs than there are are
not pinned at all: oversubscribed cores are the scheduler's to share.  It is opt-in because two pinned
pipelines in one process, or in two processes started alike, would pin to the same CPUs; give each
process its own CPUs (``taskset -c``) and pinning picks from those.  CPUs are taken in the order the
kernel numbers them; on a host that numbers hyperthread siblings next to each other, give the process one
logical CPU per physical core with ``taskset`` so that two workers do not share a core.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from onnxpipe.runtime.spec import WorkerSpec


def available_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on: its main thread's mask, whichever thread asks (a caller inside
    :func:`pinned` would otherwise see only its own CPUs); none where the platform cannot pin."""
    if not hasattr(os, "sched_getaffinity"):
        return ()
    return tuple(sorted(os.sched_getaffinity(os.getpid())))


def assign_cpus(
    lanes: Sequence[Sequence[WorkerSpec]], cpus: Sequence[int] | None = None
) -> tuple[list[list[WorkerSpec]], str | None]:
    """``lanes`` with each worker's placement pinned to CPUs of its own, and a note when it cannot be.

    Consecutive CPUs of ``cpus`` (default :func:`available_cpus`), as many per worker as its threads, in
    lane and stage order.  Nothing is pinned when the workers want more CPUs than there are.
    """
    pool = tuple(available_cpus() if cpus is None else cpus)
    wanted = sum(spec.placement.threads for lane in lanes for spec in lane)
    if not pool:
        return [list(lane) for lane in lanes], "workers not pinned: this platform cannot pin threads to CPUs"
    if wanted > len(pool):
        note = (
            f"workers not pinned: they run {wanted} intra-op threads in all and this process may use "
            f"{len(pool)} CPU(s)"
        )
        return [list(lane) for lane in lanes], note
    out: list[list[WorkerSpec]] = []
    at = 0
    for lane in lanes:
        pinned_lane: list[WorkerSpec] = []
        for spec in lane:
            n = spec.placement.threads
            place = replace(spec.placement, cpus=pool[at : at + n])
            pinned_lane.append(replace(spec, placement=place))
            at += n
        out.append(pinned_lane)
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
