"""A pipeline schedule's timeline: every device's steps and every link's transfers, with their times.

Plain data on plain numbers (seconds, micro-batch indices): :mod:`onnxpipe.schedule.simulate` makes
one, the planner keeps the best, the manifest writes it (``schedule``) and the plots draw it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from onnxpipe.core.choices import ScheduleKind

StepKind = Literal["F", "B"]
DEFAULT_BACKWARD_RATIO = 2.0
"""Backward over forward time when no training graph says better: two matrix products per forward one."""
DEFAULT_MICROBATCHES = 8
"""Micro-batches a plan's simulated timeline runs when nobody asks for another count (``--microbatches``)."""


@dataclass(frozen=True)
class Step:
    """One forward (``"F"``) or backward (``"B"``) of micro-batch ``microbatch`` on a device."""

    kind: StepKind
    microbatch: int
    start: float
    end: float


@dataclass(frozen=True)
class Transfer:
    """Micro-batch ``microbatch``'s cut moving over link ``link``, the one between stages ``link - 1`` and
    ``link`` (link 0 brings the model input from the source to stage 0).

    ``kind == "F"``: activations forward into stage ``link``; ``kind == "B"``: gradients back into stage
    ``link - 1``.
    """

    link: int
    kind: StepKind
    microbatch: int
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """A simulated schedule: every device's ordered steps with start and end times.

    ``steady_state_throughput_per_s`` is micro-batches per second once the pipeline is full (one over the
    slowest resource: a device's F+B time or a link's transfer time); ``makespan`` is one whole batch of
    ``microbatches`` micro-batches, fill and drain included.
    """

    kind: ScheduleKind
    microbatches: int
    stages: tuple[tuple[Step, ...], ...]
    transfers: tuple[Transfer, ...]
    makespan: float
    steady_state_throughput_per_s: float
    workers: tuple[int, ...] | None = None
    """The worker of each stage when stages share workers (an interleaved split); ``None``: one each."""

    @property
    def k(self) -> int:
        return len(self.stages)

    @property
    def devices(self) -> int:
        """How many devices (workers) run the stages."""
        return self.k if self.workers is None else len(set(self.workers))

    @property
    def busy(self) -> tuple[float, ...]:
        """Seconds each device computes during the makespan."""
        return tuple(sum(st.end - st.start for st in steps) for steps in self.stages)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the device-time ``devices * makespan``: ``(K-1)/(M+K-1)`` for a balanced pipeline
        of ``K`` stages on ``K`` devices."""
        if self.makespan <= 0 or not self.stages:
            return 0.0
        return max(0.0, 1.0 - sum(self.busy) / (self.devices * self.makespan))

    @property
    def first_latency(self) -> float:
        """When micro-batch 0 is finished: its last forward (inference) or its backward on stage 0."""
        if self.kind == ScheduleKind.STREAM:
            return next((st.end for st in self.stages[-1] if st.microbatch == 0), 0.0)
        return next((st.end for st in self.stages[0] if st.kind == "B" and st.microbatch == 0), 0.0)


def worker_groups(workers: Sequence[int]) -> list[tuple[int, ...]]:
    """The stages each worker runs (``workers[s]``: the worker of stage ``s``), in pipeline order, the
    workers in the order of their first stage: the one grouping the tables, the backends and the
    manifest use."""
    groups: dict[int, list[int]] = {}
    for stage, w in enumerate(workers):
        groups.setdefault(w, []).append(stage)
    return [tuple(g) for g in groups.values()]
