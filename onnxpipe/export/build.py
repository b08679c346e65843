"""Build one stage of a plan as an ONNX model, copied out of the loaded source by node index.

A stage holds, in this order:

* its constant producers (each stage that reads a cheap constant makes its own copy), listed after the
  constants they read; a ``Shape`` of a static tensor becomes a ``Constant`` of that shape;
* copies of the earlier stages' nodes that make the shape values and constant-only values it would
  otherwise receive (:attr:`StageSpec.recomputed_nodes`, :mod:`onnxpipe.planning.recompute`);
* its compute nodes, as they are (subgraph bodies of If/Loop/Scan included, never cut), but those whose
  values are now remade from an equal tensor (:attr:`StageSpec.skipped_nodes`);
* an ``Identity`` node for each tensor remade from an equal one (:attr:`StageSpec.aliases`): first
  those the stage receives as an equal input, then each right after the node making its equal;
* the initializers (dense and sparse) that its nodes read, their bodies included, and the model outputs
  it must emit that are initializers; weights kept in external files are read one tensor at a time;
* inputs and outputs declared with the boundary types (:mod:`onnxpipe.export.boundary`), ``value_info`` of its
  inner tensors, the quantization annotations of its tensors;
* the local functions its nodes call (transitively), and every opset import of the source (unused
  imports are harmless; the functions carry their own imports).

Model-level fields are kept: ``producer_*``, ``domain``, ``model_version``, ``doc_string``, metadata,
the graph's doc string and metadata.  ``ir_version`` is raised to 4 for IR-3 sources, whose initializers
would otherwise also have to be graph inputs.  ``training_info`` cannot be split and is refused before
anything is built (:func:`onnxpipe.export.checks.check_exportable`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxpipe.core.errors import ExportError, ModelLoadError
from onnxpipe.export.boundary import BoundaryTypes
from onnxpipe.ir.external import is_external, read_inline, source_file, tensors_inside
from onnxpipe.ir.model import ModelView, NodeInfo, initializer_nbytes, subgraphs
from onnxpipe.planning.types import ShapeParts, StageSpec

SMALL_TENSOR_BYTES = 1024
"""Without weights (for shape inference), initializers above this keep only their dims and type."""


ALIAS_NODE_PREFIX = "onnxpipe/same_value/"
SHAPE_NODE_PREFIX = "onnxpipe/shape_of/"
"""The prefix of the nodes (and their tensors) that make a recomputed ``Shape`` of a tensor the stage
lacks out of dims it has (:attr:`onnxpipe.planning.types.StageSpec.shape_sources`); the last of them, a
``Concat``, keeps the ``Shape`` node's name and output."""


def alias_node_name(tensor: str) -> str:
    """The name of the ``Identity`` node that remakes ``tensor`` from an equal tensor
    (:attr:`onnxpipe.planning.types.StageSpec.aliases`): a prefix no exporter writes, then the tensor's
    name."""
    return ALIAS_NODE_PREFIX + tensor


