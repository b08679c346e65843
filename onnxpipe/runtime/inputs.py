"""Micro-batches for ``onnxpipe run``: read from an ``.npz`` file, or seeded random values.

An ``.npz`` file holds one array per model input, stacked on a new first axis: ``input_ids`` of shape
``[M, 4, 128]`` is M micro-batches of ``[4, 128]``.  Random inputs follow
:func:`onnxpipe.ir.feeds.random_feeds` (valid indices for embeddings, ones for masks) at the shapes the
plan was made for, so that the measured stage times are comparable with the manifest's estimates;
``--shape`` overrides them.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import Manifest
from onnxpipe.verification.verify import planned_input_shapes

DISTINCT_RANDOM = 16
"""Random micro-batches that are actually different; longer runs cycle through them (memory stays small)."""

Feeds = dict[str, np.ndarray]


def load_npz(path: Path, input_types: Mapping[str, str]) -> list[Feeds]:
    """Micro-batches from ``path``: every model input stacked on axis 0, all with the same count."""
    if not path.is_file():
        raise UsageError(f"{path}: no such file; give an .npz with one array per model input")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise UsageError(f"{path}: not a readable .npz file ({e})") from e
    missing = [n for n in input_types if n not in arrays]
    if missing:
        raise UsageError(
            f"{path}: has no array {missing[0]!r}; it needs one per model input ({', '.join(input_types)}), "
            "stacked on a first axis of micro-batches"
        )
    extra = [n for n in arrays if n not in input_types]
    if extra:
        raise UsageError(f"{path}: array {extra[0]!r} is not a model input ({', '.join(input_types)})")
    counts = {n: a.shape[0] if a.ndim else 0 for n, a in arrays.items()}
    if len(set(counts.values())) != 1 or 0 in counts.values():
        shown = ", ".join(f"{n}: {c}" for n, c in counts.items())
        raise UsageError(f"{path}: every array needs the same number of micro-batches on axis 0, got {shown}")
    count = next(iter(counts.values()))
    return [{n: np.asarray(arrays[n][j], order="C") for n in input_types} for j in range(count)]


def input_shapes_for(
    manifest: Manifest, model: Path | None, overrides: Mapping[str, Sequence[int]]
) -> dict[str, tuple[int, ...]]:
    """The shapes random inputs get: the plan's profiled shapes, with ``overrides`` on top.

    The same shapes ``onnxpipe verify`` uses (:func:`onnxpipe.verification.verify.planned_input_shapes`).
    """
    names = [t.name for t in manifest.model_inputs]
    profiled = {n: tuple(v) for n, v in manifest.plan.profiled_input_shapes.items()}
    if not overrides and all(n in profiled for n in names):
        return {n: profiled[n] for n in names}
    if model is None:
        raise UsageError(f"no source model to derive input shapes from; give {opt('inputs', 'FILE.npz')}")
    return planned_input_shapes(manifest, load_model(model, check=False), overrides)


def random_inputs(
    model: Path, shapes: Mapping[str, Sequence[int]], microbatches: int, *, seed: int = 0
) -> list[Feeds]:
    """``microbatches`` seeded random micro-batches for ``model`` (cycling through a few distinct ones)."""
    if microbatches < 1:
        raise UsageError(f"{opt('microbatches', microbatches)}: give at least 1")
    view = load_model(model, check=False)
    distinct = [random_feeds(view, shapes, seed=seed + j) for j in range(min(microbatches, DISTINCT_RANDOM))]
    return [distinct[j % len(distinct)] for j in range(microbatches)]
