"""Micro-batches for ``onnxpipe run``: read from the user's files, or seeded random values.

The files are those ``split`` takes: an ``.npz`` (or a folder of ``.npy`` files) with one array per model
input holds one micro-batch; an ``.npz`` whose arrays are stacked on a new first axis holds several
(``input_ids`` of shape ``[M, 4, 128]`` is M micro-batches of ``[4, 128]``).  Random inputs follow
:func:`onnxpipe.ir.feeds.random_feeds` (valid indices for embeddings, ones for masks) at the shapes the
plan was made for, so that the measured stage times are comparable with the manifest's estimates;
``--shape`` overrides them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from onnxpipe.core.errors import UsageError
from onnxpipe.core.inputfiles import read_input_file
from onnxpipe.core.options import opt
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import MODEL, Manifest
from onnxpipe.runtime.base import Tensors
from onnxpipe.verification.verify import planned_input_shapes

DISTINCT_RANDOM = 16
"""Random micro-batches that are actually different; longer runs cycle through them (memory stays small)."""


def load_inputs(
    files: Sequence[Path], stacked: Sequence[Path], input_types: Mapping[str, str]
) -> list[Tensors]:
    """Micro-batches from the user's files, read as ``split`` reads its samples
    (:mod:`onnxpipe.core.inputfiles`): one micro-batch per file of ``files`` (an ``.npz``, or a folder of
    ``.npy`` files), several along a leading axis in each ``.npz`` of ``stacked``; every model input of
    ``input_types`` by name, no other."""
    batches: list[Tensors] = []
    for path, is_stacked in [*((p, False) for p in files), *((p, True) for p in stacked)]:
        field = "stacked_files" if is_stacked else "input_files"
        _, samples = read_input_file(path, stacked=is_stacked)
        for sample in samples:
            missing = [n for n in input_types if n not in sample]
            if missing:
                raise UsageError(
                    f"{opt(field, path)}: has no array {missing[0]!r}; it needs one per model input "
                    f"({', '.join(input_types)})"
                )
            extra = [n for n in sample if n not in input_types]
            if extra:
                raise UsageError(
                    f"{opt(field, path)}: array {extra[0]!r} is not a model input ({', '.join(input_types)})"
                )
            batches.append({n: np.ascontiguousarray(sample[n]) for n in input_types})
    return batches


def input_shapes_for(
    manifest: Manifest, model: Path | ModelView | None, overrides: Mapping[str, Sequence[int]]
) -> dict[str, tuple[int, ...]]:
    """The shapes random inputs get: the plan's profiled shapes, with ``overrides`` on top.

    The same shapes ``onnxpipe verify`` uses (:func:`onnxpipe.verification.verify.planned_input_shapes`).
    """
    names = [t.name for t in manifest.model_inputs]
    profiled = {n: tuple(v) for n, v in manifest.plan.profiled_input_shapes.items()}
    if not overrides and all(n in profiled for n in names):
        return {n: profiled[n] for n in names}
    if model is None:
        raise UsageError(
            f"the source model is not at hand to size the inputs {opt('shapes')} gives; give the model "
            f"({opt('model')}) or inputs of your own ({opt('input_files', 'FILE.npz')})"
        )
    view = model if isinstance(model, ModelView) else load_model(model, check=False)
    return planned_input_shapes(manifest, view, overrides)


def random_inputs(
    source: Path | ModelView | tuple[Path, Manifest],
    shapes: Mapping[str, Sequence[int]],
    microbatches: int,
    *,
    seed: int = 0,
) -> list[Tensors]:
    """``microbatches`` seeded random micro-batches (cycling through a few distinct ones), made from the
    source model (its file, or its view as split), or, where it is not at hand (a split folder copied
    elsewhere), from the stage files:
    each model input by the first stage that reads it (``source``: the folder and its manifest), whose
    graph says what values it takes (rows of an embedding, a mask)."""
    if microbatches < 1:
        raise UsageError(f"{opt('microbatches', microbatches)}: give at least 1")
    readers: list[tuple[ModelView, list[str] | None]]
    if isinstance(source, tuple):
        readers = [*_readers(source)]
    else:
        readers = [(source if isinstance(source, ModelView) else load_model(source, check=False), None)]
    distinct = [
        {
            k: v
            for view, names in readers
            for k, v in random_feeds(view, shapes, seed + j, names=names).items()
        }
        for j in range(min(microbatches, DISTINCT_RANDOM))
    ]
    return [distinct[j % len(distinct)] for j in range(microbatches)]


def _readers(source: tuple[Path, Manifest]) -> list[tuple[ModelView, list[str]]]:
    """Each stage that reads model inputs no earlier stage reads, loaded, with those inputs."""
    directory, manifest = source
    made: set[str] = set()
    readers: list[tuple[ModelView, list[str]]] = []
    for st in manifest.stages:
        names = [i.name for i in st.inputs if i.source == MODEL and i.name not in made]
        if names:
            readers.append((load_model(directory / st.file, check=False), names))
            made.update(names)
    return readers
