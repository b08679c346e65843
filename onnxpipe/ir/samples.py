"""The user's sample inputs (``--inputs``), checked against the model: what profiles, calibration,
export and verification run on instead of random values.

Why: a model whose control flow depends on its inputs' values (an ``If`` on a sample rate) runs only
with real inputs, and real inputs give the costs and the verification that matter.  Every mistake is
one line naming the file, the input and what the model expects: a missing input, an extra name, a
wrong element type, a wrong rank, a dim the model fixes, one symbolic dim at two sizes, samples of
different shapes.

:func:`load_samples` reads files (:mod:`onnxpipe.core.inputfiles`); :func:`samples_from_feeds` takes
arrays already in memory (the API, the conformance cases).  All samples of one run share their
shapes: a profile's costs and a plan's bytes hold for one set of shapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnxpipe.core.errors import UsageError
from onnxpipe.core.inputfiles import InputRecord, read_input_file
from onnxpipe.core.options import opt
from onnxpipe.ir.model import ModelView, dims_text, dtype_name, np_dtype


@dataclass(frozen=True)
class Samples:
    """Checked sample inputs: every model input in each sample, all samples at one set of shapes."""

    feeds: tuple[Mapping[str, Any], ...]
    """The samples: an array per model input (a list for a sequence input), by name."""
    records: tuple[InputRecord, ...]
    """Where they came from (file name, sha256, shapes): what the manifest keeps."""

    def __post_init__(self) -> None:
        """All samples of one run share their shapes: a profile's costs and a plan's bytes hold for one."""
        first = self.shapes
        for i, sample in enumerate(self.feeds[1:], start=1):
            for name, value in sample.items():
                if isinstance(value, np.ndarray) and tuple(value.shape) != first.get(name):
                    raise UsageError(
                        f"{opt('input_files')}: sample {i} gives input {name!r} shape {list(value.shape)}, "
                        "sample 0 gives "
                        f"{list(first.get(name, ()))}; the samples of one run must share their shapes"
                    )

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The tensor inputs' shapes (those of every sample)."""
        return {
            n: tuple(int(d) for d in v.shape) for n, v in self.feeds[0].items() if isinstance(v, np.ndarray)
        }

    @property
    def first(self) -> dict[str, Any]:
        """The first sample: what a single run (a boundary probe, a stage timing) is fed."""
        return dict(self.feeds[0])

    def describe(self) -> str:
        """``a.npz, b.npz (3 samples)``: for messages and notes."""
        files = ", ".join(r.file for r in self.records)
        return f"{files} ({len(self.feeds)} sample{'s' if len(self.feeds) != 1 else ''})"


def load_samples(
    view: ModelView, paths: Sequence[str | Path], *, stacked: Sequence[str | Path] = ()
) -> Samples:
    """Read ``paths`` (one sample each) and ``stacked`` (``.npz`` files with a leading sample axis) and
    check every sample against ``view`` (see the module docstring)."""
    feeds: list[Mapping[str, Any]] = []
    records: list[InputRecord] = []
    for path, is_stacked in [*((p, False) for p in paths), *((p, True) for p in stacked)]:
        record, samples = read_input_file(path, stacked=is_stacked)
        field = "stacked_files" if is_stacked else "input_files"
        for i, sample in enumerate(samples):
            where = opt(field, path) + (f" (sample {i})" if is_stacked else "")
            check_feeds(view, sample, where)
        records.append(record)
        feeds.extend(samples)
    if not feeds:
        raise UsageError(f"{opt('input_files')}: no file given; give an .npz file or a folder of .npy files")
    return Samples(tuple(feeds), tuple(records))


