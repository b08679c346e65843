"""The tract engine: Sonos' tract through its Python package.

tract types a model for fixed input facts before optimizing it, so a loaded file is parsed once and
optimized for each set of input shapes and dtypes it is run with (cached: a pipeline feeds one shape).
Outputs come back in the file's order under tract's own names, and are bound by position.  tract runs a
model on the calling thread, so ``threads`` does not apply.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from onnxpipe.core.choices import Runtime
from onnxpipe.core.runtimes import Engine, EngineConfig, bind_outputs, file_io

_DTYPES = {
    "float32": "f32",
    "float64": "f64",
    "float16": "f16",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint64": "u64",
    "uint32": "u32",
    "uint16": "u16",
    "uint8": "u8",
    "bool": "bool",
}
MAX_CACHED = 4
"""Optimized models kept per engine (one per input signature)."""


def fact(array: np.ndarray) -> str:
    """tract's fact string for an array: ``"2,8,i64"`` (a scalar: ``"i64"``)."""
    dtype = _DTYPES.get(array.dtype.name)
    if dtype is None:
        raise ValueError(f"tract takes no {array.dtype} tensor")
    return ",".join([*(str(d) for d in array.shape), dtype])


class TractEngine(Engine):
    """A model file parsed by tract, optimized per input signature."""

    runtime = Runtime.TRACT

    def __init__(self, path: Path) -> None:
        import tract

        self._tract: Any = tract
        self._path = path
        model = tract.onnx().load(str(path))  # parses: a file tract cannot read fails here
        self._tract_inputs = tuple(model.input_name(i) for i in range(model.input_count()))
        super().__init__(*file_io(path))
        self._runnables: dict[tuple[str, ...], Any] = {}

    def _arrays(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return [np.ascontiguousarray(feeds[n]) for n in self._tract_inputs]

    def _runnable(self, arrays: Sequence[np.ndarray]) -> Any:
        key = tuple(fact(a) for a in arrays)
        found = self._runnables.get(key)
        if found is None:
            model = self._tract.onnx().load(str(self._path))
            for i, f in enumerate(key):
                model.set_input_fact(i, f)
            found = model.into_model().into_runnable()
            if len(self._runnables) >= MAX_CACHED:
                self._runnables.pop(next(iter(self._runnables)))
            self._runnables[key] = found
        return found

    def _run(self, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[Any]:
        arrays = self._arrays(feeds)
        results = [t.to_numpy() for t in self._runnable(arrays).run(arrays)]
        return bind_outputs(names, self.output_names, results, str(self._path))

    def layer_seconds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, float] | None:
        arrays = self._arrays(feeds)
        report = json.loads(self._runnable(arrays).profile_json(arrays))
        seconds: dict[str, float] = {}
        for node in report.get("nodes", []):
            t = float(node.get("secs_per_iter") or 0.0)
            name = str(node.get("node_name", ""))
            if t > 0 and node.get("op_name") != "Source":
                seconds[name] = seconds.get(name, 0.0) + t
        return seconds

    def _release(self) -> None:
        self._runnables.clear()


def runs_here(config: EngineConfig) -> bool:
    """Always: tract runs a model on the calling thread's CPU, wherever its package is installed."""
    return True


def load(path: Path, config: EngineConfig) -> TractEngine:
    return TractEngine(path)
