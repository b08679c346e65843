"""What a stage must hold on its device under a schedule: the one memory model every planner uses."""

from __future__ import annotations

from onnxpipe.core.choices import ScheduleKind
from onnxpipe.schedule.simulate import in_flight

TRAINING_STATE_FACTOR = 4.0
"""Bytes held per parameter byte when training with Adam: weights, gradients and two moments."""


def stage_memory_bytes(
    kind: ScheduleKind,
    stage: int,
    k: int,
    microbatches: int,
    size: int,
    weight_bytes: float,
    activation_bytes: float,
    bytes_in: float,
) -> float:
    """What stage ``stage`` must hold on its device under a schedule: the planner's memory model.

    * streaming inference: its weights, plus the micro-batch it computes and the next one arriving
      (``2 * size * bytes_in``, with ``bytes_in`` what crosses the link in front of it; stage 0's input
      comes from the caller and is not counted); the working set inside one run is reported separately
      (``peak_activation_bytes``);
    * training: weights, gradients and Adam's two moments (``4 *`` weights), plus every activation of the
      stage for each micro-batch in flight (GPipe ``M``, 1F1B ``min(M, K - s)``).
    """
    if kind == "stream":
        return weight_bytes + 2.0 * size * bytes_in
    held = in_flight(kind, stage, k, microbatches) * size
    return TRAINING_STATE_FACTOR * weight_bytes + held * activation_bytes