class StageBuilder:
    """Builds stage models out of ``view.proto``; :meth:`build` is called once or a few times per stage."""

    def __init__(self, view: ModelView, types: BoundaryTypes) -> None:
        self.view = view
        self.types = types
        src = view.proto
        self.by_name: dict[str, NodeInfo] = {n.name: n for n in view.nodes}
        self.functions = {_key(f): f for f in src.functions}
        self.value_info = {vi.name: vi for vi in src.graph.value_info}
        self.dense = {t.name: t for t in src.graph.initializer}
        self.sparse = {sp.values.name: sp for sp in src.graph.sparse_initializer}
        self.annotations = {a.tensor_name: a for a in src.graph.quantization_annotation}

    # ----------------------------------------------------------------------------------------------

    def weights_of(self, spec: StageSpec) -> list[str]:
        """Names of the initializers (dense and sparse) the stage holds, in the source's order."""
        wanted: set[str] = set()
        for info in self._constants_in_order(spec.constant_nodes):
            if info.op_type != "Shape":
                wanted.update(info.reads)
        for name in [*spec.recomputed_nodes, *spec.file_node_names]:
            wanted.update(self.by_name[name].reads)
        wanted.update(spec.outputs)  # a model output that is an initializer
        annotated = [self.annotations[t] for t in wanted | set(spec.inputs) if t in self.annotations]
        wanted.update(e.value for ann in annotated for e in ann.quant_parameter_tensor_names)
        return [t for t in [*self.dense, *self.sparse] if t in wanted and t not in spec.inputs]

    def build(
        self,
        spec: StageSpec,
        *,
        weights: bool,
        untyped: frozenset[str] = frozenset(),
        keep_external: bool = False,
    ) -> onnx.ModelProto:
        """The stage as a model; without ``weights`` large initializers keep only dims (for inference).

        ``untyped`` outputs are declared without a type (so that a type inference fills them in).  With
        ``keep_external`` the main graph's initializers stored in the source's external files keep
        pointing there, unread: such a model must go through :func:`onnxpipe.export.weightfile.externalize`
        before it is saved.  Tensors inside nodes (attributes, initializers of If/Loop/Scan bodies) that
        the source stores externally are always read in (or, without ``weights``, reduced to dims).
        """
        model = self._empty_model(spec)
        graph = model.graph
        produced = self._add_nodes(graph, spec, weights)
        self._add_weights(graph, spec, weights, keep_external and weights)
        self._add_inputs_and_outputs(graph, spec, untyped, produced)
        self._add_annotations(graph, set(spec.inputs) | set(spec.outputs) | produced)
        model.functions.extend(self._functions_used(graph.node))
        return model

    # ----------------------------------------------------------------------------------------------
    # the steps of build

    def _empty_model(self, spec: StageSpec) -> onnx.ModelProto:
        """A model with the source's model-level fields and every opset import, and an empty graph."""
        src = self.view.proto
        model = onnx.ModelProto()
        model.ir_version = max(src.ir_version, 4)
        for name in ("producer_name", "producer_version", "domain", "model_version", "doc_string"):
            setattr(model, name, getattr(src, name))
        model.opset_import.extend(src.opset_import)  # all of them: what a stage uses is a subset
        model.metadata_props.extend(src.metadata_props)
        if "configuration" in onnx.ModelProto.DESCRIPTOR.fields_by_name:  # onnx >= 1.18: multi-device
            model.configuration.extend(src.configuration)
        graph = model.graph
        graph.name = f"{src.graph.name or 'graph'}_stage{spec.index}"
        graph.doc_string = src.graph.doc_string
        graph.metadata_props.extend(src.graph.metadata_props)
        return model

    def _add_nodes(self, graph: onnx.GraphProto, spec: StageSpec, weights: bool) -> set[str]:
        """The stage's nodes, in the order of the module doc; the tensors they make (but the constants')."""
        for info in self._constants_in_order(spec.constant_nodes):
            if info.op_type == "Shape":
                graph.node.append(self._shape_as_constant(spec, info))
            else:
                self._copy_node(info, graph.node.add(), spec, weights)
        # a tensor received as an equal input is remade first; one equal to a value the stage makes,
        # right after the node that makes it
        remade: dict[str, list[str]] = {}
        for alias in spec.aliases:
            remade.setdefault(alias.same_as, []).append(alias.name)
        produced = _remake(graph, remade, spec.inputs)
        parts = dict(spec.shape_sources)
        for name in spec.recomputed_nodes:  # copies that spare the stage receiving shape/constant values
            produced.update(self._add_node(graph, self.by_name[name], parts, spec, weights))
        for name in spec.file_node_names:
            outputs = self._add_node(graph, self.by_name[name], parts, spec, weights)
            produced.update(outputs)
            produced.update(_remake(graph, remade, outputs))
        return produced

    def _add_node(
        self,
        graph: onnx.GraphProto,
        info: NodeInfo,
        parts: Mapping[str, ShapeParts],
        spec: StageSpec,
        weights: bool,
    ) -> tuple[str, ...]:
        """Copy a recomputed or own node; a ``Shape`` of a tensor the stage lacks (a decoder's ``Shape`` of
        another layer's cache) is made of dims the stage has.  The node's outputs."""
        if info.name in parts:
            graph.node.extend(self._shape_from_parts(info, parts[info.name]))
        else:
            self._copy_node(info, graph.node.add(), spec, weights)
        return info.outputs

    def _add_weights(self, graph: onnx.GraphProto, spec: StageSpec, weights: bool, keep: bool) -> None:
        """The initializers (dense and sparse) the stage holds (:meth:`weights_of`)."""
        for t in self.weights_of(spec):
            if t in self.dense:
                self._copy_tensor(self.dense[t], graph.initializer.add(), spec, weights, keep)
            else:
                sp = self.sparse[t]
                new = graph.sparse_initializer.add()
                new.dims.extend(sp.dims)
                self._copy_tensor(sp.values, new.values, spec, weights, keep)
                self._copy_tensor(sp.indices, new.indices, spec, weights, keep)

    def _add_inputs_and_outputs(
        self, graph: onnx.GraphProto, spec: StageSpec, untyped: frozenset[str], produced: set[str]
    ) -> None:
        """Inputs and outputs with the boundary types (``untyped`` outputs without one), and the source's
        ``value_info`` of the inner tensors the stage makes."""
        graph.input.extend(self.types.value_info(t, spec.index) for t in spec.inputs)
        graph.output.extend(
            helper.make_empty_tensor_value_info(t) if t in untyped else self.types.value_info(t, spec.index)
            for t in spec.outputs
        )
        inner = sorted(produced - set(spec.inputs) - set(spec.outputs))
        graph.value_info.extend(self.value_info[t] for t in inner if t in self.value_info)

    def _add_annotations(self, graph: onnx.GraphProto, tensors: set[str]) -> None:
        """The source's quantization annotations of the tensors the stage has (its weights included)."""
        present = tensors | {t.name for t in graph.initializer}
        present |= {sp.values.name for sp in graph.sparse_initializer}
        graph.quantization_annotation.extend(a for t, a in self.annotations.items() if t in present)

    # ----------------------------------------------------------------------------------------------

    def _constants_in_order(self, names: Iterable[str]) -> list[NodeInfo]:
        """The constant producers in the view's order, each after the constants it reads.

        The view may place a constant producer after its readers (it is copied wherever it is read, so
        its position does not matter to the partition); a graph must list producers first.
        """
        infos = sorted((self.by_name[n] for n in names), key=lambda n: n.position)
        maker = {o: info for info in infos for o in info.outputs}

        def deps(info: NodeInfo) -> list[NodeInfo]:
            if info.op_type == "Shape":  # becomes a Constant: reads nothing
                return []
            return [maker[t] for t in info.reads if t in maker and maker[t] is not info]

        order: list[NodeInfo] = []
        seen: set[str] = set()
        for root in infos:
            stack: list[tuple[NodeInfo, bool]] = [(root, False)]
            while stack:
                info, expanded = stack.pop()
                if expanded:
                    order.append(info)
                    continue
                if info.name in seen:
                    continue
                seen.add(info.name)
                stack.append((info, True))
                stack.extend((d, False) for d in reversed(deps(info)) if d.name not in seen)
        return order

    def _shape_as_constant(self, spec: StageSpec, info: NodeInfo) -> onnx.NodeProto:
        """``Shape`` of a static tensor as a ``Constant`` holding that shape (``start``/``end`` honoured)."""
        proto = self.view.proto.graph.node[info.index]
        shape = self.view.tensor(info.inputs[0]).shape if info.inputs else None
        if shape is None or not all(isinstance(d, int) for d in shape):
            raise ExportError(
                f"stage {spec.index}: node {info.name!r} (Shape) reads {info.inputs[:1]} whose shape is not "
                "static; please report this with the model"
            )
        value = np.array([int(d) for d in shape[_shape_range(proto)] if isinstance(d, int)], dtype=np.int64)
        return helper.make_node(
            "Constant", [], [proto.output[0]], name=info.name, value=numpy_helper.from_array(value)
        )

    def _shape_from_parts(self, info: NodeInfo, parts: ShapeParts) -> list[onnx.NodeProto]:
        """``Shape`` (``start``/``end`` honoured) of a tensor the stage lacks, from its dims: each a
        ``Constant``, or a ``Shape`` of a tensor the stage has followed by a ``Gather`` of one axis;
        joined by a ``Concat`` that writes the node's output."""
        proto = self.view.proto.graph.node[info.index]
        base = f"{SHAPE_NODE_PREFIX}{info.name}/"
        nodes: list[onnx.NodeProto] = []
        pieces: list[str] = []
        for i, part in enumerate(parts[_shape_range(proto)]):
            piece = f"{base}{i}"
            if isinstance(part, int):
                value = numpy_helper.from_array(np.array([part], dtype=np.int64))
                nodes.append(helper.make_node("Constant", [], [piece], name=piece, value=value))
            else:
                tensor, axis = part
                index = numpy_helper.from_array(np.array([axis], dtype=np.int64))
                nodes.append(
                    helper.make_node("Constant", [], [piece + "/axis"], name=piece + "/axis", value=index)
                )
                nodes.append(helper.make_node("Shape", [tensor], [piece + "/shape"], name=piece + "/shape"))
                nodes.append(
                    helper.make_node(
                        "Gather", [piece + "/shape", piece + "/axis"], [piece], name=piece, axis=0
                    )
                )
            pieces.append(piece)
        if not pieces:
            empty = numpy_helper.from_array(np.zeros((0,), dtype=np.int64))
            nodes.append(helper.make_node("Constant", [], [info.outputs[0]], name=info.name, value=empty))
        else:
            nodes.append(helper.make_node("Concat", pieces, [info.outputs[0]], name=info.name, axis=0))
        return nodes

    def _copy_node(self, info: NodeInfo, dst: onnx.NodeProto, spec: StageSpec, weights: bool) -> None:
        """Copy a source node; tensors inside it that live in the source's external files are read in."""
        dst.CopyFrom(self.view.proto.graph.node[info.index])
        for t in tensors_inside(dst):
            if is_external(t):
                held = onnx.TensorProto()
                held.CopyFrom(t)
                t.Clear()
                self._copy_tensor(held, t, spec, weights, keep_external=False)

    def _copy_tensor(
        self,
        src: onnx.TensorProto,
        dst: onnx.TensorProto,
        spec: StageSpec,
        weights: bool,
        keep_external: bool = False,
    ) -> None:
        if not weights and (is_external(src) or src.ByteSize() > SMALL_TENSOR_BYTES):
            dst.name = src.name
            dst.data_type = src.data_type
            dst.dims.extend(src.dims)
            return
        dst.CopyFrom(src)
        if is_external(dst) and not keep_external:
            base = self.view.base_dir
            if base is None:
                raise ExportError(
                    f"stage {spec.index}: initializer {src.name!r} is stored in an external file but the "
                    "model's folder is unknown; load the model with onnxpipe.load_model(path)"
                )
            read_inline(dst, base)  # refuses a file outside the folder, a missing one, one cut short
            expected = _packed_nbytes(dst)
            if expected is not None and len(dst.raw_data) < expected:  # its length was not recorded
                raise ModelLoadError(
                    f"{source_file(src, base)}: ends inside the weights of initializer {src.name!r} "
                    f"({len(dst.raw_data)} of {expected} bytes); the weights file is truncated: copy it "
                    "again or re-export the model"
                )

    def _functions_used(self, nodes: Iterable[onnx.NodeProto]) -> list[onnx.FunctionProto]:
        """Local functions the nodes call, transitively, in the source's order."""
        used: set[tuple[str, str, str]] = set()
        stack = list(_calls(nodes))
        while stack:
            key = stack.pop()
            f = self.functions.get(key)
            if f is None or key in used:
                continue
            used.add(key)
            stack.extend(_calls(f.node))
        return [f for f in self.view.proto.functions if _key(f) in used]


