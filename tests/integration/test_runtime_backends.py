"""The backends' own contracts: bounded pipe messages, start-up clean-up, stats replies, wake-ups, Ray owners.

Each test here was written against a defect: a processes pipeline that hung on large string tensors, a
Ray pipeline that lost Ray when another one closed, workers or actors left running after a failed
start, statistics answered by a late reply, and a ``wake`` that did not wake.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing import active_children
from multiprocessing import connection as mpc
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from runtime_support import assert_same, original_outputs, token_batches

from onnxpipe.core.errors import RuntimeStageError
from onnxpipe.runtime.backends import processes
from onnxpipe.runtime.backends.processes import ProcessBackend
from onnxpipe.runtime.backends.shm import SHM_DIR, ItemMessage, SlotReader, SlotWriter
from onnxpipe.runtime.backends.threads import ThreadBackend
from onnxpipe.runtime.base import LocalConfig, RayConfig
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.spec import WorkerSpec


def identity_chain(base: Path, dtype: int = TensorProto.STRING) -> list[WorkerSpec]:
    """Two one-node stages, ``s -> Identity -> m -> Identity -> t``, as worker specs."""
    specs = []
    for i, (x, y) in enumerate([("s", "m"), ("m", "t")]):
        graph = helper.make_graph(
            [helper.make_node("Identity", [x], [y], name=f"id{i}")],
            f"identity{i}",
            [helper.make_tensor_value_info(x, dtype, ["n"])],
            [helper.make_tensor_value_info(y, dtype, ["n"])],
        )
        path = base / f"stage_{i}.onnx"
        onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
        specs.append(WorkerSpec(i, f"stage {i} ({path.name})", str(path), (x,), (x,), (y,), (y,)))
    return specs


def no_segments_left() -> bool:
    return not list(SHM_DIR.glob(f"onnxpipe-{os.getpid()}-*"))


@contextlib.contextmanager
def watchdog(pids: list[int], seconds: float) -> Iterator[threading.Event]:
    """Kill ``pids`` after ``seconds``: a hang then fails the test and leaves nothing; tells if it fired."""
    fired = threading.Event()

    def kill() -> None:
        fired.set()
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    timer = threading.Timer(seconds, kill)
    timer.start()
    try:
        yield fired
    finally:
        timer.cancel()


# --------------------------------------------------------------------------------------------------
# pipe messages stay small: object tensors travel in shared memory


@pytest.mark.timeout(30)  # a message larger than the pipe blocks the send: nobody reads yet
def test_a_channel_message_does_not_grow_with_its_tensors() -> None:
    data_r, data_w = mpc.Pipe(duplex=False)
    free_r, free_w = mpc.Pipe(duplex=False)
    prefix = f"onnxpipe-{os.getpid()}-small"
    writer = SlotWriter(prefix, 2, data_w, free_r)
    reader = SlotReader(data_r, free_w)
    strings = np.array([f"{j:04d}" + "x" * 1020 for j in range(200)], dtype=object).reshape(10, 20)
    tensors = {f"tensor_with_a_long_name_{j:03d}": np.full((j % 3, 2), j, np.int32) for j in range(300)}
    tensors["strings"] = strings
    try:
        writer.send(7, tensors)
        raw = data_r.recv_bytes()
        assert len(raw) < 512, f"a {len(raw)}-byte message could fill the pipe"
        message = pickle.loads(raw)
        assert isinstance(message, ItemMessage) and message.seq == 7
        got = reader.copies(message)
        reader.release(message.slot)
        assert list(got) == list(tensors)
        for name, value in tensors.items():
            assert got[name].dtype == value.dtype and np.array_equal(got[name], value), name
        assert got["strings"].shape == (10, 20)
    finally:
        reader.close()
        writer.close()
    assert not list(SHM_DIR.glob(prefix + "*"))


@pytest.mark.timeout(60)
def test_processes_carry_large_string_tensors(tmp_path: Path) -> None:
    """200 distinct 1 KB strings a micro-batch once deadlocked the caller and the first worker."""
    specs = identity_chain(tmp_path)
    backend = ProcessBackend([specs])
    pipe = Pipeline(backend, input_types={"s": "object"}, output_names=["t"], lanes=[specs])
    pids = pipe.worker_pids()
    batches = [
        {"s": np.array([f"{j}:{i}:" + "x" * 1000 for i in range(200)], dtype=object)} for j in range(12)
    ]
    got: list[dict[str, np.ndarray]] = []
    try:
        with watchdog(pids, 30) as fired, contextlib.suppress(RuntimeStageError):
            got.extend(pipe.stream(batches))
        assert not fired.is_set(), "the pipeline hung"
        assert len(got) == len(batches)
        for b, out in zip(batches, got, strict=True):
            assert out["t"].dtype == object and np.array_equal(out["t"], b["s"])
    finally:
        pipe.close()
    assert not {p.pid for p in active_children()} & set(pids)
    assert no_segments_left()


# --------------------------------------------------------------------------------------------------
# processes: start-up failures, statistics, wake-ups


class SecondStartFails:
    """The workers' context, except that the second worker's process fails to start."""

    def __init__(self) -> None:
        self.spawn = processes.WORKERS
        self.processes: list[BaseProcess] = []

    def Pipe(self, duplex: bool = True) -> Any:
        return self.spawn.Pipe(duplex)

    def Process(self, **kwargs: Any) -> BaseProcess:
        process = self.spawn.Process(**kwargs)
        if len(self.processes) == 1:

            def refuse() -> None:
                raise OSError("no more processes")

            process.start = refuse  # type: ignore[method-assign]
        self.processes.append(process)
        return process


def test_a_failed_process_start_stops_the_workers_of_its_lane_already_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    context = SecondStartFails()
    monkeypatch.setattr(processes, "WORKERS", context)
    with pytest.raises(OSError, match="no more processes"):
        ProcessBackend([identity_chain(tmp_path)])
    first = context.processes[0]
    try:
        assert first.exitcode is not None, "the first worker was left running"
    finally:
        if first.exitcode is None:
            first.kill()
            first.join()
    assert first not in active_children()
    assert no_segments_left()


class LateReplies:
    """A control connection whose first poll finds nothing: the worker's reply comes too late."""

    def __init__(self, conn: mpc.Connection) -> None:
        self.conn = conn
        self.polls = 0

    def poll(self, timeout: float = 0.0) -> bool:
        self.polls += 1
        return self.polls > 1 and self.conn.poll(timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def test_stats_drop_a_reply_that_came_too_late(tiny_split: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = token_batches(5)
    with Pipeline.from_manifest(tiny_split, LocalConfig(mode="processes")) as pipe:
        for b in batches[:3]:
            pipe.run(b)
        worker = pipe.backend._workers[0]  # type: ignore[attr-defined]
        control = worker.control
        worker.control = LateReplies(control)
        with monkeypatch.context() as m:
            m.setattr(processes, "STATS_TIMEOUT_S", 0.0)
            with pytest.raises(RuntimeStageError, match="gave no statistics"):
                pipe.stats()
        worker.control = control
        for b in batches[3:]:
            pipe.run(b)
        assert [len(s.records) for s in pipe.stats()] == [5, 5]


@pytest.mark.timeout(120)
def test_stats_from_many_threads_get_their_own_replies(tiny_split: Path) -> None:
    with Pipeline.from_manifest(tiny_split, LocalConfig(mode="processes")) as pipe:
        for b in token_batches(3):
            pipe.run(b)
        errors: list[BaseException] = []

        def ask() -> None:
            try:
                for _ in range(20):
                    stats = pipe.stats()
                    assert [(s.index, len(s.records)) for s in stats] == [(0, 3), (1, 3)]
            except BaseException as e:  # noqa: BLE001 - reported by the test's thread
                errors.append(e)

        askers = [threading.Thread(target=ask, daemon=True) for _ in range(4)]
        for t in askers:
            t.start()
        for t in askers:
            t.join(60)
        assert not [t for t in askers if t.is_alive()], "stats() hung"
        assert errors == []


def test_wake_makes_a_waiting_driver_return(tmp_path: Path) -> None:
    backend = ProcessBackend([identity_chain(tmp_path)])
    try:
        backend.wake()
        start = time.monotonic()
        backend.wait(5.0)
        assert time.monotonic() - start < 1.0, "a wake-up before the wait must count"
        for _ in range(100_000):  # more than the pipe holds: never blocks
            backend.wake()
        backend.wait(5.0)
        start = time.monotonic()
        backend.wait(0.3)
        assert time.monotonic() - start >= 0.25, "one wait takes every pending wake-up"
        waiter = threading.Thread(target=backend.wait, args=(10.0,))
        waiter.start()
        time.sleep(0.2)
        start = time.monotonic()
        backend.wake()
        waiter.join(5.0)
        assert not waiter.is_alive() and time.monotonic() - start < 1.0
    finally:
        backend.close()
    backend.wake()  # after close: nothing to wake, no error
    assert no_segments_left()


UNGUARDED_MAIN = """
import pickle
from onnxpipe.runtime.backends.processes import ProcessBackend

with open({runs!r}, "a") as f:  # once per run of this main module, in whichever process runs it
    f.write("ran\\n")
with open({specs!r}, "rb") as f:
    specs = pickle.load(f)
backend = ProcessBackend([specs])
backend.close()
"""


@pytest.mark.parametrize("how", ["script", "stdin"])
def test_workers_never_run_the_callers_main_module(tmp_path: Path, how: str) -> None:
    """A script with no ``if __name__ == "__main__":`` guard (and ``python -``, whose main is no file)
    starts process workers: they must not import the caller's main module, which would start them again."""
    (tmp_path / "specs.pkl").write_bytes(pickle.dumps(identity_chain(tmp_path)))
    runs = tmp_path / "runs.txt"
    code = UNGUARDED_MAIN.format(runs=str(runs), specs=str(tmp_path / "specs.pkl"))
    env = dict(os.environ)
    tree = str(Path(processes.__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH")) if p)
    if how == "script":
        (tmp_path / "main.py").write_text(code)
        argv, stdin = [sys.executable, str(tmp_path / "main.py")], None
    else:
        argv, stdin = [sys.executable, "-"], code
    proc = subprocess.run(
        argv, cwd=tmp_path, input=stdin, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert runs.read_text() == "ran\n", "a worker ran the caller's main module again"


# --------------------------------------------------------------------------------------------------
# Ray that a backend started: shared, and shut down by the last backend only


HALF_CPU = [{"num_cpus": 0.5}, {"num_cpus": 0.5}]


@pytest.fixture
def no_ray() -> Iterator[Any]:
    """Ray, not running yet in this process; shut down after the test whatever happened."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[ray]')")
    if ray.is_initialized():
        pytest.skip("Ray already runs in this process; these tests need a backend to start it")
    yield ray
    if ray.is_initialized():
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.timeout(600)
def test_a_ray_that_a_backend_started_lasts_until_the_last_pipeline_closes(
    no_ray: Any, tiny_split: Path, sample_models_dir: Path
) -> None:
    batches = token_batches(6, seed=7)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    first = Pipeline.from_manifest(tiny_split, RayConfig(resources=HALF_CPU))
    try:
        with Pipeline.from_manifest(tiny_split, RayConfig(resources=HALF_CPU)) as second:
            first.close()
            assert no_ray.is_initialized()
            assert_same(expected, list(second.stream(batches)))
        assert not no_ray.is_initialized()
    finally:
        first.close()


@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.timeout(600)
def test_a_failed_start_shuts_down_the_ray_it_started(no_ray: Any, tiny_split: Path) -> None:
    with pytest.raises(ValueError, match="cannot be negative"):
        Pipeline.from_manifest(tiny_split, RayConfig(resources=[{}, {"num_cpus": -1}]))
    assert not no_ray.is_initialized()


class _SlowAfterWake(threading.Event):
    """The wake event of a thread backend whose last worker is preempted right after waking the driver
    (2 ms), as a thread on a busy 2-core machine can be."""

    def set(self) -> None:
        super().set()
        if threading.current_thread().name.startswith("onnxpipe stage 1"):
            time.sleep(0.002)


def test_thread_records_are_there_once_their_results_are(tmp_path: Path) -> None:
    """Regression: the last worker wrote its record after the result could be collected, so stats()
    right after a stream missed the last micro-batch and a reset right after a warm-up kept one."""
    specs = identity_chain(tmp_path, TensorProto.FLOAT)
    backend = ThreadBackend([specs])
    backend._wake = _SlowAfterWake()
    feeds = {"s": np.zeros(4, np.float32)}
    with Pipeline(backend, input_types={"s": "float32"}, output_names=["t"], lanes=[specs]) as pipe:
        list(pipe.stream([feeds] * 8))  # a warm-up, as measure() runs one
        pipe.reset_stats()
        list(pipe.stream([feeds] * 20))
        stats = pipe.stats()
    assert [sorted(r.seq for r in s.records) for s in stats] == [list(range(8, 28))] * 2


def _sleeping(run: Any, seconds: float) -> Any:
    def slow(seq: int, received: Any) -> Any:
        time.sleep(seconds)
        return run(seq, received)

    return slow


def test_a_thread_driver_hands_over_as_soon_as_the_first_worker_makes_room(tmp_path: Path) -> None:
    """The first worker wakes the driver when it frees a place: without that wake-up the next
    micro-batch would wait for the slow last stage's result (0.4 s here) before the driver looked
    again."""
    specs = identity_chain(tmp_path, TensorProto.FLOAT)
    backend = ThreadBackend([specs], slots=1)
    for (runner, _), seconds in zip(backend._stages, (0.1, 0.4), strict=True):
        # the first stage slow enough that the driver finds no room before it waits
        runner.run = _sleeping(runner.run, seconds)  # type: ignore[method-assign]
    feeds = {"s": np.zeros(4, np.float32)}
    with Pipeline(backend, input_types={"s": "float32"}, output_names=["t"], lanes=[specs]) as pipe:
        jobs = [pipe.submit(feeds) for _ in range(2)]  # one slot: the second waits in the queue
        for job in jobs:
            job.result(timeout=30)
        first = sorted(pipe.stats()[0].records, key=lambda r: r.seq)
    assert first[1].received - first[0].done < 0.2


class _DiesLate:
    """A killed process as the caller sees it for a moment: its pipes already closed, not yet reaped."""

    def __init__(self, polls_alive: int) -> None:
        self.polls_alive = polls_alive
        self.pid = 4242

    @property
    def exitcode(self) -> int | None:
        if self.polls_alive > 0:
            self.polls_alive -= 1
            return None
        return -signal.SIGKILL


def test_a_closed_channel_waits_for_the_death_that_closed_it() -> None:
    """CI once reported "a worker's channel closed unexpectedly" for a worker killed by SIGKILL: the EOF
    came before the process could be reaped.  The check after a closed channel now gives it a grace."""
    status_ours, status_theirs = mp.Pipe()
    spec = SimpleNamespace(label="stage 1 (stage_1.onnx)")
    worker = processes._Worker((spec,), _DiesLate(polls_alive=3), status_ours, status_ours)  # type: ignore[arg-type]
    backend = object.__new__(ProcessBackend)
    backend._workers = [worker]
    with pytest.raises(RuntimeStageError, match=r"stage 1 .*killed by SIGKILL"):
        backend._check_workers(grace=5.0)
    worker.process = _DiesLate(polls_alive=10**9)  # type: ignore[assignment]
    start = time.monotonic()
    backend._check_workers(grace=0.05)  # nothing died: it gives up after the grace, raising nothing
    assert time.monotonic() - start < 2.0
    status_theirs.close()


def test_the_killed_worker_is_blamed_not_the_neighbour_that_left_after_it() -> None:
    """A worker whose channel closed leaves with code 0 a second later; listed first, it was named."""
    status_ours, status_theirs = mp.Pipe()
    quiet = SimpleNamespace(exitcode=0, pid=1)
    killed = SimpleNamespace(exitcode=-signal.SIGKILL, pid=2)
    backend = object.__new__(ProcessBackend)
    backend._workers = [
        processes._Worker((SimpleNamespace(label="stage 0"),), quiet, status_ours, status_ours),  # type: ignore[arg-type]
        processes._Worker((SimpleNamespace(label="stage 1"),), killed, status_ours, status_ours),  # type: ignore[arg-type]
    ]
    with pytest.raises(RuntimeStageError, match=r"^stage 1: .*killed by SIGKILL"):
        backend._check_workers()
    status_theirs.close()


def test_a_start_up_failure_a_worker_reported_is_named_before_a_silent_death() -> None:
    """A worker that died at start-up without a word (listed first) and one that reported why it cannot
    start: the report is raised, as :meth:`ProcessBackend._check_workers` does once running."""
    dead_ours, dead_theirs = mp.Pipe()
    told_ours, told_theirs = mp.Pipe()
    told_theirs.send(("error", "stage 1 (stage_1.onnx): does not load in onnxruntime (CPU)"))
    died = SimpleNamespace(exitcode=-signal.SIGKILL, pid=1, sentinel=dead_theirs)
    failed = SimpleNamespace(exitcode=None, pid=2, sentinel=told_theirs)
    backend = object.__new__(ProcessBackend)
    backend._workers = [
        processes._Worker((SimpleNamespace(label="stage 0"),), died, dead_ours, dead_ours),  # type: ignore[arg-type]
        processes._Worker((SimpleNamespace(label="stage 1"),), failed, told_ours, told_ours),  # type: ignore[arg-type]
    ]
    with pytest.raises(RuntimeStageError, match=r"^stage 1 \(stage_1.onnx\): does not load"):
        backend._await_ready(5.0)
    dead_theirs.close()
    told_theirs.close()
