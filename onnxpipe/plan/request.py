"""What a user asks a planner for, beyond the model and its costs: the schedule to plan under."""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnxpipe.core.errors import UsageError
from onnxpipe.schedule.timeline import DEFAULT_BACKWARD_RATIO, DEFAULT_MICROBATCHES, KINDS, ScheduleKind

SCHEDULE_CHOICES = (*KINDS, "auto")


@dataclass(frozen=True)
class ScheduleRequest:
    """What the user asked for: a schedule (or ``auto`` among the training ones), M, and the batch.

    ``batch`` samples (at the profiled input shapes) make one training iteration, split into
    ``microbatches`` micro-batches of ``batch / microbatches`` samples; ``auto`` tries every divisor of
    ``batch`` for M when ``microbatches`` is not given.  Streaming inference uses micro-batches of one
    profiled sample and M only for the simulated timeline.
    """

    kind: str = "stream"
    microbatches: int | None = None
    batch: int | None = None
    backward_ratio: float = DEFAULT_BACKWARD_RATIO

    def candidates(self) -> list[tuple[ScheduleKind, int, int]]:
        """(kind, M, samples per micro-batch) to try."""
        if self.kind not in SCHEDULE_CHOICES:
            raise UsageError(f"--schedule {self.kind!r}: choose one of {', '.join(SCHEDULE_CHOICES)}")
        if not (self.backward_ratio > 0 and math.isfinite(self.backward_ratio)):
            raise UsageError(
                f"--backward-ratio {self.backward_ratio}: give a positive finite number (default 2)"
            )
        if self.microbatches is not None and self.microbatches < 1:
            raise UsageError(f"--microbatches {self.microbatches}: give 1 or more")
        if self.kind == "stream":
            if self.batch is not None or self.backward_ratio != DEFAULT_BACKWARD_RATIO:
                raise UsageError(
                    "--batch and --backward-ratio plan training; give --schedule gpipe, 1f1b or auto, "
                    "or leave them out for streaming inference"
                )
            return [("stream", self.microbatches or DEFAULT_MICROBATCHES, 1)]
        kinds: list[ScheduleKind] = ["gpipe", "1f1b"] if self.kind == "auto" else [self.kind]  # type: ignore[list-item]
        batch = self.batch or self.microbatches or DEFAULT_MICROBATCHES
        if self.microbatches is not None:
            if batch % self.microbatches:
                raise UsageError(
                    f"--microbatches {self.microbatches} does not split --batch {batch} evenly; "
                    "choose a divisor of the batch"
                )
            options = [self.microbatches]
        else:
            options = [m for m in range(1, batch + 1) if batch % m == 0]
        return [(kd, m, batch // m) for kd in kinds for m in options]
