"""A generating worker's KV cache: its own layers' past tensors, kept per sequence between steps.

Why here and not in the caller: a decoder's cache is state.  Sent through the pipeline it would cross
every link each token (megabytes against kilobytes of activations); kept by the worker whose stage makes
it, it never leaves the worker.  Each generation step carries a small control tensor (:data:`CONTROL`)
through every stage: the sequence it belongs to, whether it starts or ends that sequence, and how many
tokens the sequence has cached, so that every worker can feed its stage the right pasts and keep the
presents it makes as the next step's pasts.

A stage may also read another layer's past for its *shape* only (the past length torch's exporter reads
off one cache, when the stage holds no cache to read it from: an embedding-only stage); it is fed zeros of
that shape (:attr:`CacheSlot.present` is None).  Nothing else of the cache is read there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum, IntFlag

import numpy as np

CONTROL = "onnxpipe::generation"
"""The control tensor's name: int64 ``[1 + B, 3]``, a header ``[B, padding side, 0]`` then, for each of
the ``B`` sequences of the step, ``[sequence id, flags, cached tokens]`` (no exporter writes ``::`` in a
tensor name)."""


class StepFlags(IntFlag):
    """What a step does to a sequence's cache, besides running."""

    NONE = 0
    START = 1
    """A new sequence: its cache starts empty (a previous sequence of the same id is dropped)."""
    END = 2
    """The sequence's last step: its cache is dropped once the step ran."""
    DROP = 4
    """Run nothing: drop the sequence's cache (a sequence that stopped early, at its end token)."""


class PadSide(IntEnum):
    """Where a shorter sequence's cache is padded in a step of several sequences.

    ``LEFT``: a model that takes the positions and a mask over every past slot (torch's and optimum's
    exports): the padding comes first, masked out, and each sequence's tokens keep their own positions.
    ``RIGHT``: onnxruntime's ``GroupQueryAttention`` (ONNX Runtime GenAI's builder), which reads each
    sequence's length off the mask's ones and its cache from the buffer's start: the padding comes last.
    """

    LEFT = 0
    RIGHT = 1

    def span(self, length: int, cached: int, new: int = 0) -> slice:
        """Where a sequence's ``cached`` tokens, and ``new`` ones after them, lie in a step's ``length``
        cached slots (padded to the longest sequence's) followed by its new ones."""
        return slice(length - cached, length + new) if self == PadSide.LEFT else slice(0, cached + new)


@dataclass(frozen=True)
class CacheSlot:
    """One past input of a stage and the present output that becomes it at the next step.

    ``shape``: the past tensor's dims, each an int, or ``None`` for the batch or the cached tokens (the
    symbolic one at ``sequence_axis``, counted from the end).  ``present`` is None for a past read for
    its shape only (fed zeros).  The batch is the first axis."""

    past: str
    present: str | None
    dtype: str
    shape: tuple[int | None, ...]
    sequence_axis: int = -2

    def empty(self, batch: int, cached: int) -> np.ndarray:
        """Zeros of this past's shape for ``batch`` sequences of ``cached`` tokens."""
        seq = len(self.shape) + self.sequence_axis
        dims = [cached if i == seq else (batch if d is None else d) for i, d in enumerate(self.shape)]
        return np.zeros(dims, dtype=np.dtype(self.dtype))

    def stacked(self, caches: list[np.ndarray], length: int, side: PadSide) -> np.ndarray:
        """The sequences' ``caches`` as one batch of ``length`` cached tokens, each padded with zeros on
        ``side``: one copy of each, into one array."""
        first = caches[0]
        axis = first.ndim + self.sequence_axis
        dims = list(first.shape)
        dims[0], dims[axis] = len(caches), length
        out = np.zeros(dims, dtype=first.dtype)  # the padding stays zeros
        for i, cache in enumerate(caches):
            out[self._at(out.ndim, i, side.span(length, cache.shape[axis]))] = cache
        return out

    def row(self, present: np.ndarray, index: int, keep: slice) -> np.ndarray:
        """Sequence ``index``'s own part of a step's ``present``: its row, the ``keep`` tokens of it (a
        view: the next step copies it into its own batch anyway)."""
        return present[self._at(present.ndim, index, keep)]

    def _at(self, rank: int, index: int, tokens: slice) -> tuple[slice, ...]:
        where = [slice(None)] * rank
        where[0] = slice(index, index + 1)
        where[rank + self.sequence_axis] = tokens
        return tuple(where)


