"""The driver's connection to Ray (:func:`connected`, :data:`OWNED_RAY`) and the one line a Ray error
becomes (:func:`ray_error_text`), apart from the backend that runs stages on the actors
(:mod:`~onnxpipe.runtime.backends.ray_backend`).

A backend connects to Ray unless the caller already did (``ray.init``).  The Ray a backend starts is
shared by every backend opened while it runs and shut down when the last of them closes; a Ray the caller
started is never shut down here.  Ray is an optional dependency (``pip install 'onnxpipe[ray]'``),
imported lazily by :func:`import_ray`.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from onnxpipe.core.errors import RuntimeStageError, UsageError, error_line
from onnxpipe.core.extras import install_hint


class _OwnedRay:
    """How many open backends use the Ray this module started: the last one to close shuts it down.

    ``generation`` tells the Rays this module started apart: a backend that outlived its Ray (the caller
    shut it down, and a later backend started another) does not count against the new one.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.generation = 0

    def acquire(self, ray: Any, address: str | None) -> int | None:
        """Start Ray unless it runs; the generation to :meth:`release` at close, ``None`` for the caller's."""
        with self.lock:
            if ray.is_initialized():
                if self.users == 0:
                    return None
                self.users += 1
                return self.generation
            try:
                ray.init(address=address, include_dashboard=False, logging_level="WARNING")
            except (ConnectionError, RuntimeError, ValueError) as e:
                _shutdown_quietly(ray)
                where = address or "a new local cluster"
                raise UsageError(f"cannot connect to Ray at {where}: {error_line(e)}") from e
            except BaseException:  # Ctrl-C half-way through: leave nothing of it running
                _shutdown_quietly(ray)
                raise
            self.generation += 1
            self.users = 1
            return self.generation

    def release(self, ray: Any, generation: int | None) -> None:
        if generation is None:
            return
        with self.lock:
            if generation != self.generation or self.users == 0:
                return
            self.users -= 1
            if self.users == 0:
                ray.shutdown()


OWNED_RAY = _OwnedRay()


@contextlib.contextmanager
def connected(address: str | None) -> Iterator[Any]:
    """Ray, connected to the cluster at ``address`` (or the one this process already joined) for the
    time of the ``with``; shut down after it if this connection started it (as a backend's would)."""
    ray = import_ray()
    generation = OWNED_RAY.acquire(ray, address)
    try:
        yield ray
    finally:
        OWNED_RAY.release(ray, generation)


def _shutdown_quietly(ray: Any) -> None:
    with contextlib.suppress(Exception):
        ray.shutdown()


def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise UsageError(f"the ray backend needs Ray, which is not installed; {install_hint('ray')}") from e
    return ray


_DEAD_PID = re.compile(r"\bpid: (\d+)")


def ray_error_text(e: BaseException, fallback: str, actors: Mapping[int, str] | None = None) -> str:
    """One line for a Ray error: the stage's own message when a stage raised, else ``fallback`` and
    Ray's first line, naming the stages of a dead actor where ``actors`` (process id to the stages it
    hosted) knows its process."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, RuntimeStageError):
        return str(cause)
    for line in str(e).splitlines():
        if "RuntimeStageError:" in line:
            return line.split("RuntimeStageError:", 1)[1].strip()
    kind = type(e).__name__
    if "ActorDied" in kind or "RayActorError" in kind or "ActorUnavailable" in kind:
        m = _DEAD_PID.search(str(e))
        who = actors.get(int(m.group(1))) if m and actors else None
        return f"{fallback}: {who or 'a stage actor'} died ({error_line(e)})"
    return f"{fallback}: {error_line(e)}"
