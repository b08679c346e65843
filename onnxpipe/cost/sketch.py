"""Tensors reduced to small prints (size, norms, CountSketches) that tell equal values apart cheaply."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

VALUE_TOLERANCE = 1e-3
"""Relative L2 distance under which two tensors count as the same value."""
CENTRED_TOLERANCE = 0.1
"""The same, for the values minus their mean (looser: rounding is large next to a tiny spread)."""
SKETCH_SIZE = 64
Entry = TypeVar("Entry", bound=tuple[Any, ...])


def near_norm(entries: Sequence[Entry], norm: float) -> Sequence[Entry]:
    """The entries (sorted by their first item, a norm) whose norm is within :data:`VALUE_TOLERANCE` of
    ``norm``: the only tensors whose values can match."""
    lo = bisect.bisect_left(entries, norm * (1 - VALUE_TOLERANCE), key=lambda e: e[0])
    return entries[lo : bisect.bisect_right(entries, norm * (1 + VALUE_TOLERANCE), key=lambda e: e[0])]


@dataclass(frozen=True)
class Print:
    """A tensor reduced to its element count, L2 norms (raw and with the mean removed) and CountSketches
    of its values (raw and centred).  Comparing centred values too keeps nearly constant tensors (deep
    layers of degenerate weights) from matching anything of the same mean."""

    size: int
    norm: float
    sketch: np.ndarray
    centred_norm: float
    centred_sketch: np.ndarray

    def distance(self, other: Print) -> float:
        """Relative L2 distance of the raw values (estimated from the sketches)."""
        scale = max(self.norm, other.norm)
        if abs(self.norm - other.norm) > VALUE_TOLERANCE * scale:
            return math.inf
        return float(np.linalg.norm(self.sketch - other.sketch)) / scale

    def same(self, other: Print, tolerance: float = VALUE_TOLERANCE) -> bool:
        if self.size != other.size or self.distance(other) >= tolerance:
            return False
        scale = max(self.centred_norm, other.centred_norm)
        return float(np.linalg.norm(self.centred_sketch - other.centred_sketch)) < CENTRED_TOLERANCE * scale


class Sketcher:
    """Same-size tensors share hash and sign vectors, so their sketches are comparable."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._cached = 0

    def _vectors(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        hit = self._cache.get(n)
        if hit is None:
            if self._cached + n > 64_000_000:
                self._cache.clear()
                self._cached = 0
            rng = np.random.default_rng(n)
            h = rng.integers(0, SKETCH_SIZE, n, dtype=np.uint8)
            s = rng.integers(0, 2, n, dtype=np.int8) * 2 - 1
            ones = np.bincount(h, weights=s, minlength=SKETCH_SIZE)
            hit = (h, s, ones)
            self._cache[n] = hit
            self._cached += n
        return hit

    def sketch(self, arr: np.ndarray, wanted: Callable[[int, float], bool] | None = None) -> Print | None:
        """The tensor's print; ``None`` for non-float, non-finite or constant tensors, and when
        ``wanted(size, norm)`` says no original tensor could match (saving the sketch)."""
        if arr.dtype.kind != "f" or arr.size < 2:
            return None
        x = np.ascontiguousarray(arr, dtype=np.float64).reshape(-1)
        sq = float(np.add.reduce(x * x))  # not np.dot: BLAS threads crawl on a busy machine
        if not math.isfinite(sq) or sq == 0.0:
            return None
        norm = math.sqrt(sq)
        if wanted is not None and not wanted(x.size, norm):
            return None
        mean = float(x.sum()) / x.size
        centred = x - mean
        centred_norm = math.sqrt(float(np.add.reduce(centred * centred)))
        if centred_norm <= 1e-12 * norm:
            return None  # every element equal: cannot be told apart
        h, s, ones = self._vectors(x.size)
        sk = np.bincount(h, weights=x * s, minlength=SKETCH_SIZE)
        return Print(int(x.size), norm, sk, centred_norm, sk - mean * ones)
