"""The defaults of calibration, apart from :mod:`onnxpipe.calibrate.timing` (which loads onnxruntime) so
that options objects are made without loading it."""

from __future__ import annotations

from onnxpipe.core.choices import CalibrationMode

DEFAULT_CALIBRATION_MODE = CalibrationMode.ALONE
"""How the stages are timed by default: each alone.  ``auto`` times them as a pipeline only when this
machine has a physical core for every stage thread (else the stages would share cores, hyperthread
siblings or CPUs, and the times would measure that).

Alone is the default because it has held up on a shared machine: timed in the pipeline, the splits came
out no better on average than timed alone (less than the spread between runs), while that timing, with
every core running a worker and nothing left to absorb a disturbance, missed some stages by far more
(the ``pipeline`` benchmark with ``--calibrate-in pipeline``,
``benchmarks/results/pipeline_pinned_calibrated_in_pipeline.json`` against
``pipeline_pinned_calibrated.json``; docs/runtime.md)."""

DEFAULT_ROUNDS = 2
"""Rounds ``--calibrate`` runs when given without a number."""
