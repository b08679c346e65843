"""The defaults of the workers' options, apart from :mod:`onnxpipe.runtime.base` (which loads numpy) so
that options objects are made without loading it."""

from __future__ import annotations

from onnxpipe.core.choices import LocalMode

DEFAULT_LOCAL_MODE = LocalMode.THREADS
"""Threads are the default because they pass tensors without copies and wake without inter-process
signals, which made them faster than processes on every model the ``pipeline`` benchmark measured
(``benchmarks/results/pipeline.json``, docs/runtime.md).  Processes isolate the stages and measure each
one's memory."""

DEFAULT_SLOTS = 2
"""Micro-batches each channel between two workers holds, whatever the backend: one being handed over while
the next is computed."""
