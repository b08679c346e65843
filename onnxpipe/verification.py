"""Check that a split folder's chained stages compute what the original model computes.

Both run in onnxruntime (CPU, the default optimization level) on the same seeded random inputs
(:func:`onnxpipe.feeds.random_feeds`) at the shapes the plan was made for (the manifest's
``plan.profiled_input_shapes``, which ``split`` and ``run`` use too), with any ``shapes`` given layered on
top (:func:`planned_input_shapes`), and every model output is compared.  An output matches when dtype
and shape are equal and::

    max|a - b| <= atol + rtol * max|a|        (a: the original's output, b: the chained stages')

The tolerance is relative to the output's scale, not element by element: a stage and the whole model
may fuse differently at ``ORT_ENABLE_ALL`` and differ in the last bits, which matters little next to
the largest value and a lot next to a value near zero.  NaN equals NaN; an infinity equals the same
infinity.  A mismatch is not an exception: the report says ``ok=False`` and the CLI exits with 1.

The original model is the one the manifest records (its ``source.path``, relative to the folder) unless
``model_path`` names another copy; either way its sha256 must be the manifest's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from onnxpipe.core.errors import ManifestError, UsageError, VerificationError, error_line
from onnxpipe.core.files import file_sha256
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.model import ModelView, load_model
from onnxpipe.ir.shapes import resolve_input_shapes, symbol_sizes
from onnxpipe.manifest import MANIFEST_NAME, Manifest, load_manifest
from onnxpipe.runner import run_stage_by_stage

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5


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

    @property
    def shape_equal(self) -> bool:
        return self.expected_shape == self.actual_shape

    @property
    def dtype_equal(self) -> bool:
        return self.expected_dtype == self.actual_dtype

    @property
    def ok(self) -> bool:
        return self.allclose and self.shape_equal and self.dtype_equal

    def describe(self) -> str:
        """One line: name, verdict, and what differs."""
        status = "ok" if self.ok else "MISMATCH"
        parts = [f"max abs diff {self.max_abs_diff:.3g}", f"max rel diff {self.max_rel_diff:.3g}"]
        if not self.shape_equal:
            parts.append(f"shape {list(self.actual_shape)} != {list(self.expected_shape)}")
        if not self.dtype_equal:
            parts.append(f"dtype {self.actual_dtype} != {self.expected_dtype}")
        return f"{self.name}: {status} ({', '.join(parts)})"


@dataclass(frozen=True)
class VerifyReport:
    """Per-output comparisons over ``runs`` random input sets (seeds ``seed .. seed+runs-1``)."""

    outputs: tuple[OutputComparison, ...]
    rtol: float
    atol: float
    seed: int
    runs: int
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    model_path: Path | None = None

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    @property
    def tolerance(self) -> str:
        return f"|a-b| <= {self.atol:g} + {self.rtol:g}*max|a|"

    def summary(self) -> str:
        """Print-friendly lines: one per output, then the verdict."""
        lines = [f"  {o.describe()}" for o in self.outputs]
        verdict = "match" if self.ok else "DO NOT match"
        lines.append(
            f"verify: {len(self.outputs)} output(s) {verdict} the original over {self.runs} run(s) "
            f"(tolerance: {self.tolerance})"
        )
        return "\n".join(lines)

    def raise_for_mismatch(self) -> None:
        """Raise :class:`VerificationError` naming the first output that does not match."""
        bad = [o for o in self.outputs if not o.ok]
        if bad:
            raise VerificationError(
                f"output {bad[0].describe()}; {len(bad)} of {len(self.outputs)} outputs differ "
                f"(tolerance {self.tolerance})"
            )


def verify(
    out_dir: str | Path,
    *,
    model_path: str | Path | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    runs: int = 1,
    threads: int = 1,
) -> VerifyReport:
    """Run the original model and the chained stages of ``out_dir`` on the same inputs and compare.

    Raises :class:`ManifestError` for a bad manifest, changed stage files, or a model whose sha256 is
    not the manifest's source; never for a mismatch (see :attr:`VerifyReport.ok`).
    """
    if runs < 1:
        raise UsageError(f"runs {runs}: give a positive number of runs")
    if rtol < 0 or atol < 0 or math.isnan(rtol) or math.isnan(atol):
        raise UsageError(f"--rtol {rtol} --atol {atol}: tolerances must be numbers >= 0")
    d = Path(out_dir)
    manifest = load_manifest(d, check_files=True)
    model = source_model_path(d, manifest, model_path)
    sha = file_sha256(model)
    if sha != manifest.source.sha256:
        raise ManifestError(
            f"{model}: sha256 {sha} is not the source sha256 {manifest.source.sha256} recorded in "
            f"{d / MANIFEST_NAME}; pass the model that was split (--model) or re-run onnxpipe split"
        )
    view = load_model(model, check=False)
    input_shapes = planned_input_shapes(manifest, view, shapes)
    names = [o.name for o in manifest.model_outputs]

    # the original first, then the stages one at a time: never two of them in memory at once
    all_feeds = [random_feeds(view, input_shapes, seed + r) for r in range(runs)]
    expected = _run_original(model, names, all_feeds, threads, input_shapes)
    merged: dict[str, OutputComparison] = {}
    staged = run_stage_by_stage(d, all_feeds, threads=threads, check_files=False)
    for actual, want in zip(staged, expected, strict=True):
        for n in names:
            c = compare(n, want[n], _as_array(actual[n]), rtol=rtol, atol=atol)
            merged[n] = _merge(merged[n], c) if n in merged else c
    return VerifyReport(
        outputs=tuple(merged[n] for n in names),
        rtol=rtol,
        atol=atol,
        seed=seed,
        runs=runs,
        input_shapes=input_shapes,
        model_path=model,
    )


def planned_input_shapes(
    manifest: Manifest, view: ModelView, overrides: Mapping[str, Sequence[int]] | None = None
) -> dict[str, tuple[int, ...]]:
    """The shapes the plan was made for (``plan.profiled_input_shapes``), with ``overrides`` on top.

    A size an override gives a symbolic dim (``batch``, ``seq``) reaches every other input that names
    it, so the inputs stay consistent; an input the manifest records no shape for gets the defaults of
    :func:`onnxpipe.feeds.resolve_input_shapes`.  ``view`` is the source model.
    """
    given = {n: tuple(int(d) for d in v) for n, v in (overrides or {}).items()}
    inputs = set(view.inputs)
    symbols = symbol_sizes(view, {n: v for n, v in given.items() if n in inputs})
    merged = dict(given)
    for name, dims in manifest.plan.profiled_input_shapes.items():
        if name in given or name not in inputs:
            continue
        planned = tuple(int(d) for d in dims)
        declared = view.tensor(name).shape
        if declared is not None and len(declared) == len(planned):
            planned = tuple(
                symbols.get(d, v) if isinstance(d, str) else v for d, v in zip(declared, planned, strict=True)
            )
        merged[name] = planned
    return resolve_input_shapes(view, merged)


def _run_original(
    model: Path,
    names: Sequence[str],
    all_feeds: Sequence[Mapping[str, np.ndarray]],
    threads: int,
    input_shapes: Mapping[str, tuple[int, ...]],
) -> list[dict[str, np.ndarray]]:
    session = open_session(model, session_options(threads=threads))
    results: list[dict[str, np.ndarray]] = []
    for feeds in all_feeds:
        try:
            values = session.run(list(names), dict(feeds))
        except Exception as e:
            shown = ", ".join(f"{n}={list(v)}" for n, v in input_shapes.items())
            raise UsageError(
                f"{model}: the model itself fails on random inputs of shapes {shown} "
                f"({error_line(e)}); give working shapes with --shape NAME=D1,D2,..."
            ) from e
        results.append({n: _as_array(v) for n, v in zip(names, values, strict=True)})
    return results


def _as_array(value: object) -> np.ndarray:
    """A tensor as is; a sequence (of maps, of tensors of unequal shapes) as a 1-D object array."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, list):
        try:
            stacked = np.asarray(value)
            if stacked.dtype != object:
                return stacked
        except ValueError:
            pass
        out = np.empty(len(value), dtype=object)
        for i, v in enumerate(value):
            out[i] = v
        return out
    return np.asarray(value)


