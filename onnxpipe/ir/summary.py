"""What ``inspect MODEL`` tells about a model before it is split: its inputs and outputs (dtypes, dims
with their symbols), opsets, node counts, weights, control-flow nodes and external weight files.

These decide what a split will do and cannot be seen in a table of operators: a symbolic dim is sized
by a guess unless ``--shape`` sets it, an If or Loop node is one stage's whole, weights kept in external
files are read from there at export.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from onnxpipe.ir.external import external_info, is_external, stored_tensors
from onnxpipe.ir.model import ModelView, TensorInfo


@dataclass(frozen=True)
class ModelSummary:
    """The facts of one model that decide how it splits (see the module docstring)."""

    name: str
    inputs: tuple[TensorInfo, ...]
    """The model inputs as shape inference saw them: ``shape`` None when the rank is unknown, a str dim a
    symbol."""
    outputs: tuple[TensorInfo, ...]
    ir_version: int
    opsets: tuple[tuple[str, int], ...]
    """``(domain, version)``, the default domain written ``ai.onnx``."""
    node_count: int
    compute_node_count: int
    param_bytes: int
    control_flow: tuple[tuple[str, str], ...]
    """``(node name, op type)`` of the nodes with subgraphs (If, Loop, Scan)."""
    external_data: tuple[tuple[str, int], ...]
    """``(file, tensors)`` of the files holding weights outside the model file."""
    op_counts: tuple[tuple[str, int], ...]


def summarize(view: ModelView) -> ModelSummary:
    """The :class:`ModelSummary` of ``view`` (reads no weights)."""
    files = Counter(external_info(t)[0] for t in stored_tensors(view.proto) if is_external(t))
    ops: Counter[str] = Counter(
        f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type for n in view.nodes
    )
    return ModelSummary(
        name=view.label,
        inputs=tuple(view.tensor(n) for n in view.inputs),
        outputs=tuple(view.tensor(n) for n in view.outputs),
        ir_version=int(view.proto.ir_version),
        opsets=tuple(sorted((o.domain or "ai.onnx", int(o.version)) for o in view.proto.opset_import)),
        node_count=len(view.nodes),
        compute_node_count=len(view.compute_nodes),
        param_bytes=view.param_bytes,
        control_flow=tuple((n.name, n.op_type) for n in view.nodes if n.has_subgraph),
        external_data=tuple(sorted(files.items())),
        op_counts=tuple(ops.most_common()),
    )
