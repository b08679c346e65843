"""The choices of ``onnxpipe run``'s worker options, apart from :mod:`onnxpipe.runtime.base` (which loads
numpy) so that the CLI's parser can offer them without loading it."""

from __future__ import annotations

from typing import Literal

LocalMode = Literal["processes", "threads"]
LOCAL_MODES: tuple[LocalMode, ...] = ("processes", "threads")
DEFAULT_LOCAL_MODE: LocalMode = "threads"
"""Threads are the default because they pass tensors without copies and wake without inter-process
signals, which made them faster than processes on every model the ``pipeline`` benchmark measured
(``benchmarks/results/pipeline.json``, docs/runtime.md).  Processes isolate the stages and measure each
one's memory."""
BACKENDS = ("local", "ray")

DEFAULT_SLOTS = 2
"""Micro-batches each channel between two workers holds, whatever the backend: one being handed over while
the next is computed."""
