"""The data plane of a pipeline on a cluster: tensors go from stage to stage over a persistent TCP
connection per hop, not through Ray's calls.

Ray places the stages' actors, ships their files and restarts a lost one; it is not asked to carry the
micro-batches.  Relayed by Ray, each hop of a micro-batch was a call made by the driver: a few hundred
microseconds to a millisecond of Ray's own work per hop, and every byte between two stages crossing the
driver's machine (a call's small values go back to their owner, the driver).  Here each actor listens
on its node's address (:class:`Endpoint`); the driver sends a micro-batch's inputs to the first stage's
actor, each actor sends its outputs straight to the next one's, the last one to the driver.  A hop then
costs its bytes over the link plus a frame's header: no byte crosses a machine it has no business on.

A frame (:mod:`~onnxpipe.runtime.backends.frames`) is read in as few calls as its bytes allow into one
piece whose slices the received arrays are (:class:`FrameReader`).  A frame is written by the thread
that sends it as far as the socket's buffer takes it without waiting, the rest by a thread per
destination (:class:`_Sender`), so a stage computes its next micro-batch while its last outputs are
still on the wire; each connection is read by a thread of its own, which hands every frame to the
endpoint's callback in the order it arrived.

A connection that breaks (its peer's process died, or its node) is reported to ``on_broken`` with the
peer's address; what the pipeline does about it (Ray's restart, the micro-batches sent again) is the
backend's business.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from onnxpipe.runtime.backends.frames import LENGTHS, decode, encode

Address = tuple[str, int]

CONNECT_TIMEOUT_S = 30.0
BUFFER_BYTES = 4 * 1024 * 1024
"""Socket buffers large enough to keep a gigabit link busy across a millisecond or two of scheduling."""


class PlaneError(RuntimeError):
    """A connection of the data plane could not be made or broke."""


class Frame(NamedTuple):
    """One message as it arrived: what the sender said of it, its tensors, its size on the wire, and
    when its last byte arrived (``time.time()``).  A tuple: made for every frame, it costs a hop less
    than a dataclass does."""

    meta: Any
    tensors: dict[str, np.ndarray]
    nbytes: int
    received: float


READ_AHEAD = 64 * 1024
"""The most a reader's first call for a frame takes (the rest of a larger frame comes in one more)."""
_NOTHING = bytearray()
"""No bytes read ahead (never written to: a frame's buffer holds at least its header)."""


class FrameReader:
    """The frames arriving on one connection, read in as few calls as their bytes allow: a frame's first
    call takes what has arrived, up to the size of the connection's last frame and some more (a frame
    whole, or the beginnings of several), a further call only the rest of a frame that had not all
    arrived.  Why: each call on a socket cost a hop 20-30 us after a stage's run had passed its weights
    through the CPU's caches, and a frame's lengths read apart from the rest cost one more call."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._ahead = _NOTHING
        """What the last call read beyond its frame: the beginning of the next ones."""
        self._expect = 4096
        """How much a frame's first call takes."""
        self._spare = bytearray(self._expect)
        """The buffer of the next frame's first call, made at the end of the last frame's: the memory
        allocator's code and data were then in the CPU's caches (after a stage's run, a buffer of 4 KiB
        cost 10 us to make)."""

    def read(self) -> Frame:
        """The next frame; :class:`EOFError` when the peer closed the connection between frames."""
        buf, got = self._ahead, len(self._ahead)
        if got < LENGTHS.size:
            buf, self._spare = self._spare, bytearray()
            buf[:got] = self._ahead
            got += self._recv(memoryview(buf)[got:], 0)
        while got < LENGTHS.size:
            got += self._recv(memoryview(buf)[got : LENGTHS.size], socket.MSG_WAITALL)
        head, data = LENGTHS.unpack_from(buf)
        end = head + data
        if len(buf) < end:
            buf, before = bytearray(end), buf
            buf[:got] = memoryview(before)[:got]
        while got < end:
            got += self._recv(memoryview(buf)[got:end], socket.MSG_WAITALL)
        self._ahead = buf[end:got] if got > end else _NOTHING
        if len(buf) > end:
            del buf[end:]
        self._expect = min(end + 1024, READ_AHEAD)
        if len(self._spare) < self._expect:
            self._spare = bytearray(self._expect)
        meta, tensors = decode(buf)
        return Frame(meta, tensors, end, time.time())

    def _recv(self, into: memoryview, flags: int) -> int:
        n = self._sock.recv_into(into, 0, flags)
        if n == 0:
            raise EOFError("the connection was closed")
        return n


