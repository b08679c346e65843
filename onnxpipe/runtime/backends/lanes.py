"""What the three backends do alike with their lanes: check them, feed them in turn (or the lane a
micro-batch must go to), and hold ``slots`` micro-batches per channel, ``k + 1`` channels per lane of
``k`` stages, so that a backend's capacity means the same whatever runs its workers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

import numpy as np

from onnxpipe.core.errors import RuntimeStageError, UsageError
from onnxpipe.runtime.base import Delivery, check_slots
from onnxpipe.runtime.session import WorkerStats
from onnxpipe.runtime.spec import WorkerSpec
from onnxpipe.runtime.trips import Trip


class Lanes(ABC):
    """The base of every backend (the contract: :mod:`onnxpipe.runtime.base`): its lanes, fed in turn.  A
    subclass offers a micro-batch to one lane (:meth:`_offer`), moves what comes out, reports and stops
    its workers, and records its failure in ``_failure``, which every later call raises."""

    kind: str
    """``"processes"``, ``"threads"`` or ``"ray"``."""

    def __init__(
        self, lanes: Sequence[Sequence[WorkerSpec]], slots: int, workers: Sequence[int] | None
    ) -> None:
        """``workers``: the worker of each stage of a single lane (an interleaved split's)."""
        if not lanes or any(not lane for lane in lanes):
            raise ValueError("a backend needs at least one lane of at least one worker")
        if workers is not None and (len(lanes) != 1 or len(workers) != len(lanes[0])):
            raise UsageError("workers gives the worker of each stage of one lane")
        check_slots(slots)
        self._sizes = [len(lane) for lane in lanes]
        self._slots = slots
        self._next_lane = 0
        self._closed = False
        self._failure: RuntimeStageError | None = None

    @property
    def capacity(self) -> int:
        return sum(self._lane_capacity(li) for li in range(self.lanes))

    def _lane_capacity(self, li: int) -> int:
        return self._slots * (self._sizes[li] + 1)

    @property
    def lanes(self) -> int:
        return len(self._sizes)

    def try_submit(self, seq: int, feeds: Mapping[str, np.ndarray], to_lane: int | None = None) -> bool:
        """Micro-batch ``seq`` to the next lane with room (lanes in turn), or to ``to_lane`` only."""
        self._check_open()
        if to_lane is not None and not 0 <= to_lane < self.lanes:
            raise UsageError(f"lane {to_lane}: this pipeline has lanes 0 to {self.lanes - 1}")
        turn = [(self._next_lane + step) % self.lanes for step in range(self.lanes)]
        for li in turn if to_lane is None else [to_lane]:
            if self._offer(li, seq, feeds):
                self._next_lane = (li + 1) % self.lanes
                return True
        return False

    @abstractmethod
    def _offer(self, li: int, seq: int, feeds: Mapping[str, np.ndarray]) -> bool:
        """Hand ``seq`` to lane ``li`` if it has room; whether it went."""

    def _check_open(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise RuntimeStageError("the pipeline's workers were stopped; open the pipeline again")

    @abstractmethod
    def poll(self) -> Sequence[tuple[int, Delivery]]:
        """What came out since the last call; raises once a worker failed or died."""

    @abstractmethod
    def wait(self, timeout: float) -> None:
        """Block until :meth:`poll` may have something new, ``timeout`` seconds at most."""

    @abstractmethod
    def wake(self) -> None:
        """Make a concurrent :meth:`wait` return (a micro-batch was queued)."""

    @abstractmethod
    def stats(self) -> list[WorkerStats]:
        """Each stage's statistics, in lane and stage order."""

    @abstractmethod
    def reset_stats(self) -> None:
        """Start every stage's statistics afresh (a measured run after a warm-up)."""

    @abstractmethod
    def close(self, graceful: bool = True) -> None:
        """Stop every worker (letting each finish its run first when ``graceful``)."""

    def trips(self) -> list[Trip]:
        """None where a worker's hops are a queue's or shared memory's, timed in its records."""
        return []

    def worker_pids(self) -> list[int]:
        return []
