"""``--stages auto`` in the file's order: which devices to keep, leaving out those that slow the pipeline.

A plan of ``k`` stages in the file's order used to run on the first ``k`` devices, so a slow device early
in the file was in every plan of more stages than its position: its share of the work, or the hop into
it, bounded the pipeline below what the others reach without it (users of exo and llama.cpp report
that adding a slower machine made everything slower; prima.cpp drops such devices).  Here each stage
count tries every choice of ``k`` devices that keeps their file order and best scores wins (ties: the
choice that comes first, so identical devices stay the first ones).  Sets of devices of the same types
over the same links score the same and are solved once: ``n`` identical devices cost ``n`` solves, a
slow one among them about ``n^2 / 2``.  Beyond :data:`MAX_SETS` distinct sets (many devices of many
types) a backward elimination stands in: from the whole file, drop the device whose absence scores best,
again and again, and per count keep the better of that set and the first ``k`` devices, so no plan gets
worse than the prefix it replaces.  Leaving a device out from inside the file needs the one link every
pair shares (a list of links joins consecutive devices only: then only the ends of a run can go).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Generic

from onnxpipe.cluster.model import Cluster
from onnxpipe.core.choices import Objective
from onnxpipe.core.errors import PartitionError
from onnxpipe.core.options import opt
from onnxpipe.planning.orders import SCORE_TIE_RTOL, OrderSearch, P, score, type_ids

MAX_SETS = 256
"""Most distinct device sets ``--stages auto`` solves, over all stage counts, to choose exactly."""


def joined(cluster: Cluster, kept: Sequence[int]) -> Cluster | None:
    """The devices at ``kept`` (ascending file indices) as a pipeline, or None when no link joins them."""
    i, j = kept[0], kept[-1]
    if list(kept) == list(range(i, j + 1)):
        return Cluster(cluster.devices[i : j + 1], cluster.links[i:j], cluster.source)
    return cluster.arranged(kept) if cluster.uniform_link is not None else None


class KeptDevices(Generic[P]):
    """For each stage count, the devices in file order whose plan scores best (see the module's text)."""

    def __init__(self, cluster: Cluster, solve: Callable[[Cluster], P], objective: Objective) -> None:
        self.cluster, self.solve, self.objective = cluster, solve, objective
        self.types = type_ids(cluster)
        self.solved: dict[tuple[object, ...], P | PartitionError] = {}
        self.chain: dict[int, tuple[int, ...]] | None = None
        n = cluster.size
        every = (c for k in range(1, n + 1) for c in itertools.combinations(range(n), k))
        self.exact = n <= 16 and len({self._key(c) for c in every} - {None}) <= MAX_SETS

    def _key(self, kept: tuple[int, ...]) -> tuple[object, ...] | None:
        """What the plan on ``kept`` depends on: the devices' types and the links between them (None:
        no link joins them)."""
        i, j = kept[0], kept[-1]
        link = self.cluster.uniform_link
        if kept == tuple(range(i, j + 1)):
            links = self.cluster.links[i:j]
        elif link is not None:
            links = (link,) * (len(kept) - 1)
        else:
            return None
        return (tuple(self.types[x] for x in kept), links)

    def result(self, kept: Sequence[int]) -> P:
        """The plan on the devices ``kept``; :class:`PartitionError` when nothing fits or no link joins
        them."""
        arranged, key = joined(self.cluster, kept), self._key(tuple(kept))
        if arranged is None or key is None:
            raise PartitionError(f"{self.cluster.label}: no link joins devices {list(kept)}")
        if key not in self.solved:
            try:
                self.solved[key] = self.solve(arranged)
            except PartitionError as e:
                self.solved[key] = e
        found = self.solved[key]
        if isinstance(found, PartitionError):
            raise found
        return found

    def score_of(self, kept: Sequence[int]) -> float:
        """The objective's score of the plan on ``kept``, ``inf`` when there is none."""
        try:
            return score(self.result(kept), self.objective)
        except PartitionError:
            return math.inf

    def _eliminated(self) -> dict[int, tuple[int, ...]]:
        """The backward elimination: the devices left at each count, from the whole file down to one."""
        current = tuple(range(self.cluster.size))
        chain = {len(current): current}
        while len(current) > 1:
            best: tuple[float, tuple[int, ...]] | None = None
            for d in reversed(current):  # the last device first: it goes on a tie
                kept = tuple(i for i in current if i != d)
                if joined(self.cluster, kept) is None:
                    continue
                s = self.score_of(kept)
                if best is None or s < best[0] * (1 - SCORE_TIE_RTOL):
                    best = (s, kept)
            assert best is not None  # dropping the last device always leaves a joined run
            current = best[1]
            chain[len(current)] = current
        return chain

    def search(self, k: int) -> OrderSearch[P]:
        """The ``k`` devices to plan on (:class:`PartitionError` when none fits)."""
        if self.exact:  # the first choice of each distinct set, in file order: the first k devices first
            first: dict[tuple[object, ...], tuple[int, ...]] = {}
            for c in itertools.combinations(range(self.cluster.size), k):
                key = self._key(c)
                if key is not None:
                    first.setdefault(key, c)
            candidates = list(first.values())
        else:
            if self.chain is None:
                self.chain = self._eliminated()
            candidates = [tuple(range(k)), self.chain[k]]
        kept = candidates[0]
        for c in candidates[1:]:
            if self.score_of(c) < self.score_of(kept) * (1 - SCORE_TIE_RTOL):
                kept = c
        arranged = joined(self.cluster, kept)
        assert arranged is not None
        return OrderSearch(kept, arranged, self.result(kept), len(candidates), free=False)

    def notes(self, chosen: OrderSearch[P]) -> list[str]:
        """A note for each device left out whose return would make the chosen plan worse, with the figures
        with and without it."""
        notes: list[str] = []
        without = score(chosen.result, self.objective)
        for d in range(self.cluster.size):
            if d in chosen.order:
                continue
            kept = tuple(sorted((*chosen.order, d)))
            if joined(self.cluster, kept) is None:
                continue
            worse = self.score_of(kept)
            if not without < worse < math.inf:  # it helps, or nothing fits with it: not a slower pipeline
                continue
            name = self.cluster.devices[d].name
            slower = "a request slower" if self.objective == Objective.LATENCY else "the pipeline slower"
            notes.append(
                f"{opt('stages', 'auto')} left out {name}, which makes {slower}: "
                f"{self._figure(without)} without it, {self._figure(worse)} with it"
            )
        return notes

    def _figure(self, value: float) -> str:
        if self.objective == Objective.LATENCY:
            return f"{value * 1e3:.3f} ms per request alone"
        return f"{1.0 / value:.1f} micro-batches/s" if value > 0 else "no time per micro-batch"
