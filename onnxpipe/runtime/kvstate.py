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
from enum import IntFlag

import numpy as np

CONTROL = "onnxpipe::generation"
"""The control tensor's name: int64 ``[sequence id, flags, cached tokens, batch]`` (no exporter writes
``::`` in a tensor name)."""


class StepFlags(IntFlag):
    """What a step does to its sequence's cache, besides running."""

    NONE = 0
    START = 1
    """A new sequence: its cache starts empty (a previous sequence of the same id is dropped)."""
    END = 2
    """The sequence's last step: its cache is dropped once the step ran."""
    DROP = 4
    """Run nothing: drop the sequence's cache (a sequence that stopped early, at its end token)."""


@dataclass(frozen=True)
class CacheSlot:
    """One past input of a stage and the present output that becomes it at the next step.

    ``shape``: the past tensor's dims, each an int, or ``None`` for the batch or the cached tokens (the
    symbolic one at ``sequence_axis``, counted from the end).  ``present`` is None for a past read for
    its shape only (fed zeros)."""

    past: str
    present: str | None
    dtype: str
    shape: tuple[int | None, ...]
    sequence_axis: int = -2

    def empty(self, batch: int, cached: int) -> np.ndarray:
        """Zeros of this past's shape for ``batch`` sequences of ``cached`` tokens."""
        rank = len(self.shape)
        seq = rank + self.sequence_axis
        dims = [cached if i == seq else (batch if d is None else d) for i, d in enumerate(self.shape)]
        return np.zeros(dims, dtype=np.dtype(self.dtype))


@dataclass(frozen=True)
class Control:
    """The control tensor of one step, read."""

    sequence: int
    flags: StepFlags
    cached: int
    batch: int

    @staticmethod
    def read(value: np.ndarray) -> Control:
        v = np.asarray(value).reshape(-1)
        if v.shape[0] != 4:
            raise ValueError(f"{CONTROL} must hold 4 integers, got shape {tuple(np.shape(value))}")
        return Control(int(v[0]), StepFlags(int(v[1])), int(v[2]), int(v[3]))

    def tensor(self) -> np.ndarray:
        return np.array([self.sequence, int(self.flags), self.cached, self.batch], dtype=np.int64)


class KVState:
    """The caches of the sequences a worker is generating, for its stage's :class:`CacheSlot` s.

    ``copy``: keep a copy of each present (a runtime whose outputs may live in buffers it reuses, like
    OpenVINO's infer request); onnxruntime returns fresh arrays, kept as they are.
    """

    def __init__(self, slots: tuple[CacheSlot, ...], *, copy: bool = False) -> None:
        self.slots = slots
        self.copy = copy
        self.caches: dict[int, dict[str, np.ndarray]] = {}

    def feeds(self, control: Control) -> dict[str, np.ndarray]:
        """The past inputs of this step: the sequence's cache (empty at its start), zeros for a past read
        for its shape only."""
        if control.flags & StepFlags.START:
            self.caches[control.sequence] = {
                s.past: s.empty(control.batch, 0) for s in self.slots if s.present is not None
            }
        cache = self.caches.get(control.sequence)
        if cache is None:
            raise KeyError(
                f"sequence {control.sequence} has no cache here: its first step did not start it, or it ended"
            )
        out: dict[str, np.ndarray] = {}
        for s in self.slots:
            if s.present is None:
                out[s.past] = s.empty(control.batch, control.cached)
            else:
                out[s.past] = cache[s.past]
        return out

    def keep(self, control: Control, produced: Mapping[str, np.ndarray]) -> None:
        """Keep this step's presents as the sequence's next pasts (or drop them at its end)."""
        if control.flags & StepFlags.END:
            self.caches.pop(control.sequence, None)
            return
        cache = self.caches[control.sequence]
        for s in self.slots:
            if s.present is not None:
                value = produced[s.present]
                cache[s.past] = np.array(value, copy=True) if self.copy else value

    def drop(self, control: Control) -> None:
        self.caches.pop(control.sequence, None)

    def cached_bytes(self) -> int:
        """Bytes of every cache held now."""
        return sum(a.nbytes for cache in self.caches.values() for a in cache.values())
