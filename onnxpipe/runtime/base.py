"""What a backend offers the :class:`~onnxpipe.runtime.pipeline.Pipeline` that drives it.

A backend runs one or more *lanes*; a lane is a chain of workers (a K-stage pipeline is one lane of K
workers; K data-parallel replicas are K lanes of one worker).  The pipeline owns ordering, futures and
threads; a backend only moves micro-batches:

* :meth:`Backend.try_submit` hands one micro-batch to a lane with room, or says there is none (the
  bound is the backpressure: a backend holds at most :attr:`Backend.capacity` micro-batches);
* :meth:`Backend.poll` returns the micro-batches that came out (in any order; each carries its sequence
  number) and raises :class:`~onnxpipe.errors.RuntimeStageError` once a worker failed or died; what
  came out before the failure is best returned first (raising on the next call), so that those callers
  get their results;
* :meth:`Backend.wait` blocks until ``poll`` may have something new.

``try_submit`` and ``poll`` are called under the pipeline's lock (from any thread); ``wait`` only from
the pipeline's driver thread, without the lock.  ``stats`` and ``reset_stats`` come from the caller.
``close`` comes once the driver has ended: from the caller of ``Pipeline.close``, or from the driver
thread itself after a failure or when the pipeline was dropped.  ``close(graceful=False)`` must end
every worker promptly, including one stuck in a session.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from onnxpipe.runtime.session import WorkerStats

Tensors = dict[str, np.ndarray]

DEFAULT_SLOTS = 2
"""Micro-batches each channel between two workers holds, whatever the backend: one being handed over while
the next is computed."""
WAIT_SECONDS = 0.5
"""How long a driver sleeps at most before looking again (a safety net; events normally wake it)."""


class Backend(Protocol):
    kind: str
    """``"processes"``, ``"threads"`` or ``"ray"``."""

    @property
    def capacity(self) -> int:
        """How many micro-batches the backend holds in flight at most."""
        ...

    def try_submit(self, seq: int, feeds: Mapping[str, np.ndarray]) -> bool: ...

    def poll(self) -> list[tuple[int, Tensors]]: ...

    def wait(self, timeout: float) -> None: ...

    def wake(self) -> None:
        """Make a concurrent :meth:`wait` return (a micro-batch was queued)."""
        ...

    def stats(self) -> list[WorkerStats]: ...

    def reset_stats(self) -> None: ...

    def worker_pids(self) -> list[int]: ...

    def close(self, graceful: bool = True) -> None: ...
