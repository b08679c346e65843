"""An actor serving its stages on the data plane (``onnxpipe/runtime/backends/ray_actor.py``), on this
machine's loopback, without Ray (the actor's body is a plain class): a frame runs in the thread that
read it, and a close waits for it."""

from __future__ import annotations

import pickle
import queue
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from onnxpipe.runtime.backends.ray_actor import Failed, FailureKind, Note, Route, WorkerActor
from onnxpipe.runtime.backends.ray_plane import Endpoint, Frame
from onnxpipe.runtime.trips import NodePlace


class _Stage:
    """Adds one to ``x``, noting the thread it ran in; waits for ``go`` first."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.go.set()
        self.threads: list[str] = []
        self.records: list[Any] = []

    def run(self, seq: int, received: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.threads.append(threading.current_thread().name)
        self.go.wait(30)
        return {"x": received["x"] + 1}


def _served(
    stage: _Stage | None = None,
) -> tuple[WorkerActor, _Stage, Endpoint, queue.SimpleQueue[Frame], tuple[str, int]]:
    stage = stage or _Stage()
    server = WorkerActor([])
    server.place = NodePlace(node_id="f" * 16, address="127.0.0.1", host="box", pid=1)
    server.runners = {0: stage}  # type: ignore[dict-item]
    out: queue.SimpleQueue[Frame] = queue.SimpleQueue()
    driver = Endpoint("127.0.0.1", out.put)
    address = server.plane_open(1)
    server.plane_route({0: Route(driver.address)}, driver.address)
    return server, stage, driver, out, address


def _note(frame: Frame) -> Note:
    note = Note.read(frame.meta)
    assert note is not None
    return note


def test_a_note_travels_as_plain_values_and_is_read_back() -> None:
    note = Note(3, 7, 1, 2.5, ((0, 1.0, 0.01, 1.5, 100),))
    wire = pickle.dumps(note.wire(), protocol=5)
    assert b"Note" not in wire  # no class pickled by name: plain values
    assert Note.read(pickle.loads(wire)) == note
    assert Note.read(1.5) is None and Note.read(Failed(3, 7, FailureKind.STAGE, "x")) is None


def test_frames_run_in_the_thread_that_read_them_in_order() -> None:
    server, stage, driver, out, to = _served()
    try:
        for seq in range(5):
            driver.send(to, Note(1, seq, 0, 0.0).wire(), {"x": np.full(3, seq)})
        frames = [out.get(timeout=10) for _ in range(5)]
        assert [_note(f).seq for f in frames] == list(range(5))
        assert all(np.array_equal(f.tensors["x"], np.full(3, _note(f).seq + 1)) for f in frames)
        assert [len(_note(f).legs) for f in frames] == [1] * 5
        assert len(set(stage.threads)) == 1 and stage.threads[0].startswith("onnxpipe plane from")
    finally:
        server.plane_close()
        driver.close()


def test_a_close_waits_for_the_frame_running_and_drops_the_frames_behind_it() -> None:
    server, stage, driver, out, to = _served()
    stage.go.clear()
    driver.send(to, Note(1, 0, 0, 0.0).wire(), {"x": np.zeros(2)})
    driver.send(to, Note(1, 1, 0, 0.0).wire(), {"x": np.zeros(2)})  # read once the first ran: dropped
    while not stage.threads:
        threading.Event().wait(0.01)
    closed = threading.Event()
    closing = threading.Thread(target=lambda: (server.plane_close(), closed.set()))
    closing.start()
    assert not closed.wait(0.2)  # the frame running holds the close
    stage.go.set()
    closing.join(10)
    assert closed.is_set() and _note(out.get(timeout=10)).seq == 0
    assert stage.threads == [stage.threads[0]] and out.empty()
    driver.close()


def test_a_frame_of_an_older_epoch_is_dropped_where_it_arrives() -> None:
    """A frame sent before a recovery opened epoch 2 (its micro-batch is sent again in epoch 2) does not
    run: the server, open all along, runs only the frame of its own epoch."""
    server, stage, driver, out, _to = _served()
    to = server.plane_open(2)
    server.plane_route({0: Route(driver.address)}, driver.address)
    try:
        driver.send(to, Note(1, 5, 0, 0.0).wire(), {"x": np.zeros(2)})
        driver.send(to, Note(2, 6, 0, 0.0).wire(), {"x": np.zeros(2)})
        assert _note(out.get(timeout=10)).seq == 6
        assert len(stage.threads) == 1 and out.empty()
    finally:
        server.plane_close()
        driver.close()


class _Broken(_Stage):
    """A stage whose run raises what no stage failure type names (a bug, a bad value)."""

    def run(self, seq: int, received: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise ValueError("setting an array element with a sequence")


def test_an_unexpected_error_in_a_stage_fails_its_micro_batch_and_the_next_ones_still_run() -> None:
    """A frame whose run raises anything is sent back to the driver as a failure, and the connection's
    reader lives on: before, the reader thread died unheard and the driver waited forever."""
    server, _stage, driver, out, to = _served(_Broken())
    try:
        for seq in range(2):
            driver.send(to, Note(1, seq, 0, 0.0).wire(), {"x": np.zeros(2)})
        failed = [out.get(timeout=10).meta for _ in range(2)]
    finally:
        server.plane_close()
        driver.close()
    assert [f.seq for f in failed] == [0, 1]
    assert all("ValueError" in f.text and "stage 0" in f.text for f in failed)
