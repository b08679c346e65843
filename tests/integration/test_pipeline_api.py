"""The Pipeline's contract with its callers: futures always settle, inputs are the caller's to reuse,
a malformed request fails alone, a graceful close finishes what was submitted, a dropped pipeline stops.

Most driver tests run a :class:`ManualBackend` whose micro-batches come out only when the test says
so, which makes cancellation, failure and closing races deterministic; the rest use real stage files.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from runtime_support import (
    MODES,
    assert_same,
    original_outputs,
    reshape_batches,
    token_batches,
)

from onnxpipe.core.errors import RuntimeStageError, UsageError
from onnxpipe.manifest import load_manifest
from onnxpipe.runtime.backends.threads import ThreadBackend
from onnxpipe.runtime.base import LocalConfig, Tensors
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.session import WorkerStats
from onnxpipe.runtime.spec import Placement, stage_specs

SETTLE_S = 10.0
"""How long a test waits for a future that must settle (a hang fails the test instead of blocking it)."""


# --------------------------------------------------------------------------------------------------
# a backend the test drives by hand


class ManualBackend:
    """Holds up to ``capacity`` micro-batches; :meth:`release` lets one out (``y = 2 * x``)."""

    kind = "threads"

    def __init__(self, capacity: int = 2) -> None:
        self._capacity = capacity
        self.lock = threading.Lock()
        self.event = threading.Event()
        self.held: dict[int, np.ndarray] = {}
        self.out: list[tuple[int, Tensors]] = []
        self.received: list[int] = []
        self.closed: list[bool] = []
        self.wait_error: BaseException | None = None
        self.submit_error: BaseException | None = None
        self.extra_result: tuple[int, Tensors] | None = None

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def lanes(self) -> int:
        return 1

    def try_submit(self, seq: int, feeds: Mapping[str, np.ndarray], to_lane: int | None = None) -> bool:
        if self.submit_error is not None:
            raise self.submit_error
        with self.lock:
            if len(self.held) + len(self.out) >= self._capacity:
                return False
            self.held[seq] = feeds["x"]
            self.received.append(seq)
            return True

    def release(self, seq: int) -> None:
        with self.lock:
            self.out.append((seq, {"y": 2 * self.held.pop(seq)}))
        self.event.set()

    def poll(self) -> list[tuple[int, Tensors]]:
        with self.lock:
            done, self.out = self.out, []
            if self.extra_result is not None:
                done.append(self.extra_result)
                self.extra_result = None
        return done

    def wait(self, timeout: float) -> None:
        if self.wait_error is not None:
            raise self.wait_error
        self.event.wait(timeout)
        self.event.clear()

    def wake(self) -> None:
        self.event.set()

    def stats(self) -> list[WorkerStats]:
        return []

    def reset_stats(self) -> None:
        pass

    def worker_pids(self) -> list[int]:
        return []

    def close(self, graceful: bool = True) -> None:
        self.closed.append(graceful)


def manual_pipeline(capacity: int = 2) -> tuple[Pipeline, ManualBackend]:
    backend = ManualBackend(capacity)
    pipe = Pipeline(backend, input_types={"x": "float32"}, output_names=["y"], lanes=[])
    return pipe, backend


def feeds(value: float) -> dict[str, np.ndarray]:
    return {"x": np.full((2,), value, np.float32)}


def wait_until(condition: Callable[[], object], timeout: float = SETTLE_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def onnxpipe_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("onnxpipe")]


# --------------------------------------------------------------------------------------------------
# 1. the driver never dies silently; cancelled jobs


def test_a_job_at_the_workers_cannot_be_cancelled() -> None:
    pipe, backend = manual_pipeline()
    job = pipe.submit(feeds(1))
    assert backend.received == [0]
    assert job.running() and not job.cancel()
    backend.release(0)
    assert np.array_equal(job.result(timeout=SETTLE_S)["y"], np.full(2, 2.0))
    pipe.close()


def test_a_timed_out_asyncio_caller_does_not_break_the_pipeline(
    tiny_split: Path, sample_models_dir: Path
) -> None:
    """Regression: wait_for cancelled the running job; its result then killed the driver."""
    batches = token_batches(3, seed=7)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    with Pipeline.from_manifest(tiny_split, LocalConfig(mode="threads")) as pipe:

        async def impatient() -> None:
            await asyncio.wait_for(asyncio.wrap_future(pipe.submit(batches[0])), timeout=0)

        with pytest.raises(TimeoutError):
            asyncio.run(impatient())
        got = [pipe.submit(b).result(timeout=SETTLE_S) for b in batches]
    assert_same(expected, got)
    assert pipe.failure is None


def test_a_job_cancelled_while_queued_never_reaches_the_workers() -> None:
    pipe, backend = manual_pipeline(capacity=1)
    first = pipe.submit(feeds(1))
    dropped = pipe.submit(feeds(2))
    last = pipe.submit(feeds(3))
    assert dropped.cancel()
    backend.release(0)
    wait_until(lambda: backend.received == [0, 2])
    backend.release(2)
    assert np.array_equal(last.result(timeout=SETTLE_S)["y"], np.full(2, 6.0))
    assert first.result(timeout=SETTLE_S)["y"][0] == 2.0
    done, _ = futures.wait([dropped], timeout=SETTLE_S)  # wait() hears of the cancellation
    assert dropped in done and dropped.cancelled()
    pipe.close()
    assert pipe.failure is None


@pytest.mark.parametrize("where", ["wait", "bookkeeping", "try_submit"])
def test_an_unexpected_error_in_the_driver_fails_every_future(where: str) -> None:
    pipe, backend = manual_pipeline(capacity=1)
    running = pipe.submit(feeds(1))
    queued = pipe.submit(feeds(2))
    if where == "wait":
        backend.wait_error = ValueError("wait broke")
        backend.wake()
    elif where == "bookkeeping":
        backend.extra_result = (99, {"y": np.zeros(2, np.float32)})  # a micro-batch nobody submitted
        backend.wake()
    else:
        backend.submit_error = ValueError("try_submit broke")
        backend.release(0)
    if where == "try_submit":  # the result that came out before the failure is delivered
        assert running.result(timeout=SETTLE_S)["y"][0] == 2.0
    for job in (running, queued) if where != "try_submit" else (queued,):
        error = job.exception(timeout=SETTLE_S)
        assert isinstance(error, RuntimeStageError), error
        assert "driver failed" in str(error)
        assert ("ValueError" if where != "bookkeeping" else "KeyError") in str(error)
    assert pipe.failure is not None
    with pytest.raises(RuntimeStageError, match="stopped after a failure"):
        pipe.submit(feeds(3))
    pipe.close()
    assert backend.closed and not onnxpipe_threads()


# --------------------------------------------------------------------------------------------------
# 2. the caller's arrays are copied at submit


@pytest.mark.parametrize("mode", MODES)
def test_the_caller_may_reuse_its_input_buffer(tiny_split: Path, sample_models_dir: Path, mode: str) -> None:
    batches = token_batches(12, seed=11)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    buf = np.empty_like(batches[0]["tokens"])
    with Pipeline.from_manifest(tiny_split, LocalConfig(mode=mode)) as pipe:  # type: ignore[arg-type]
        jobs = []
        for b in batches:
            buf[:] = b["tokens"]
            jobs.append(pipe.submit({"tokens": buf}))
        got = [j.result(timeout=60) for j in jobs]

        def reused() -> Iterator[dict[str, np.ndarray]]:
            for b in batches:
                buf[:] = b["tokens"]
                yield {"tokens": buf}

        streamed = list(pipe.stream(reused()))
    assert_same(expected, got)
    assert_same(expected, streamed)


# --------------------------------------------------------------------------------------------------
# 3. a malformed request fails alone; results that came out are delivered


def test_a_malformed_request_is_refused_and_the_pipeline_keeps_serving(
    tiny_split: Path, reshape_split: Path, sample_models_dir: Path
) -> None:
    batches = token_batches(6, seed=13)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    with Pipeline.from_manifest(tiny_split, LocalConfig(mode="threads")) as pipe:
        jobs = [pipe.submit(b) for b in batches[:3]]
        with pytest.raises(UsageError) as info:
            pipe.submit({"tokens": np.zeros(16, np.int64)})
        message = str(info.value)
        assert "'tokens'" in message and "(16,)" in message and "[batch, seq]" in message
        assert "\n" not in message
        jobs += [pipe.submit(b) for b in batches[3:]]
        assert_same(expected, [j.result(timeout=60) for j in jobs])
        assert pipe.failure is None
    with Pipeline.from_manifest(reshape_split, LocalConfig(mode="threads")) as pipe:
        good = reshape_batches(2)
        with pytest.raises(UsageError, match=r"'x' has shape \(4, 7\).*\[n, 8\]"):
            pipe.submit({**good[0], "x": np.zeros((4, 7), np.float32)})
        with pytest.raises(UsageError, match=r"'shape' has shape \(3,\).*\[2\]"):
            pipe.submit({**good[0], "shape": np.array([4, 2, 4], np.int64)})
        assert [o["y"].shape for o in pipe.run_many(good)] == [(8, 4), (8, 4)]
        pipe.submit({**good[0], "x": np.zeros((5, 8), np.float32), "shape": np.array([5, 8])})


def test_results_that_came_out_before_a_failure_are_delivered(reshape_split: Path) -> None:
    manifest = load_manifest(reshape_split)
    specs = stage_specs(reshape_split, manifest, [Placement()] * manifest.k)
    backend = ThreadBackend([specs], slots=8)  # room for every micro-batch in every channel
    try:
        for seq, b in enumerate(reshape_batches(8, bad=7)):
            wait_until(partial(backend.try_submit, seq, b))
        wait_until(lambda: backend._failure is not None)
        assert sorted(seq for seq, _ in backend.poll()) == list(range(7))
        with pytest.raises(RuntimeStageError, match="micro-batch 7"):
            backend.poll()
    finally:
        backend.close(graceful=False)


# --------------------------------------------------------------------------------------------------
# 4. closing


@pytest.mark.parametrize("mode", MODES)
def test_a_graceful_close_finishes_what_was_submitted(
    tiny_split: Path, sample_models_dir: Path, mode: str
) -> None:
    batches = token_batches(16, seed=17)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    with Pipeline.from_manifest(tiny_split, LocalConfig(mode=mode)) as pipe:  # type: ignore[arg-type]
        pids = pipe.worker_pids()
        jobs = [pipe.submit(b) for b in batches]
    assert_same(expected, [j.result(timeout=0) for j in jobs])
    with pytest.raises(UsageError, match="closed"):
        pipe.submit(batches[0])
    assert not onnxpipe_threads()
    assert all(not Path(f"/proc/{p}").exists() for p in pids)


def test_a_graceful_close_refuses_new_work_and_waits() -> None:
    pipe, backend = manual_pipeline(capacity=1)
    first = pipe.submit(feeds(1))
    queued = pipe.submit(feeds(2))
    closer = threading.Thread(target=pipe.close)
    closer.start()
    wait_until(lambda: _refuses(pipe))
    assert not first.done() and not queued.done() and closer.is_alive()
    backend.release(0)
    wait_until(lambda: backend.received == [0, 1])
    backend.release(1)
    closer.join(SETTLE_S)
    assert not closer.is_alive()
    assert queued.result(timeout=0)["y"][0] == 4.0 and first.result(timeout=0)["y"][0] == 2.0
    assert backend.closed == [True]


def _refuses(pipe: Pipeline) -> bool:
    try:
        pipe.submit(feeds(9)).cancel()
    except UsageError:
        return True
    return False


def test_a_graceful_close_gives_up_after_its_timeout() -> None:
    pipe, backend = manual_pipeline(capacity=1)
    stuck = pipe.submit(feeds(1))
    start = time.monotonic()
    pipe.close(timeout=0.2)
    assert time.monotonic() - start < 5
    with pytest.raises(RuntimeStageError, match="closed before this micro-batch finished"):
        stuck.result(timeout=0)
    assert backend.closed == [False]
    assert pipe.failure is None


def test_close_not_graceful_fails_what_is_pending_at_once() -> None:
    pipe, backend = manual_pipeline(capacity=1)
    jobs = [pipe.submit(feeds(j)) for j in range(3)]
    start = time.monotonic()
    pipe.close(graceful=False)
    assert time.monotonic() - start < 5
    for job in jobs:
        assert isinstance(job.exception(timeout=0), RuntimeStageError)
    assert backend.closed == [False]
    pipe.close()  # twice is fine


def test_close_from_a_callback_does_not_deadlock() -> None:
    pipe, backend = manual_pipeline()
    job = pipe.submit(feeds(1))
    job.add_done_callback(lambda _: pipe.close())
    backend.release(0)
    assert job.result(timeout=SETTLE_S)["y"][0] == 2.0
    wait_until(lambda: bool(backend.closed))
    with pytest.raises(UsageError, match="closed"):
        pipe.submit(feeds(2))


# --------------------------------------------------------------------------------------------------
# 5. capacity, slots, a dropped pipeline


@pytest.mark.parametrize("slots", [1, 2])
def test_thread_capacity_is_what_the_backend_holds(tiny_split: Path, slots: int) -> None:
    manifest = load_manifest(tiny_split)
    specs = stage_specs(tiny_split, manifest, [Placement()] * manifest.k)
    backend = ThreadBackend([specs], slots=slots)
    try:
        assert backend.capacity == slots * 3
        batches = token_batches(1)
        accepted = 0
        deadline = time.monotonic() + 30
        while accepted < backend.capacity and time.monotonic() < deadline:
            accepted += backend.try_submit(accepted, batches[0])
            time.sleep(0.01)
        assert accepted == backend.capacity
        time.sleep(0.5)  # the workers pass everything on that they can: nothing more fits until a poll
        assert not backend.try_submit(accepted, batches[0])
        wait_until(lambda: len(backend.poll()) > 0)
        wait_until(lambda: backend.try_submit(accepted, batches[0]))  # room moves up the lane
    finally:
        backend.close(graceful=False)


def test_a_dropped_pipeline_finishes_its_work_and_stops(tiny_split: Path, sample_models_dir: Path) -> None:
    batches = token_batches(2, seed=19)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    pipe = Pipeline.from_manifest(tiny_split, LocalConfig(mode="threads"))
    assert_same(expected[:1], [pipe.run(batches[0])])
    job = pipe.submit(batches[1])
    ref = weakref.ref(pipe)
    del pipe
    gc.collect()
    assert ref() is None, "the driver thread keeps the pipeline alive"
    assert_same(expected[1:], [job.result(timeout=60)])
    wait_until(lambda: not onnxpipe_threads(), timeout=30)
