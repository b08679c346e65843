"""Whether and how ``split`` calibrates (:class:`CalibrationOptions`), apart from
:mod:`onnxpipe.calibrate.timing` (which loads onnxruntime) so that options objects are made without
loading it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    ray_address: str | None = None
    """``mode="ray"``: the cluster the stages are timed on (default: the one this process joined)."""
    ray_resources: Path | Sequence[Mapping[str, Any]] | None = None
    """``mode="ray"``: each stage's actor resources, as ``run`` takes them: what puts each stage on the
    node it will run on."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", choice(CalibrationMode, self.mode, "CalibrationOptions.mode"))
        resources: object = self.ray_resources
        if isinstance(resources, str):
            object.__setattr__(self, "ray_resources", Path(resources))
        self._check()

    def _check(self) -> None:
        if self.rounds < 0:
            raise UsageError(f"{opt('CalibrationOptions.rounds', self.rounds)}: give 0 (none) or more rounds")
        on_ray = self.mode == CalibrationMode.RAY
        for name in ("ray_address", "ray_resources"):
            if getattr(self, name) is not None and not on_ray:
                raise UsageError(
                    f"{opt('CalibrationOptions.' + name)} is for {opt('CalibrationOptions.mode', 'ray')}"
                )
