"""How busy this machine is while a step measures it, and how many CPUs this process may use.

Profiling and calibration time the model on this machine: another process using the CPUs meanwhile
makes every estimate wrong, and not alike (whichever node ran while it ran looks dear).  The CLI samples
the machine's CPU time before and after such a step (:func:`sample`) and subtracts what this process
used itself (:func:`busy_elsewhere`): what is left is what other processes used, which the load average
alone cannot tell apart from the profiler's own threads.  Linux only (``/proc/stat``); elsewhere the
sample is None and nothing is said.

>>> busy_elsewhere(None, None) is None
True
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")

BUSY_WARNING_CPUS = 0.5
"""Other processes using more than half a CPU on average during a measurement earn a warning: on the
2-core machines this project is tried on that is a quarter of the machine, enough to move a cut."""


@dataclass(frozen=True)
class CpuSample:
    """The machine's busy CPU seconds, this process's own CPU seconds, and the wall clock, at one moment;
    the load average (1 minute) for the message."""

    machine_busy_seconds: float
    own_seconds: float
    wall_seconds: float
    load_1min: float | None


def available_cpu_count() -> int:
    """CPUs this process may run on (its affinity mask where the platform has one, else all)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _machine_busy_seconds(stat: Path) -> float | None:
    try:
        first = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not first or first[0] != "cpu":
        return None
    try:
        ticks = [int(v) for v in first[1:]]
    except ValueError:
        return None
    # user nice system idle iowait irq softirq steal ...: busy is all but idle and iowait
    busy = sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)
    return busy / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def sample(stat: Path = PROC_STAT) -> CpuSample | None:
    """The machine's CPU use now; None where it cannot be read (not Linux)."""
    busy = _machine_busy_seconds(stat)
    if busy is None:
        return None
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    try:
        load: float | None = os.getloadavg()[0]
    except OSError:
        load = None
    return CpuSample(busy, own, time.monotonic(), load)


def busy_elsewhere(before: CpuSample | None, after: CpuSample | None) -> float | None:
    """CPUs other processes kept busy on average between two samples (0.0 when none did); None when
    either sample is missing or too little time passed to tell."""
    if before is None or after is None:
        return None
    wall = after.wall_seconds - before.wall_seconds
    if wall < 0.2:
        return None
    machine = after.machine_busy_seconds - before.machine_busy_seconds
    own = after.own_seconds - before.own_seconds
    return max(0.0, (machine - own) / wall)
