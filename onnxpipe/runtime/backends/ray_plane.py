"""The data plane of a pipeline on a cluster: tensors go from stage to stage over a persistent TCP
connection per hop, not through Ray's calls.

Ray places the stages' actors, ships their files and restarts a lost one; it is not asked to carry the
micro-batches.  Relayed by Ray, each hop of a micro-batch was a call made by the driver: a few hundred
microseconds to a millisecond of Ray's own work per hop, and every byte between two stages crossing the
driver's machine (a call's small values go back to their owner, the driver).  Here each actor listens
on its node's address (:class:`Endpoint`); the driver sends a micro-batch's inputs to the first stage's
actor, each actor sends its outputs straight to the next one's, the last one to the driver.  A hop then
costs its bytes over the link plus a frame's header: no byte crosses a machine it has no business on.

A frame is a small pickled part (``meta``, and each tensor's name, dtype and shape) and the arrays'
bytes, after a fixed header of lengths (:func:`encode`): written from the arrays' own memory, read in
one piece whose slices the received arrays are.  A frame is written by the thread that sends it as far
as the socket's buffer takes it without waiting, the rest by a thread per destination (:class:`_Sender`),
so a stage computes its next micro-batch while its last outputs are still on the wire; each connection
is read by a thread of its own, which hands every frame to the endpoint's callback in the order it
arrived.

A connection that breaks (its peer's process died, or its node) is reported to ``on_broken`` with the
peer's address; what the pipeline does about it (Ray's restart, the micro-batches sent again) is the
backend's business.
"""

from __future__ import annotations

import contextlib
import math
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

_LENGTHS = struct.Struct("!QQ")
"""A frame's header: the length of its pickled part and of the arrays' bytes after it."""
ALIGN = 64
"""Each array's bytes start at a multiple of this from the pickled part's end (padding between)."""
_RAW_KINDS = frozenset("biufc")
"""The dtype kinds whose arrays travel as their bytes: booleans, integers, floats, complex numbers."""
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


def _padding(nbytes: int) -> int:
    return -nbytes % ALIGN


def encode(meta: Any, tensors: Mapping[str, Any]) -> list[memoryview]:
    """The frame of ``meta`` and ``tensors`` as the pieces to write, the arrays' memory not copied (a
    strided array is copied to a contiguous one).

    The pickled part holds ``meta`` and, per tensor, its name, dtype and shape; the arrays' bytes follow
    it, each aligned.  Why not the arrays pickled (protocol 5, out of band) as before: numpy's pickling
    cost 60-90 us a frame each way on a busy node, most of a small frame's hop beyond the wire; and
    their lengths in the header let the reader take the rest of a frame in one read.  An array of
    Python objects (ONNX strings) or of another kind than :data:`_RAW_KINDS` (``bfloat16``, whose dtype
    string does not name it again) travels inside the pickled part."""
    specs: list[tuple[str, Any, Any]] = []
    views: list[memoryview] = []
    for name, value in tensors.items():
        if not isinstance(value, np.ndarray | np.generic):  # an ONNX sequence, map or absent optional
            specs.append((name, value, None))
            continue
        array = np.asarray(value)
        if array.dtype.kind not in _RAW_KINDS:
            specs.append((name, array, None))
            continue
        specs.append((name, array.dtype.str, array.shape))
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        views.append(array.data)
    body = pickle.dumps((meta, specs), protocol=5)
    parts = [memoryview(b""), memoryview(body)]
    data = 0
    for view in views:
        pad = _padding(len(body) + data)
        parts += [memoryview(bytes(pad)), view]
        data += pad + view.nbytes
    parts[0] = memoryview(_LENGTHS.pack(len(body), data))
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
    length, data = _LENGTHS.unpack(_read_exactly(sock, _LENGTHS.size))
    rest = _read_exactly(sock, length + data)
    meta, specs = pickle.loads(memoryview(rest)[:length])
    tensors = {}
    offset = length
    for name, dtype, shape in specs:
        if shape is None:
            tensors[name] = dtype
            continue
        offset += _padding(offset)
        kind = np.dtype(dtype)
        count = math.prod(shape)
        tensors[name] = np.frombuffer(rest, kind, count, offset).reshape(shape)
        offset += count * kind.itemsize
    return Frame(meta, tensors, _LENGTHS.size + length + data, time.time())


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


def _send_all(sock: socket.socket, parts: list[memoryview]) -> None:
    """Write ``parts`` in one ``sendmsg`` where the socket takes them (one packet for a small frame, not
    one per part), the rest in further calls."""
    views = [p for p in parts if p.nbytes]
    while views:
        views = _sent(views, sock.sendmsg(views[:IOV_MAX]))


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
        views = [p for p in parts if p.nbytes]
        with self._lock:
            if self._broken:
                return
            with contextlib.suppress(OSError):  # a full buffer; or a broken connection: the thread says so
                while views and not self._behind:
                    views = _sent(views, self._sock.sendmsg(views[:IOV_MAX], [], socket.MSG_DONTWAIT))
            if views:
                self._behind += 1
                self._queue.put(views)

    def _loop(self) -> None:
        while (views := self._queue.get()) is not None:
            try:
                _send_all(self._sock, views)
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
