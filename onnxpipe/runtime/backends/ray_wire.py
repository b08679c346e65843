"""How tensors travel between Ray actors: a small header and the tensors' bytes cut into pieces that Ray
sends inside its calls, not through its object store.

Ray keeps a call's argument or return value of up to ``max_direct_call_object_size`` (100 KiB by default)
inline, in the call's own message; anything larger goes through the object store: put in the sender
node's shared memory, then pulled by the receiver's node through its object manager.  Measured on one
machine's loopback (``benchmarks/bench_cluster.py``), a 450 KB tensor between two nodes costs about 5 ms
and 10 ms of CPU through the object store, against about 1.5 ms and a third of the CPU as five inline
pieces.  So a stage's outputs leave as ``(header, piece, piece, ...)``: the call returns that many
values (``num_returns``), each under :data:`INLINE_PIECE` bytes, and the next stage's call takes them as
its arguments.  A message over :data:`INLINE_LIMIT` bytes goes whole through the object store, where its
size, not a call's overhead, sets its time.

A call's ``num_returns`` is fixed when it is made, before its stage has run: the caller asks for the
pieces the last micro-batch needed (:attr:`Header.needs`), and a stage that needs more puts the rest in
its last piece (correct, only slower: that piece goes through the object store), one that needs fewer
pads with empty pieces.

The payload is laid out as a shared-memory slot's (:func:`~.shm.laid_out`): an object tensor (ONNX
strings) is pickled there.

Each header also carries the :class:`Leg` of every stage the micro-batch went through, so that the
driver learns each hop's bytes and times from the micro-batch itself, with no other call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxpipe.runtime.backends.shm import ALIGN, TensorMeta, laid_out, read_payload, write_payload

INLINE_PIECE = 96 * 1024
"""Bytes of one inline piece: under Ray's default ``max_direct_call_object_size`` (100 KiB), with room
for the piece's own serialization."""
INLINE_LIMIT = 8 * 1024 * 1024
"""A message of more bytes goes whole through the object store (Ray inlines at most 10 MiB of a call's
arguments)."""


@dataclass(frozen=True)
class Leg:
    """One stage's part of a micro-batch's trip: wall-clock times (``time.time()``, the one clock
    machines share, to within their clocks' agreement) and its own durations."""

    stage: int
    received: float
    """When its call began (its inputs had arrived)."""
    run_seconds: float
    """The stage's own work: its session's run."""
    sent: float
    """When its outputs were packed and handed to Ray."""
    bytes_in: int
    inline_in: bool
    """Whether its inputs came inline (in the call), not through the object store."""
    pieces_in: int = 1
    """The pieces its inputs needed: what the call before it should return next time."""


@dataclass(frozen=True)
class Header:
    """What the pieces after it hold, and the trip so far."""

    tensors: tuple[TensorMeta, ...]
    pieces: int
    """Pieces the payload needed (:attr:`needs` for the next call of the same kind)."""
    inline: bool
    """Whether every piece fits inline."""
    sent: float = 0.0
    """When the sender packed it (wall clock)."""
    legs: tuple[Leg, ...] = ()

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def needs(self) -> int:
        """Values a call returning this message should ask for: the header and its pieces."""
        return 1 + max(1, self.pieces)


_EMPTY = np.zeros(0, dtype=np.uint8)


def pack(
    tensors: Mapping[str, np.ndarray], slots: int, *, sent: float, legs: tuple[Leg, ...] = ()
) -> tuple[Any, ...]:
    """``(header, piece, ...)``: exactly ``slots`` values (``slots`` >= 2), ``tensors``' bytes cut into
    inline pieces (the rest in the last slot when they need more, empty pieces when fewer)."""
    if slots < 2:
        raise ValueError("a message needs a slot for its header and at least one for its payload")
    metas, contents, total = laid_out(tensors)
    flat = np.empty(total, dtype=np.uint8)
    write_payload(flat.data, metas, contents)
    if total > INLINE_LIMIT:
        header = Header(metas, 1, False, sent=sent, legs=legs)
        return (header, flat, *([_EMPTY] * (slots - 2)))
    cuts = list(range(0, total, INLINE_PIECE)) or [0]
    pieces = [flat[c : c + INLINE_PIECE] for c in cuts]
    room = slots - 1
    inline = len(pieces) <= room
    if not inline:  # the rest in the last slot: it goes through the object store
        pieces = [*pieces[: room - 1], flat[cuts[room - 1] :]]
    header = Header(metas, len(cuts), inline, sent=sent, legs=legs)
    return (header, *pieces, *([_EMPTY] * (room - len(pieces))))


def slots_for(tensors: Mapping[str, np.ndarray]) -> int:
    """Values a message of ``tensors`` takes at most: its header and its pieces, none through the object
    store (or one, when it is over :data:`INLINE_LIMIT`)."""
    total = sum(-(-int(np.asarray(v).nbytes) // ALIGN) * ALIGN for v in tensors.values())
    return 2 if total > INLINE_LIMIT else 1 + max(1, -(-total // INLINE_PIECE))


def unpack(header: Header, pieces: Sequence[Any]) -> dict[str, np.ndarray]:
    """The tensors of a message: writable arrays (views of one buffer, so one copy in all)."""
    buffer = np.concatenate([np.asarray(p, dtype=np.uint8).reshape(-1) for p in pieces])
    return read_payload(buffer.data, header.tensors)