@dataclass(frozen=True)
class Row:
    """One sequence of a step: its id, what the step does to its cache, the tokens it has cached."""

    sequence: int
    flags: StepFlags
    cached: int


@dataclass(frozen=True)
class Control:
    """The control tensor of one step, read: its sequences and where their caches are padded.

    A step of several sequences makes one token each (a prompt's first step runs alone); their caches
    are padded to the longest on ``side``."""

    rows: tuple[Row, ...]
    side: PadSide = PadSide.LEFT

    @staticmethod
    def one(sequence: int, flags: StepFlags, cached: int) -> Control:
        """The control of a step of one sequence."""
        return Control((Row(sequence, flags, cached),))

    @property
    def length(self) -> int:
        """The cached tokens the step's pasts hold: the longest sequence's."""
        return max(r.cached for r in self.rows)

    @staticmethod
    def read(value: np.ndarray) -> Control:
        v = np.asarray(value)
        if v.ndim != 2 or v.shape[1] != 3 or v.shape[0] < 2 or int(v[0, 0]) != v.shape[0] - 1:
            raise ValueError(
                f"{CONTROL} must hold a header and a row per sequence, [1 + B, 3]; got shape {tuple(v.shape)}"
            )
        rows = tuple(Row(int(r[0]), StepFlags(int(r[1])), int(r[2])) for r in v[1:])
        return Control(rows, PadSide(int(v[0, 1])))

    def tensor(self) -> np.ndarray:
        head = [len(self.rows), int(self.side), 0]
        return np.array([head, *([r.sequence, int(r.flags), r.cached] for r in self.rows)], dtype=np.int64)


class NoCache(KeyError):
    """A step of a sequence this worker holds no cache of (never started here, or ended)."""


class KVState:
    """The caches of the sequences a worker is generating, for its stage's :class:`CacheSlot` s.

    Each sequence's cache is kept alone (batch 1, its own length), so that sequences can join and leave
    the steps they share: a step of several stacks their caches, padded to the longest, and splits the
    presents it makes back into each sequence's own.  ``copy``: keep a copy of each present (a runtime
    whose outputs may live in buffers it reuses, like OpenVINO's infer request); onnxruntime returns
    fresh arrays, kept as they are.
    """

    def __init__(self, slots: tuple[CacheSlot, ...], *, copy: bool = False) -> None:
        self.slots = slots
        self.copy = copy
        self.caches: dict[int, dict[str, np.ndarray]] = {}

    def feeds(self, control: Control) -> dict[str, np.ndarray]:
        """The past inputs of this step: its sequences' caches (empty at a start), stacked and padded,
        zeros for a past read for its shape only."""
        for r in control.rows:
            if r.flags & StepFlags.START:
                self.caches[r.sequence] = {s.past: s.empty(1, 0) for s in self.slots if s.present is not None}
        caches = []
        for r in control.rows:
            cache = self.caches.get(r.sequence)
            if cache is None:
                raise NoCache(
                    f"sequence {r.sequence} has no cache here: its first step did not start it, or it ended"
                )
            caches.append(cache)
        length = control.length
        out: dict[str, np.ndarray] = {}
        for s in self.slots:
            if s.present is None:
                out[s.past] = s.empty(len(control.rows), length)
            elif len(caches) == 1:
                out[s.past] = caches[0][s.past]
            else:
                out[s.past] = s.stacked([c[s.past] for c in caches], length, control.side)
        return out

    def keep(self, control: Control, produced: Mapping[str, np.ndarray]) -> None:
        """Keep this step's presents as its sequences' next pasts (or drop them at their end)."""
        alone = len(control.rows) == 1
        length = control.length
        for i, r in enumerate(control.rows):
            if r.flags & StepFlags.END:
                self.caches.pop(r.sequence, None)
                continue
            cache = self.caches[r.sequence]
            for s in self.slots:
                if s.present is None:
                    continue
                value = produced[s.present]
                if not alone:  # the sequence's own row of the step's present
                    grown = value.shape[s.sequence_axis] - length  # the step's new tokens
                    value = s.row(value, i, control.side.span(length, r.cached, grown))
                cache[s.past] = np.array(value, copy=True) if self.copy else value

    def drop(self, control: Control) -> None:
        for r in control.rows:
            self.caches.pop(r.sequence, None)
