"""The choices of ``--calibrate`` and ``--calibrate-in``, apart from :mod:`onnxpipe.calibrate.timing` (which
loads onnxruntime) so that the CLI's parsers can offer them without loading it."""

from __future__ import annotations

from typing import Literal, get_args

CalibrationMode = Literal["alone", "pipeline", "auto"]
"""How the stages are timed: each alone (the default), together as a pinned thread pipeline, or
``auto``: as a pipeline when this machine has a physical core for every stage thread (else the stages
would share cores, hyperthread siblings or CPUs, and the times would measure that), alone otherwise.

Alone is the default because it has held up on a shared machine: timed in the pipeline, the splits came
out no better on average than timed alone (less than the spread between runs), while that timing, with
every core running a worker and nothing left to absorb a disturbance, missed some stages by far more
(the ``pipeline`` benchmark with ``--calibrate-in pipeline``,
``benchmarks/results/pipeline_pinned_calibrated_in_pipeline.json`` against
``pipeline_pinned_calibrated.json``; docs/runtime.md)."""
DEFAULT_CALIBRATION_MODE: CalibrationMode = "alone"
CALIBRATION_MODES: tuple[str, ...] = get_args(CalibrationMode)

DEFAULT_ROUNDS = 2
"""Rounds ``--calibrate`` runs when given without a number."""
