"""The defaults of the workers' options, apart from :mod:`onnxpipe.runtime.base` (which loads numpy) so
that options objects are made without loading it."""

from __future__ import annotations

from onnxpipe.core.choices import LocalMode, RayFiles

DEFAULT_LOCAL_MODE = LocalMode.THREADS
"""Threads are the default because they pass tensors without copies and wake without inter-process
signals, which made them faster than processes on every model the ``pipeline`` benchmark measured
(``benchmarks/results/pipeline.json``, docs/runtime.md).  Processes isolate the stages and measure each
one's memory."""

DEFAULT_SLOTS = 2
"""Micro-batches each channel between two workers holds, whatever the backend: one being handed over while
the next is computed."""

DEFAULT_RAY_FILES = RayFiles.SHIP
"""Stage files reach Ray's nodes through Ray: a cluster needs no folder every machine shares, and each
node keeps what it got, so a second run ships nothing."""

DEFAULT_RAY_RESTARTS = 3
"""Times Ray starts a lost actor again (its node died) before the run stops: a spare node takes over."""

DEFAULT_RAY_RESTART_TIMEOUT_S = 120.0
"""Seconds a lost actor may take to run again: Ray first declares its node dead (its health checks,
about 15-30 s by default), then starts the actor on another node and the driver ships it its files."""