def source_model_path(directory: Path, manifest: Manifest, model_path: str | Path | None) -> Path:
    """``model_path`` if given, else the manifest's ``source.path`` resolved against ``directory``."""
    if model_path is not None:
        p = Path(model_path)
        if not p.is_file():
            raise UsageError(f"{p}: no such model file; give the model that was split")
        return p
    if manifest.source.path is None:
        raise UsageError(
            f"{directory / MANIFEST_NAME}: records no path for the source model {manifest.source.file}; "
            "pass it with --model"
        )
    p = directory / manifest.source.path  # an absolute recorded path stays absolute
    if not p.is_file():
        raise UsageError(
            f"{p}: the source model recorded in {directory / MANIFEST_NAME} is not there; "
            "pass its path with --model"
        )
    return p


def compare(
    name: str, expected: np.ndarray, actual: np.ndarray, *, rtol: float, atol: float
) -> OutputComparison:
    """Compare one output: ``max|a-b| <= atol + rtol * max|a|``, NaN equal to NaN.

    Sequences of maps (``ZipMap``) are compared as a matrix of their values when both sides have the
    same keys; other non-numeric values (strings, ragged sequences) must be equal exactly.
    """

    def result(max_abs: float, scale: float) -> OutputComparison:
        if max_abs == 0.0:
            rel = 0.0
        elif scale > 0.0:
            rel = max_abs / scale
        else:
            rel = math.inf
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


def _merge(a: OutputComparison, b: OutputComparison) -> OutputComparison:
    """Worst of two runs: the first failing run's shapes and dtypes, the largest diffs."""
    first = a if (not a.ok or b.ok) else b
    return replace(
        first,
        max_abs_diff=max(a.max_abs_diff, b.max_abs_diff),
        max_rel_diff=max(a.max_rel_diff, b.max_rel_diff),
        max_abs_expected=max(a.max_abs_expected, b.max_abs_expected),
        allclose=a.allclose and b.allclose,
    )