def _tuned(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER_BYTES)
    return sock


def _sent(views: list[memoryview], sent: int) -> list[memoryview]:
    """What of ``views`` is left to write once ``sent`` bytes of them were written."""
    while sent:
        if sent >= views[0].nbytes:
            sent -= views.pop(0).nbytes
        else:
            views[0], sent = views[0].cast("B")[sent:], 0
    return views


IOV_MAX = 1024
"""The most pieces one ``sendmsg`` takes on Linux (a frame of 600 tensors has 1,200): the rest go in the
next call."""


class _Sender:
    """The connection to one destination.  A frame is written at once by the thread that sends it, as far
    as the socket's buffer takes it without waiting; what is left (a full buffer: a slow link, a busy
    peer), and every frame behind it, is written in order by a thread of this connection's own.

    Why at once: handing each frame to another thread cost its hop a thread switch, and on a busy core
    (a node's one core shared with its stage's compute) that switch waited for the scheduler: 2.6-3.5 ms a
    hop of a generation step against 0.01 ms written at once, on namespaced hosts with a core each.  Why
    never waiting: a sending thread that blocked on a full buffer could close a cycle (the driver's
    lock, an actor's stages that send to each other) in which nobody reads."""

    def __init__(self, to: Address, on_broken: Callable[[Address, str], None]) -> None:
        self.to = to
        self._on_broken = on_broken
        self._queue: queue.SimpleQueue[list[memoryview] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._behind = 0
        """Frames handed to the thread and not yet written: a new frame then queues behind them."""
        self._broken = False
        try:
            self._sock = _tuned(socket.create_connection(to, timeout=CONNECT_TIMEOUT_S))
        except OSError as e:
            raise PlaneError(f"cannot connect to {to[0]}:{to[1]}: {e}") from None
        self._sock.settimeout(None)
        self._thread = threading.Thread(target=self._loop, name=f"onnxpipe plane to {to}", daemon=True)
        self._thread.start()

    def put(self, parts: list[memoryview]) -> None:
        with self._lock:
            if self._broken:
                return
            try:
                while parts and not self._behind:
                    parts = _sent(parts, self._sock.sendmsg(parts[:IOV_MAX], [], socket.MSG_DONTWAIT))
            except OSError:  # a full buffer; or a broken connection: the thread says so
                pass
            if parts:
                self._behind += 1
                self._queue.put(parts)

    def _loop(self) -> None:
        while (views := self._queue.get()) is not None:
            try:  # in one sendmsg where the socket takes them (one packet for a small frame), the rest after
                while views:
                    views = _sent(views, self._sock.sendmsg(views[:IOV_MAX]))
            except OSError as e:
                self._broken = True
                self._on_broken(self.to, f"sending to {self.to[0]}:{self.to[1]} failed: {e}")
                return
            with self._lock:
                self._behind -= 1

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
        parts, nbytes = encode(meta, tensors)
        with self._lock:
            if self._closed:
                raise PlaneError("the data plane was closed")
            sender = self._senders.get(to)
            if sender is None:
                sender = self._senders[to] = _Sender(to, self._on_broken)
        sender.put(parts)
        return nbytes

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
        reader = FrameReader(conn)
        while True:
            try:
                frame = reader.read()
            except Exception as e:  # noqa: BLE001 - a reader that died unheard would leave its frames unread
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
