"""Which lane a micro-batch goes to (:meth:`onnxpipe.runtime.backends.lanes.Lanes.try_submit`): the lanes
in turn from the one after the last that took one, a full lane skipped; or the one lane asked for, checked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from runtime_support import spec

from onnxpipe.core.errors import UsageError
from onnxpipe.runtime.backends.lanes import Lanes
from onnxpipe.runtime.base import Delivery
from onnxpipe.runtime.session import WorkerStats


class _Recorded(Lanes):
    """Lanes that only record where each micro-batch went; a lane in ``full`` has no room."""

    kind = "threads"

    def __init__(self, lanes: int, slots: int = 1) -> None:
        super().__init__([[spec(0)] for _ in range(lanes)], slots, None)
        self.full: set[int] = set()
        self.went: list[tuple[int, int]] = []

    def _offer(self, li: int, seq: int, feeds: Mapping[str, np.ndarray]) -> bool:
        if li in self.full:
            return False
        self.went.append((seq, li))
        return True

    def poll(self) -> Sequence[tuple[int, Delivery]]:
        return []

    def wait(self, timeout: float) -> None:
        pass

    def wake(self) -> None:
        pass

    def stats(self) -> list[WorkerStats]:
        return []

    def reset_stats(self) -> None:
        pass

    def close(self, graceful: bool = True) -> None:
        self._closed = True


def test_micro_batches_take_the_lanes_in_turn_and_skip_a_full_one() -> None:
    lanes = _Recorded(3)
    assert all(lanes.try_submit(seq, {}) for seq in range(4))
    lanes.full = {1}
    assert lanes.try_submit(4, {})  # lane 1 is next, but full: lane 2 takes it
    assert lanes.try_submit(5, {}, to_lane=0)
    assert not lanes.try_submit(6, {}, to_lane=1)  # the lane asked for, or none
    lanes.full = {0, 1, 2}
    assert not lanes.try_submit(7, {})
    assert lanes.went == [(0, 0), (1, 1), (2, 2), (3, 0), (4, 2), (5, 0)]


def test_a_lane_the_pipeline_lacks_and_a_channel_without_slots_are_refused() -> None:
    with pytest.raises(UsageError, match=r"^lane 3: this pipeline has lanes 0 to 2$"):
        _Recorded(3).try_submit(0, {}, to_lane=3)
    with pytest.raises(UsageError, match=r"^lane -1: "):
        _Recorded(3).try_submit(0, {}, to_lane=-1)
    with pytest.raises(UsageError, match=r"^slots 0: a channel needs at least one slot$"):
        _Recorded(1, slots=0)
