"""The data plane of a pipeline on a cluster: tensors go from stage to stage over a persistent TCP
connection per hop, not through Ray's calls.

Ray places the stages' actors, ships their files and restarts a lost one; it is not asked to carry the
micro-batches.  Relayed by Ray, each hop of a micro-batch was a call made by the driver: a few hundred
microseconds to a millisecond of Ray's own work per hop, and every byte between two stages crossing the
driver's machine (a call's small values go back to their owner, the driver).  Here each actor listens
on its node's address (:class:`Endpoint`); the driver sends a micro-batch's inputs to the first stage's
actor, each actor sends its outputs straight to the next one's, the last one to the driver.  A hop then
costs its bytes over the link plus a frame's header: no byte crosses a machine it has no business on.

A frame is a pickled ``(meta, tensors)`` (protocol 5: the arrays' buffers travel out of band, written
from and read into their own memory, one copy each way) after a fixed header of lengths.  Sending runs
on a thread per destination (:class:`_Sender`), so a stage computes its next micro-batch while its last
outputs are still on the wire; each connection is read by a thread of its own, which hands every frame
to the endpoint's callback in the order it arrived.

A connection that breaks (its peer's process died, or its node) is reported to ``on_broken`` with the
peer's address; what the pipeline does about it (Ray's restart, the micro-batches sent again) is the
backend's business.
"""

from __future__ import annotations

import contextlib
import pickle
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

Address = tuple[str, int]

_LENGTHS = struct.Struct("!QI")
"""A frame's header: the pickle's length and how many out-of-band buffers follow it."""
_BUFFER = struct.Struct("!Q")
CONNECT_TIMEOUT_S = 30.0
BUFFER_BYTES = 4 * 1024 * 1024
"""Socket buffers large enough to keep a gigabit link busy across a millisecond or two of scheduling."""


class PlaneError(RuntimeError):
    """A connection of the data plane could not be made or broke."""


@dataclass(frozen=True)
class Frame:
    """One message as it arrived: what the sender said of it, its tensors, its size on the wire, and
    when its last byte arrived (``time.time()``)."""

    meta: Any
    tensors: dict[str, np.ndarray]
    nbytes: int
    received: float


def encode(meta: Any, tensors: Mapping[str, np.ndarray]) -> list[memoryview]:
    """The frame of ``meta`` and ``tensors`` as the pieces to write, the arrays' memory not copied."""
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps((meta, dict(tensors)), protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    parts = [memoryview(_LENGTHS.pack(len(body), len(views))), memoryview(body)]
    for view in views:
        parts += [memoryview(_BUFFER.pack(view.nbytes)), view]
    return parts


def _read_exactly(sock: socket.socket, size: int) -> bytearray:
    out = bytearray(size)
    view = memoryview(out)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise EOFError("the connection was closed")
        got += n
    return out


def read_frame(sock: socket.socket) -> Frame:
    """The next frame on ``sock``; :class:`EOFError` when its peer closed it between frames."""
    length, count = _LENGTHS.unpack(_read_exactly(sock, _LENGTHS.size))
    body = _read_exactly(sock, length)
    buffers = []
    for _ in range(count):
        (size,) = _BUFFER.unpack(_read_exactly(sock, _BUFFER.size))
        buffers.append(_read_exactly(sock, size))
    meta, tensors = pickle.loads(body, buffers=buffers)
    total = _LENGTHS.size + length + sum(_BUFFER.size + len(b) for b in buffers)
    return Frame(meta, tensors, total, time.time())


def _tuned(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER_BYTES)
    return sock


def _send_all(sock: socket.socket, parts: list[memoryview]) -> None:
    """Write ``parts`` in one ``sendmsg`` where the socket takes them (one packet for a small frame, not
    one per part), the rest in further calls."""
    views = [p for p in parts if p.nbytes]
    while views:
        sent = sock.sendmsg(views)
        while sent:
            if sent >= views[0].nbytes:
                sent -= views.pop(0).nbytes
            else:
                views[0], sent = views[0][sent:], 0


class _Sender:
    """The connection to one destination and the thread that writes its frames in order.  (Writing a small
    frame in the caller's thread instead was measured: with another Python thread busy in the sending
    process, each hop then waited on the interpreter's lock, 15 ms against 0.1 ms through the thread.)"""

    def __init__(self, to: Address, on_broken: Callable[[Address, str], None]) -> None:
        self.to = to
        self._on_broken = on_broken
        self._queue: queue.SimpleQueue[list[memoryview] | None] = queue.SimpleQueue()
        try:
            self._sock = _tuned(socket.create_connection(to, timeout=CONNECT_TIMEOUT_S))
        except OSError as e:
            raise PlaneError(f"cannot connect to {to[0]}:{to[1]}: {e}") from None
        self._sock.settimeout(None)
        self._thread = threading.Thread(target=self._loop, name=f"onnxpipe plane to {to}", daemon=True)
        self._thread.start()

    def put(self, parts: list[memoryview]) -> None:
        self._queue.put(parts)

    def _loop(self) -> None:
        while (parts := self._queue.get()) is not None:
            try:
                _send_all(self._sock, parts)
            except OSError as e:
                self._on_broken(self.to, f"sending to {self.to[0]}:{self.to[1]} failed: {e}")
                return

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5.0)
        with contextlib.suppress(OSError):
            self._sock.close()


class Endpoint:
    """A node's end of the data plane: a listener on ``host`` whose connections' frames go to
    ``on_frame``, and a connection (made on first use) to each address it sends to."""

    def __init__(
        self,
        host: str,
        on_frame: Callable[[Frame], None],
        on_broken: Callable[[Address, str], None] | None = None,
    ) -> None:
        self._on_frame = on_frame
        self._on_broken = on_broken or (lambda _to, _why: None)
        self._listener = socket.create_server((host, 0), backlog=64)
        self.address: Address = (host, int(self._listener.getsockname()[1]))
        self._senders: dict[Address, _Sender] = {}
        self._accepted: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="onnxpipe plane listener", daemon=True).start()

    def send(self, to: Address, meta: Any, tensors: Mapping[str, np.ndarray]) -> int:
        """Queue a frame for ``to`` (connecting first if this is the first); its size on the wire."""
        parts = encode(meta, tensors)
        with self._lock:
            if self._closed:
                raise PlaneError("the data plane was closed")
            sender = self._senders.get(to)
            if sender is None:
                sender = self._senders[to] = _Sender(to, self._on_broken)
        sender.put(parts)
        return sum(p.nbytes for p in parts)

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._accepted.append(_tuned(conn))
            threading.Thread(
                target=self._read, args=(conn, peer), name=f"onnxpipe plane from {peer}", daemon=True
            ).start()

    def _read(self, conn: socket.socket, peer: Address) -> None:
        while True:
            try:
                frame = read_frame(conn)
            except (EOFError, OSError) as e:
                if not self._closed:
                    self._on_broken(peer, f"the connection from {peer[0]}:{peer[1]} broke: {e}")
                return
            self._on_frame(frame)

    def close(self) -> None:
        """Stop listening, finish writing what was queued, close every connection."""
        with self._lock:
            self._closed = True
            senders, self._senders = list(self._senders.values()), {}
            accepted, self._accepted = self._accepted, []
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        with contextlib.suppress(OSError):
            self._listener.close()
        for sender in senders:
            sender.close()
        for conn in accepted:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.close()
