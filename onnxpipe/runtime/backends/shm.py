"""A bounded channel between two processes: tensors in shared memory, small messages in pipes.

A channel has ``slots`` shared-memory buffers.  The writer copies a micro-batch's tensors into a free
slot as a frame (:mod:`~onnxpipe.runtime.backends.frames`: their table, then their bytes), and sends a
small message (sequence number, slot, segment name) through the ``data`` pipe; the reader maps the slot,
hands out numpy views of it (no copy), and returns the slot through the ``free`` pipe once it no longer
needs them.  A writer with no free slot waits: that is the backpressure between stages.

Every pipe message is small and of bounded size whatever the tensors (object tensors, e.g. strings,
travel pickled in the slot too), and a pipe holds at most ``slots`` of them, so a send never blocks on a
full pipe: a caller that sends while holding a lock cannot deadlock with a worker that waits for it.

A slot's segment grows when a micro-batch does not fit (a new, larger segment under a new name; the
message carries the name, so the reader re-maps).  The writer unlinks the segments it created when it
closes; every name starts with the pipeline's prefix, so the owner of the pipeline can also remove what a
killed worker left behind (:func:`unlink_prefix`).  Segments are not registered with multiprocessing's
resource tracker, which would otherwise warn about, and unlink, segments it cannot know are handled.
"""

from __future__ import annotations

import _posixshmem
import contextlib
import os
import select
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path

import numpy as np

from onnxpipe.runtime.backends.frames import decode, encode

MIN_SEGMENT = 1 << 16
MAX_SLOTS = 64
"""Slots a channel may have: that many messages (each well under 256 bytes) fit in a pipe's buffer
(64 KiB on Linux, at least 16 KiB on macOS), so that no send waits for the reader."""
SHM_DIR = Path("/dev/shm")
_SLOT = struct.Struct("<i")


@dataclass(frozen=True)
class ItemMessage:
    """One micro-batch on the data pipe: the slot and segment holding its frame (its table is there, so
    that the message stays small)."""

    seq: int
    slot: int
    segment: str


def _open(name: str, *, create: bool, size: int = 0) -> SharedMemory:
    """A segment that multiprocessing's resource tracker does not know about (we unlink our own)."""
    if sys.version_info >= (3, 13):
        return SharedMemory(name=name, create=create, size=size, track=False)
    segment = SharedMemory(name=name, create=create, size=size)
    # Python < 3.13 registers every segment, created or attached, and its unlink() unregisters again
    resource_tracker.unregister(segment._name, "shared_memory")  # type: ignore[attr-defined]
    return segment


def _buffer(segment: SharedMemory) -> memoryview:
    buf = segment.buf
    assert buf is not None, "a closed segment"
    return buf


class Poller:
    """A persistent ``select.poll`` over a few connections or file descriptors (no per-call set-up)."""

    def __init__(self, *objects: Connection | int) -> None:
        self._poll = select.poll()
        self._fds: dict[int, Connection | int] = {}
        for obj in objects:
            fd = obj if isinstance(obj, int) else obj.fileno()
            self._fds[fd] = obj
            self._poll.register(fd, select.POLLIN)

    def ready(self, timeout: float | None = 0.0) -> list[Connection | int]:
        """The objects readable (or closed) within ``timeout`` seconds (``None``: wait for one)."""
        ms = None if timeout is None else max(0, int(timeout * 1000))
        return [self._fds[fd] for fd, _ in self._poll.poll(ms)]

    def any(self) -> bool:
        return bool(self._poll.poll(0))


def unlink_prefix(prefix: str) -> int:
    """Remove every shared-memory segment whose name starts with ``prefix``; returns how many."""
    removed = 0
    for p in SHM_DIR.glob(prefix + "*"):  # nothing where there is no such folder
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove
            p.unlink()
            removed += 1
    return removed


