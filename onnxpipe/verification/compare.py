"""One model output of the chained stages against the original's: the tolerance rule and its report.

An output matches when dtype and shape are equal and::

    max|a - b| <= atol + rtol * max|a|        (a: the original's output, b: the chained stages')

The tolerance is relative to the output's scale, not element by element: a stage and the whole model
may fuse differently at ``ORT_ENABLE_ALL`` and differ in the last bits, which matters little next to
the largest value and a lot next to a value near zero.  NaN equals NaN; an infinity equals the same
infinity.  Plain numpy: ``run --compare`` checks the pipeline's outputs by the same rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class OutputComparison:
    """How one model output of the chained stages compares with the original's.

    ``max_rel_diff`` is ``max|a-b| / max|a|`` (the quantity the tolerance bounds); ``max_abs_expected``
    is ``max|a|`` over the original's finite values.  With unequal shapes the diffs are ``inf``.
    """

    name: str
    expected_dtype: str
    actual_dtype: str
    expected_shape: tuple[int, ...]
    actual_shape: tuple[int, ...]
    max_abs_diff: float
    max_rel_diff: float
    max_abs_expected: float
    allclose: bool
    rtol: float = 0.0
    atol: float = 0.0
    """The tolerance it was held to."""

    @property
    def shape_equal(self) -> bool:
        return self.expected_shape == self.actual_shape

    @property
    def dtype_equal(self) -> bool:
        return self.expected_dtype == self.actual_dtype

    @property
    def ok(self) -> bool:
        return self.allclose and self.shape_equal and self.dtype_equal

    @property
    def diffs(self) -> str:
        """``max abs diff 0.124, max rel diff 0.13`` (and the shape or dtype that differs)."""
        parts = [f"max abs diff {self.max_abs_diff:.3g}", f"max rel diff {self.max_rel_diff:.3g}"]
        if not self.shape_equal:
            parts.append(f"shape {list(self.actual_shape)} != {list(self.expected_shape)}")
        if not self.dtype_equal:
            parts.append(f"dtype {self.actual_dtype} != {self.expected_dtype}")
        return ", ".join(parts)

    def describe(self) -> str:
        """One line: name, verdict, and what differs."""
        return f"{self.name}: {'ok' if self.ok else 'MISMATCH'} ({self.diffs})"


def compare(
    name: str, expected: np.ndarray, actual: np.ndarray, *, rtol: float, atol: float
) -> OutputComparison:
    """Compare one output: ``max|a-b| <= atol + rtol * max|a|``, NaN equal to NaN.

    Sequences of maps (``ZipMap``) are compared as a matrix of their values when both sides have the
    same keys; other non-numeric values (strings, ragged sequences) must be equal exactly.
    """

    def result(max_abs: float, scale: float) -> OutputComparison:
        rel = 0.0 if max_abs == 0.0 else max_abs / scale if scale > 0.0 else math.inf
        return OutputComparison(
            name=name,
            expected_dtype=str(expected.dtype),
            actual_dtype=str(actual.dtype),
            expected_shape=tuple(int(d) for d in expected.shape),
            actual_shape=tuple(int(d) for d in actual.shape),
            max_abs_diff=max_abs,
            max_rel_diff=rel,
            max_abs_expected=scale,
            allclose=max_abs <= atol + rtol * scale,
            rtol=rtol,
            atol=atol,
        )

    if expected.shape != actual.shape:
        return result(math.inf, 0.0)
    if expected.size == 0:
        return result(0.0, 0.0)
    a, b = expected, actual
    if not _numeric(a) or not _numeric(b):
        ma, mb = _maps_as_matrix(a), _maps_as_matrix(b)
        if ma is None or mb is None or ma[0] != mb[0]:
            return result(0.0 if _same(a, b) else math.inf, 0.0)
        a, b = ma[1], mb[1]
    return result(*_max_diff(a, b))


def _max_diff(expected: np.ndarray, actual: np.ndarray) -> tuple[float, float]:
    """``max|a-b|`` (NaN = NaN, inf = inf, NaN against a number is inf) and ``max|a|`` over finite a."""
    wide = np.complex128 if "c" in (expected.dtype.kind, actual.dtype.kind) else np.float64
    a = expected.astype(wide)
    b = actual.astype(wide)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a - b)
    diff = np.where(same, 0.0, diff)
    diff = np.where(np.isnan(diff), np.inf, diff)
    finite = np.abs(a[np.isfinite(a)])
    return float(diff.max()), float(finite.max()) if finite.size else 0.0


def _numeric(x: np.ndarray) -> bool:
    return x.dtype.kind in "biufc" or x.dtype.name == "bfloat16" or x.dtype.name.startswith("float8")


def _maps_as_matrix(x: np.ndarray) -> tuple[tuple[object, ...], np.ndarray] | None:
    """A 1-D array of dicts with the same keys and numeric values -> (keys, values matrix)."""
    if x.dtype != object or x.ndim != 1 or not all(isinstance(v, dict) for v in x):
        return None
    keys = tuple(sorted(x[0]))
    if any(tuple(sorted(v)) != keys for v in x):
        return None
    try:
        return keys, np.array([[float(v[k]) for k in keys] for v in x], dtype=np.float64)
    except (TypeError, ValueError):
        return None


def _same(a: object, b: object) -> bool:
    """Exact equality of nested arrays, lists and dicts (NaN equal to NaN)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        x, y = np.asarray(a), np.asarray(b)
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if x.dtype == object:
            return all(_same(p, q) for p, q in zip(x.ravel(), y.ravel(), strict=True))
        return bool(np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(p, q) for p, q in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def merge(a: OutputComparison, b: OutputComparison) -> OutputComparison:
    """Worst of two runs: the first failing run's shapes and dtypes, the largest diffs."""
    first = a if (not a.ok or b.ok) else b
    return replace(
        first,
        max_abs_diff=max(a.max_abs_diff, b.max_abs_diff),
        max_rel_diff=max(a.max_rel_diff, b.max_rel_diff),
        max_abs_expected=max(a.max_abs_expected, b.max_abs_expected),
        allclose=a.allclose and b.allclose,
    )
