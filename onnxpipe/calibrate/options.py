"""Whether and how ``split`` calibrates (:class:`CalibrationOptions`), apart from
:mod:`onnxpipe.calibrate.timing` (which loads onnxruntime) so that options objects are made without
loading it."""

from __future__ import annotations

from dataclasses import dataclass

from onnxpipe.core.choices import CalibrationMode, choice
from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt

DEFAULT_ROUNDS = 2
"""Rounds a calibration runs when asked for without a number (the CLI's bare ``--calibrate``)."""


@dataclass(frozen=True)
class CalibrationOptions:
    """``rounds`` of timing the exported stages and partitioning again (0: none), each timing the stages
    as ``mode`` says.

    The stages are timed each alone by default.  ``auto`` times them as a pipeline only when this
    machine has a physical core for every stage thread (else the stages would share cores, hyperthread
    siblings or CPUs, and the times would measure that).  Alone is the default because it has held up on
    a shared machine: timed in the pipeline, the splits came out no better on average than timed alone
    (less than the spread between runs), while that timing, with every core running a worker and
    nothing left to absorb a disturbance, missed some stages by far more (the ``pipeline`` benchmark
    calibrated in a pipeline, ``benchmarks/results/pipeline_pinned_calibrated_in_pipeline.json``
    against ``pipeline_pinned_calibrated.json``; docs/runtime.md).
    """

    rounds: int = 0
    mode: CalibrationMode = CalibrationMode.ALONE

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", choice(CalibrationMode, self.mode, "CalibrationOptions.mode"))

    def check(self) -> None:
        if self.rounds < 0:
            raise UsageError(f"{opt('CalibrationOptions.rounds', self.rounds)}: give 0 (none) or more rounds")
