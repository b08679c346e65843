"""The values of the tensors a cut slices: weights, read by value wherever they come from.

A weight is an initializer (inline or external) or a tensor computed from initializers alone
(``ConstantOfShape``, ``Transpose`` of an initializer...), evaluated with ``onnx.reference``: exporters
often transpose a weight in the graph, and the cut needs its value to slice it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnxpipe.ir.external import inlined
from onnxpipe.ir.model import ModelView, NodeInfo

MAX_CONSTANT_NODES = 32
"""Most nodes a weight may be computed by and still count as constant (a chain from initializers)."""


class Constants:
    """Values of the tensors that depend on initializers and constants only, computed on demand."""

    def __init__(self, view: ModelView) -> None:
        self.view = view
        self.inits = {t.name: t for t in view.proto.graph.initializer}
        self.protos = {n.name: n for n in view.proto.graph.node}
        """The model's nodes by name (finding and cutting read their inputs and attributes)."""
        self.cache: dict[str, np.ndarray | None] = {}

    def is_constant(self, name: str) -> bool:
        return self._ancestors(name) is not None

    def value(self, name: str) -> np.ndarray | None:
        if name in self.cache:
            return self.cache[name]
        result: np.ndarray | None = None
        if name in self.inits:
            base = str(self.view.base_dir) if self.view.base_dir is not None else ""
            result = numpy_helper.to_array(self.inits[name], base)
        else:
            chain = self._ancestors(name)
            if chain is not None:
                result = self._evaluate(name, chain)
        self.cache[name] = result
        return result

    def weight(self, name: str) -> np.ndarray:
        """The value of ``name``, known to be constant (the node was found cuttable on it)."""
        value = self.value(name)
        assert value is not None
        return value

    def _ancestors(self, name: str) -> list[NodeInfo] | None:
        """The nodes that compute ``name`` from initializers alone, in order; None if it needs more."""
        if name in self.inits:
            return []
        found: dict[int, NodeInfo] = {}
        todo = [name]
        while todo:
            t = todo.pop()
            if t in self.inits or not t:
                continue
            pos = self.view.producer.get(t)
            if pos is None:
                return None  # a model input
            node = self.view.nodes[pos]
            if pos in found:
                continue
            if node.has_subgraph or node.domain not in ("", "ai.onnx") or len(found) >= MAX_CONSTANT_NODES:
                return None
            found[pos] = node
            todo.extend(node.reads)
        return [found[p] for p in sorted(found)]

    def _evaluate(self, name: str, chain: list[NodeInfo]) -> np.ndarray | None:
        needed = {t for n in chain for t in n.reads if t in self.inits}
        graph = helper.make_graph(
            [inlined(self.protos[n.name], self.view.base_dir) for n in chain],
            "constant",
            [],
            [helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)],
            [numpy_helper.from_array(self.value(t), t) for t in sorted(needed)],  # type: ignore[arg-type]
        )
        model = helper.make_model(graph, opset_imports=list(self.view.proto.opset_import))
        model.ir_version = max(self.view.proto.ir_version, 4)
        try:
            (out,) = ReferenceEvaluator(model).run(None, {})
        except Exception:  # noqa: BLE001 - an op the reference cannot run: the weight is not usable
            return None
        return np.asarray(out)