def _remake(graph: onnx.GraphProto, remade: Mapping[str, list[str]], sources: Iterable[str]) -> set[str]:
    """Append an ``Identity`` for each tensor remade from one of ``sources`` (an equal tensor); the names
    it makes."""
    made: set[str] = set()
    for source in sources:
        for name in remade.get(source, ()):
            graph.node.append(helper.make_node("Identity", [source], [name], name=alias_node_name(name)))
            made.add(name)
    return made


def _key(f: onnx.FunctionProto) -> tuple[str, str, str]:
    return (f.domain, f.name, getattr(f, "overload", ""))


def nodes_within(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """Every node of ``nodes`` and, depth first, those of the subgraph bodies inside them."""
    for n in nodes:
        yield n
        for g in subgraphs(n):
            yield from nodes_within(g.node)


def _calls(nodes: Iterable[onnx.NodeProto]) -> Iterator[tuple[str, str, str]]:
    """(domain, op_type, overload) of every node, inside subgraph bodies too."""
    return ((n.domain, n.op_type, getattr(n, "overload", "")) for n in nodes_within(nodes))


_SUB_BYTE_TYPES = frozenset(
    getattr(onnx.TensorProto, name)
    for name in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
    if hasattr(onnx.TensorProto, name)
)


def _packed_nbytes(t: onnx.TensorProto) -> int | None:
    """Bytes ``t``'s raw data must hold; ``None`` where that is not a plain product (strings, 4-bit)."""
    if t.data_type in _SUB_BYTE_TYPES or t.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return None
    return initializer_nbytes(t)


__all__ = ["StageBuilder"]


def _shape_range(proto: onnx.NodeProto) -> slice:
    """The dims a ``Shape`` node returns: its optional ``start``/``end`` attributes (opset 15), which count
    from the end when negative and are clamped to the rank, as a Python slice does."""
    bounds = {a.name: int(a.i) for a in proto.attribute if a.name in ("start", "end")}
    return slice(bounds.get("start", 0), bounds.get("end"))