class SlotWriter:
    """The sending end of a channel."""

    def __init__(self, prefix: str, slots: int, data: Connection, free: Connection) -> None:
        self.prefix = prefix
        self.data = data
        self.free = free
        self._free_slots = list(range(slots - 1, -1, -1))
        self._freed = Poller(free)
        self._segments: dict[int, SharedMemory] = {}
        self._generation = 0

    def collect_freed(self) -> None:
        """Take back the slots the reader returned (never blocks)."""
        while self._freed.any():
            (slot,) = _SLOT.unpack(self.free.recv_bytes())
            self._free_slots.append(slot)

    def has_room(self) -> bool:
        self.collect_freed()
        return bool(self._free_slots)

    def send(self, seq: int, tensors: Mapping[str, np.ndarray]) -> None:
        """Copy ``tensors`` into a free slot and announce them; call only after :meth:`has_room`."""
        slot = self._free_slots.pop()
        parts, size = encode(None, tensors)
        segment = self._segment(slot, size)
        buf, at = _buffer(segment), 0
        for part in parts:
            buf[at : at + part.nbytes] = part.cast("B")
            at += part.nbytes
        self.data.send(ItemMessage(seq, slot, segment.name))

    def _segment(self, slot: int, size: int) -> SharedMemory:
        current = self._segments.get(slot)
        if current is not None and current.size >= size:
            return current
        if current is not None:
            self._release(current)
        self._generation += 1
        grown = max(MIN_SEGMENT, size, 2 * current.size if current is not None else 0)
        segment = _open(
            f"{self.prefix}-{slot}-{self._generation}",
            create=True,
            size=grown + -grown % os.sysconf("SC_PAGE_SIZE"),  # whole pages
        )
        self._segments[slot] = segment
        return segment

    @staticmethod
    def _release(segment: SharedMemory) -> None:
        with contextlib.suppress(BufferError):
            segment.close()
        with contextlib.suppress(FileNotFoundError):
            _posixshmem.shm_unlink("/" + segment.name)

    def close(self) -> None:
        """Unlink every segment this writer created; close its pipes."""
        for segment in self._segments.values():
            self._release(segment)
        self._segments.clear()
        self.data.close()
        self.free.close()


class SlotReader:
    """The receiving end of a channel."""

    def __init__(self, data: Connection, free: Connection) -> None:
        self.data = data
        self.free = free
        self._mapped: dict[int, SharedMemory] = {}
        self._incoming = Poller(data)

    def pending(self) -> bool:
        """Whether a message (or the end of the channel) is waiting."""
        return self._incoming.any()

    def recv(self) -> ItemMessage:
        """The next message; blocks (:class:`EOFError` once the writer's end closed)."""
        message: ItemMessage = self.data.recv()
        return message

    def take(self) -> tuple[int, dict[str, np.ndarray], int]:
        """The next micro-batch: its number, views of its tensors (:meth:`views`) and its slot
        (:class:`~onnxpipe.runtime.backends.lanes.Inbox`)."""
        message = self.recv()
        return message.seq, self.views(message), message.slot

    def views(self, item: ItemMessage) -> dict[str, np.ndarray]:
        """Numpy views of the item's tensors (valid until :meth:`release`; read-only by convention).

        Object tensors are unpickled: they are the reader's own arrays, not views.
        """
        return decode(_buffer(self._map(item.slot, item.segment)))[1]

    def copies(self, item: ItemMessage) -> dict[str, np.ndarray]:
        """The item's tensors as arrays the caller owns."""
        views = self.views(item)
        out = {n: np.array(v, copy=True) if isinstance(v, np.ndarray) else v for n, v in views.items()}
        del views
        return out

    def release(self, slot: int) -> None:
        self.free.send_bytes(_SLOT.pack(slot))

    def _map(self, slot: int, name: str) -> SharedMemory:
        current = self._mapped.get(slot)
        if current is not None and current.name == name:
            return current
        if current is not None:
            with contextlib.suppress(BufferError):  # a view still alive: the mapping goes when it does
                current.close()
        segment = _open(name, create=False)
        self._mapped[slot] = segment
        return segment

    def close(self) -> None:
        """Unmap every segment; close the pipes."""
        for segment in self._mapped.values():
            with contextlib.suppress(BufferError):
                segment.close()
        self._mapped.clear()
        self.data.close()
        self.free.close()
