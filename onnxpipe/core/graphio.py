"""A model file's declared inputs and outputs, in order, read without its weights.

Runtimes other than onnxruntime do not all keep ONNX's tensor names: tract names a model's outputs after
the nodes that produce them, so its results are bound to the file's outputs by position, and the order is
the file's.  Inputs that are also initializers (IR 3 models list every weight as an input) are not inputs
a caller feeds, and are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx


@dataclass(frozen=True)
class GraphIO:
    """The names a model file takes and gives, in its order."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def graph_io(path: str | Path) -> GraphIO:
    """The declared inputs (weights excluded) and outputs of the model at ``path``."""
    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}
    return GraphIO(
        inputs=tuple(i.name for i in graph.input if i.name not in weights),
        outputs=tuple(o.name for o in graph.output),
    )