def samples_from_feeds(view: ModelView, feeds: Sequence[Mapping[str, Any]], label: str = "inputs") -> Samples:
    """Samples given as arrays in memory (checked like files); the record names them ``label``."""
    if not feeds:
        raise UsageError(f"{label}: no sample given")
    for i, sample in enumerate(feeds):
        check_feeds(view, sample, f"{label} (sample {i})" if len(feeds) > 1 else label)
    shapes = {n: tuple(int(d) for d in np.shape(v)) for n, v in feeds[0].items() if isinstance(v, np.ndarray)}
    return Samples(tuple(dict(f) for f in feeds), (InputRecord(label, "", shapes, len(feeds)),))


def check_feeds(view: ModelView, feeds: Mapping[str, Any], where: str) -> None:
    """Refuse ``feeds`` unless they give every input of ``view``, and only those, at its element type
    and rank, with the dims the model fixes, and each symbolic dim at one size."""
    inputs = list(view.inputs)
    extra = [n for n in feeds if n not in inputs]
    if extra:
        raise UsageError(
            f"{where}: {extra[0]!r} is not an input of the model; "
            f"its inputs are {', '.join(inputs) or '(none)'}"
        )
    kinds = {vi.name: vi.type for vi in view.proto.graph.input}
    symbols: dict[str, tuple[str, int, int]] = {}
    for name in inputs:
        expects = expected_text(view, name)
        if name not in feeds:
            raise UsageError(
                f"{where}: no array for model input {name!r}, which the model expects as {expects}"
            )
        value = feeds[name]
        kind = kinds[name].WhichOneof("value") if name in kinds else "tensor_type"
        if kind != "tensor_type":
            if kind == "sequence_type" and not isinstance(value, list):
                raise UsageError(
                    f"{where}: input {name!r} must be a list (a sequence), the model expects {expects}"
                )
            continue
        if not isinstance(value, np.ndarray):
            raise UsageError(f"{where}: input {name!r} is not an array; the model expects {expects}")
        info = view.tensor(name)
        want = np_dtype(info.elem_type)
        if want is not None and value.dtype != want:
            raise UsageError(
                f"{where}: input {name!r} is {value.dtype}, the model expects {expects}; save it as {want}"
            )
        shape = info.shape
        if shape is None:
            continue
        if value.ndim != len(shape):
            raise UsageError(
                f"{where}: input {name!r} has rank {value.ndim} (shape {list(value.shape)}), "
                f"the model expects rank {len(shape)}: {expects}"
            )
        for axis, (declared, size) in enumerate(zip(shape, value.shape, strict=True)):
            if isinstance(declared, int) and declared > 0 and declared != size:
                raise UsageError(
                    f"{where}: dim {axis} of input {name!r} is {size}, "
                    f"the model fixes it at {declared}: {expects}"
                )
            if isinstance(declared, str):
                seen = symbols.setdefault(declared, (name, axis, int(size)))
                if seen[2] != size:
                    raise UsageError(
                        f"{where}: dim {axis} of input {name!r} ({declared}) is {size}, but dim {seen[1]} of "
                        f"input {seen[0]!r} ({declared}) is {seen[2]}; "
                        f"the model needs one size for {declared}"
                    )


def expected_text(view: ModelView, name: str) -> str:
    """``float32 [batch, 512]``: an input's element type and dims as the model declares them."""
    for vi in view.proto.graph.input:
        if vi.name == name and vi.type.WhichOneof("value") != "tensor_type":
            return _type_words(vi.type)
    info = view.tensor(name)
    dims = "unknown rank" if info.shape is None else dims_text(info.shape)
    return f"{dtype_name(info.elem_type)} {dims}"


def _type_words(t: onnx.TypeProto) -> str:
    kind = t.WhichOneof("value")
    if kind == "sequence_type":
        return f"a sequence of {_type_words(t.sequence_type.elem_type)}"
    if kind == "optional_type":
        return f"an optional {_type_words(t.optional_type.elem_type)}"
    if kind == "map_type":
        return "a map"
    if kind == "tensor_type":
        return f"{dtype_name(t.tensor_type.elem_type)} tensors"
    return "an undefined type"


__all__ = ["Samples", "check_feeds", "expected_text", "load_samples", "samples_from_feeds"]
