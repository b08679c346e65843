"""What a Ray pipeline that may not restart says when it loses a stage, without Ray: the actors' watches
are fakes that answer when the test says."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from onnxpipe.runtime.backends import ray_backend
from onnxpipe.runtime.backends.ray_backend import RayBackend
from onnxpipe.runtime.base import RayConfig


class RayError(Exception):
    pass


class ActorDiedError(RayError):
    pass


class _Watch:
    """An actor's watch: pending until ``answers`` polls have passed, then a string or a raised error."""

    def __init__(self, answer: str | RayError | None, after: int = 0) -> None:
        self.answer, self.after = answer, after

    def ready(self) -> bool:
        self.after -= 1
        return self.answer is not None and self.after < 0

    def get(self) -> str:
        if isinstance(self.answer, RayError):
            raise self.answer
        assert self.answer is not None
        return self.answer


def _backend(watches: list[_Watch]) -> RayBackend:
    fake_ray = SimpleNamespace(
        exceptions=SimpleNamespace(RayError=RayError),
        wait=lambda refs, num_returns, timeout: ([w for w in refs if w.ready()], []),
        get=lambda ref: ref.get(),
    )
    backend = RayBackend.__new__(RayBackend)
    backend._ray = fake_ray
    backend._watches = watches
    backend._broken = None
    backend._watched = 0.0
    backend._lock = threading.Lock()
    backend.config = RayConfig(restarts=0)
    backend._actor_names = lambda: {41: "the actor of stages 1, 3 (pid 41 on node-b)"}  # type: ignore[method-assign]
    backend._failure = None
    return backend


def test_a_broken_connection_seen_before_ray_reports_the_death_names_the_dead_actor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression (a CI run): stage 0's actor saw its connection to stage 1 refused before Ray said that
    stage 1's actor died, and the failure named only the refused connection."""
    monkeypatch.setattr(ray_backend, "WATCH_S", 0.0)
    refused = _Watch("cannot connect to 192.0.2.2:46679: [Errno 111] Connection refused")
    died = _Watch(ActorDiedError("The actor died unexpectedly. pid: 41, ip: 192.0.2.2"), after=3)
    backend = _backend([refused, died])
    assert backend._loss() is None
    assert backend._failure is not None
    text = str(backend._failure)
    assert text.startswith("the pipeline lost a stage and may not restart it: a stage actor was lost: ")
    assert "the actor of stages 1, 3 (pid 41 on node-b) died" in text


def test_a_broken_connection_with_no_actor_dead_is_named_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_backend, "WATCH_S", 0.0)
    monkeypatch.setattr(ray_backend, "DEATH_S", 0.05)
    refused = _Watch("cannot connect to 192.0.2.2:46679: [Errno 111] Connection refused")
    backend = _backend([refused, _Watch(None)])
    assert backend._loss() is None
    assert str(backend._failure) == (
        "the pipeline lost a stage and may not restart it: "
        "cannot connect to 192.0.2.2:46679: [Errno 111] Connection refused"
    )
