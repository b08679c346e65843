"""What a backend offers the :class:`~onnxpipe.runtime.pipeline.Pipeline` that drives it, and the configs
that start one.

A backend (threads, processes or Ray actors, each a :class:`~onnxpipe.runtime.backends.lanes.Lanes`)
runs one or more *lanes*; a lane is a chain of workers (a K-stage pipeline is one lane of K workers; K
data-parallel replicas are K lanes of one worker).  The pipeline owns ordering, futures and threads; a
backend only moves micro-batches:

* ``try_submit`` hands one micro-batch to a lane with room (or to the lane it names), or says there is
  none (the bound is the backpressure: a backend holds at most ``capacity`` micro-batches); ``lanes``
  says how many lanes there are;
* ``poll`` returns the micro-batches that came out (in any order; each carries its sequence number; a
  generation step that lost its caches with a Ray actor comes out as its
  :class:`~onnxpipe.core.errors.CacheLost`) and raises
  :class:`~onnxpipe.core.errors.RuntimeStageError` once a worker failed or died; what came out before
  the failure is best returned first (raising on the next call), so that those callers get their
  results;
* ``wait`` blocks until ``poll`` may have something new.

``try_submit`` and ``poll`` are called under the pipeline's lock (from any thread); ``wait`` only from
the pipeline's driver thread, without the lock.  ``stats`` and ``reset_stats`` come from the caller.
``close`` comes once the driver has ended: from the caller of ``Pipeline.close``, or from the driver
thread itself after a failure or when the pipeline was dropped.  ``close(graceful=False)`` must end
every worker promptly, including one stuck in a session.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxpipe.core.choices import LocalMode, RayFiles, choice
from onnxpipe.core.errors import CacheLost, UsageError
from onnxpipe.core.options import opt
from onnxpipe.runtime.options import (
    DEFAULT_LOCAL_MODE,
    DEFAULT_RAY_FILES,
    DEFAULT_RAY_RESTART_TIMEOUT_S,
    DEFAULT_RAY_RESTARTS,
    DEFAULT_SLOTS,
)

Tensors = dict[str, np.ndarray]
Delivery = Tensors | CacheLost
"""What a backend's ``poll`` returns for a micro-batch: its outputs, or the error that failed it alone (a
generation step whose sequences' caches were lost with a Ray actor; the pipeline goes on)."""

WAIT_SECONDS = 0.5
"""How long a driver sleeps at most before looking again (a safety net; events normally wake it)."""


@dataclass(frozen=True)
class LocalConfig:
    """Workers on this machine: threads of this process (the default) or processes joined by shared
    memory (``mode``); ``slots`` micro-batches per channel; ``pin`` each worker to CPUs of its own."""

    mode: LocalMode = DEFAULT_LOCAL_MODE
    slots: int = DEFAULT_SLOTS
    pin: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", choice(LocalMode, self.mode, "local_mode"))
        check_slots(self.slots)


@dataclass(frozen=True)
class RayConfig:
    """Workers as Ray actors: on the cluster at ``address`` (default: start a local one), each with the
    actor options ``resources[s]`` of its stage (``num_cpus``, ``num_gpus``, ``resources``).

    ``files``: each actor's stage files shipped by the driver to its node (``ship``), or read from a
    folder every node has at the same path (``shared``).  ``restarts``: how many times Ray starts an
    actor again after its process or node died (on a node that has its resources; the micro-batches it
    held are sent again); 0 fails the run at once.  ``restart_timeout``: seconds a lost actor may take to
    run again before the run stops.
    """

    address: str | None = None
    resources: Sequence[Mapping[str, Any]] | None = None
    slots: int = DEFAULT_SLOTS
    files: RayFiles = DEFAULT_RAY_FILES
    restarts: int = DEFAULT_RAY_RESTARTS
    restart_timeout: float = DEFAULT_RAY_RESTART_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.resources is not None:
            object.__setattr__(self, "resources", tuple(dict(r) for r in self.resources))
        object.__setattr__(self, "files", choice(RayFiles, self.files, "ray_files"))
        check_slots(self.slots)
        if self.restarts < 0:
            raise UsageError(f"{opt('ray_restarts', self.restarts)}: give 0 (no restart) or more")
        if not self.restart_timeout > 0:
            raise UsageError(f"{opt('ray_restart_timeout', self.restart_timeout)}: give seconds above 0")


BackendConfig = LocalConfig | RayConfig
"""One config per backend: what each needs to start its workers, nothing the other takes."""


def check_slots(slots: int) -> None:
    if slots < 1:
        raise UsageError(f"slots {slots}: a channel needs at least one slot")
