"""A Ray actor timing its stage over a window of back-to-back runs (calibration on a cluster), without
Ray: the actor's body is a plain class."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

from onnxpipe.core.errors import RuntimeStageError
from onnxpipe.runtime.backends.ray_actor import WorkerActor
from onnxpipe.runtime.trips import NodePlace


class _Counting:
    """A stage that counts its runs and checks it is fed what the stage received last."""

    def __init__(self, expected: Mapping[str, np.ndarray]) -> None:
        self.expected = expected
        self.runs = 0

    def run(self, seq: int, received: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert received is self.expected
        self.runs += 1
        return {}


def _actor(received: dict[int, dict[str, np.ndarray]]) -> tuple[WorkerActor, _Counting]:
    actor = WorkerActor([])
    actor.place = NodePlace(node_id="f" * 16, address="10.0.0.2", host="box", pid=1)
    stage = _Counting(received.get(0, {}))
    actor.runners = {0: stage}  # type: ignore[dict-item]
    actor.received = received
    return actor, stage


class _Clock:
    """A clock that moves 10 ms each time it is read."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 0.01
        return self.now


def test_a_window_runs_the_stage_back_to_back_on_what_it_received_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The window lasts at least the seconds asked and at least the runs asked; the cost is the window
    over its runs."""
    monkeypatch.setattr("onnxpipe.runtime.backends.ray_actor.time", _Clock())
    feeds = {"x": np.zeros(3, np.float32)}
    actor, stage = _actor({0: feeds})
    assert actor.window(0, 0.0, 3) == pytest.approx(0.02 / 3)  # 3 runs, the clock read 3 times
    assert stage.runs == 3
    assert actor.window(0, 0.045, 1) == pytest.approx(0.06 / 5)  # runs until 45 ms passed
    assert stage.runs == 3 + 5


def test_a_stage_that_received_nothing_cannot_be_timed_and_says_where() -> None:
    actor, _ = _actor({})
    with pytest.raises(RuntimeStageError, match=r"stage 0 has run nothing on box \(10\.0\.0\.2"):
        actor.window(0, 0.0, 1)
