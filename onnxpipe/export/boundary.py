"""Types of the tensors that cross stage boundaries: what the stage files declare and the manifest records.

A stage file must declare the element type and rank of every input and output.  Most come from the
model's own shape inference (:attr:`ModelView.tensors`, symbolic dims kept as names); for the rest
:meth:`BoundaryTypes.resolve` tries, each only for what the previous step left open:

1. ONNX shape inference on the stage alone (weights left out);
2. onnxruntime's inference, by opening the stage with those outputs untyped;
3. where onnxruntime cannot tell a scalar from an unknown rank, one run of the source model on the
   user's sample inputs (``--inputs``) or random ones, keeping only the ranks it observes (dims stay
   unknown, so nothing is frozen to the shapes of that run).  When random inputs make the source fail,
   a second run sets every integer input to ones (integers that size things: a zero there empties or
   breaks the shape arithmetic, as in the ``affine_grid_*_expanded`` conformance cases, whose ``size``
   input is read as the grid's dims).  A rank no run confirmed is never written: a guessed scalar made
   onnxruntime refuse the stage (those cases' stage 0 declared a rank-3 tensor as a scalar and did not
   load), and ONNX requires a shape on a graph's outputs, so the export stops naming the tensor and
   the way out (``--inputs`` with real inputs, or another number of stages).  A source whose weights
   are in external files is not run whole (it would be loaded whole): there onnxruntime's rank stands,
   and the stage's own load check refuses the stage if it was wrong.

Sequences, maps and optionals keep their whole ``TypeProto``.  What an earlier stage learned serves the
later stages that receive the same tensor.

A stage file declares a boundary tensor's fixed dims and the symbolic dims the source model itself
names (``batch``); a symbol that shape inference made up (``unk__82``) is written as an unnamed dim.
Declared, such a symbol tells onnxruntime that two of the stage's inputs have equal dims, which it
cannot know inside the whole model, and it then fuses differently there than in the whole model: on a
torch-exported BERT it fused an ``Add`` and a ``LayerNormalization`` at the cut into one
``SkipLayerNormalization`` that ran slower than the two nodes did in the whole model (the ``stagecost``
benchmark times stages against the whole model), and whose outputs were no longer bit-equal to it.
The manifest keeps the inferred symbols: they say which dims agree.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from onnxpipe.core.dims import Shape
from onnxpipe.core.errors import ExportError
from onnxpipe.core.options import opt
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.export.weightfile import externalize
from onnxpipe.ir.external import is_external, stored_tensors
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.model import PROTOBUF_LIMIT, ModelView, TensorInfo, dtype_name, tensor_info
from onnxpipe.ir.shapes import resolve_input_shapes
from onnxpipe.planning.types import StageSpec

BuildStage = Callable[[StageSpec, bool, frozenset[str]], onnx.ModelProto]
"""``build(spec, weights, untyped)``: the stage as a model, with ``untyped`` outputs left without a type;
with weights, those the source keeps in external files may stay there (see
:meth:`onnxpipe.export.build.StageBuilder.build`'s ``keep_external``)."""


class BoundaryTypes:
    """Known types of boundary tensors; fills gaps with :meth:`resolve`."""

    def __init__(self, view: ModelView) -> None:
        self.view = view
        src = view.proto.graph
        self.types: dict[str, TensorInfo] = dict(view.tensors)
        # sequences, maps, optionals: their whole type, as the source or shape inference wrote it
        self.other: dict[str, onnx.TypeProto] = {
            vi.name: vi.type
            for vi in [*src.value_info, *src.input, *src.output]
            if vi.type.WhichOneof("value") not in (None, "tensor_type")
        }
        self.declared_symbols = declared_symbols(view.proto)
        self.any_rank: set[str] = set()
        """Tensors whose element type is known and whose rank no inference or run could settle."""

    def known(self, name: str) -> bool:
        return name in self.other or name in self.any_rank or complete(self.types.get(name))

    def describe(self, name: str) -> tuple[str, Shape]:
        """dtype text and shape of a boundary tensor, for the manifest."""
        other = self.other.get(name)
        if other is not None:
            return type_text(other), None
        info = self.types.get(name) or TensorInfo(name, 0, None)
        return info.dtype, clean(info.shape)

    def value_info(self, name: str, stage: int) -> onnx.ValueInfoProto:
        """The declaration of ``name`` for a stage's graph inputs or outputs."""
        other = self.other.get(name)
        if other is not None:
            vi = onnx.ValueInfoProto(name=name)
            vi.type.CopyFrom(other)
            return vi
        info = self.types.get(name)
        if name in self.any_rank:
            raise ExportError(
                f"stage {stage}: the rank of tensor {name!r} at the stage boundary is unknown (no shape "
                "inference settles it, and the source model did not run on the inputs it was given to show "
                f"it); give real inputs with {opt('input_files', 'FILE')}, or choose another number of stages"
            )
        if info is None or info.elem_type == 0 or info.shape is None:
            raise ExportError(
                f"stage {stage}: the type or rank of tensor {name!r} at the stage boundary is unknown "
                "(neither ONNX shape inference nor onnxruntime could tell); choose another number of stages"
            )
        dims = [
            d if not isinstance(d, str) or d in self.declared_symbols else None
            for d in clean(info.shape) or ()
        ]
        return helper.make_tensor_value_info(name, info.elem_type, dims)

    # ----------------------------------------------------------------------------------------------

    def resolve(
        self,
        spec: StageSpec,
        build: BuildStage,
        scratch: Path,
        input_shapes: Mapping[str, Sequence[int]] | None,
        can_run_source: bool,
        feeds: Mapping[str, Any] | None = None,
    ) -> None:
        """Learn the types of ``spec``'s outputs that are still unknown (see the module docstring).

        ``scratch`` is a folder for a probe file (a stage over 2 GB); ``can_run_source`` allows step 3
        (not for a source with external weights: it would have to be loaded whole); ``feeds`` are the
        user's sample inputs for that run, else random ones at ``input_shapes`` are used.
        """
        missing = frozenset(t for t in spec.outputs if not self.known(t))
        if missing:
            self._infer_with_onnx(spec, build, missing)
            missing = frozenset(t for t in missing if not self.known(t))
        if missing:
            unsure_rank = self._infer_with_ort(spec, build, missing, scratch)
            if not unsure_rank or not can_run_source:
                # a source with external weights is not run whole: onnxruntime's rank stands, and the
                # stage's own load check refuses it if it was wrong
                return
            confirmed = self._observe_ranks(unsure_rank, input_shapes, feeds)
            for name in unsure_rank - confirmed:
                self.any_rank.add(name)
                self.types[name] = TensorInfo(name, self.types[name].elem_type, None)

    def _infer_with_onnx(self, spec: StageSpec, build: BuildStage, missing: frozenset[str]) -> None:
        light = build(spec, False, missing)
        try:
            inferred = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False)
        except Exception:  # noqa: BLE001 - best effort; onnxruntime is asked next
            return
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            if vi.name not in missing:
                continue
            info = tensor_info(vi)
            if info is not None and complete(info):
                self.types[vi.name] = info
            elif vi.type.WhichOneof("value") not in (None, "tensor_type"):
                self.other[vi.name] = vi.type

    def _infer_with_ort(
        self, spec: StageSpec, build: BuildStage, missing: frozenset[str], scratch: Path
    ) -> set[str]:
        """Types onnxruntime infers; returns the tensors it shows as rank 0 (which may mean unknown)."""
        probe = build(spec, True, missing)
        options = session_options(level="ORT_DISABLE_ALL")
        probe_dir = Path(tempfile.mkdtemp(prefix="probe-", dir=scratch))
        unsure: set[str] = set()
        try:
            if (
                not any(is_external(t) for t in stored_tensors(probe))
                and serialized_size(probe) < PROTOBUF_LIMIT
            ):
                session = open_session(probe.SerializeToString(), options)
            else:  # weights still in the source's files, or too big for one protobuf: through a file
                path = probe_dir / "probe.onnx"
                externalize(probe, probe_dir / "probe.data", self.view.base_dir, 1024)
                onnx.save_model(probe, str(path))
                session = open_session(path, options)
            del probe
            for o in session.get_outputs():
                if o.name in missing:
                    info = from_ort(o.name, o.type, o.shape)
                    if info is not None:
                        self.types[o.name] = info
                        if info.shape == ():
                            unsure.add(o.name)
            del session
        except Exception:  # noqa: BLE001 - the checker and the real load of the stage report the failure
            pass
        finally:
            shutil.rmtree(probe_dir, ignore_errors=True)
        return unsure

    def _observe_ranks(
        self,
        names: set[str],
        input_shapes: Mapping[str, Sequence[int]] | None,
        given: Mapping[str, Any] | None,
    ) -> set[str]:
        """Run the source model once, with ``names`` as extra outputs, and keep their ranks (dims
        unknown); returns the names whose rank the run showed."""
        data = with_outputs(self.view.proto, sorted(names))
        values: list[Any] | None = None
        try:
            session = open_session(data, session_options())
            if given is not None:
                tries = [dict(given)]
            else:
                shapes = resolve_input_shapes(self.view, input_shapes or None)
                random = random_feeds(self.view, shapes, seed=0)
                ones = {n: np.ones_like(v) if v.dtype.kind in "iu" else v for n, v in random.items()}
                tries = [random, ones]
            for feeds in tries:
                with suppress(Exception):  # else the next inputs may run
                    values = session.run(sorted(names), feeds)
                    break
        except Exception:  # noqa: BLE001 - unconfirmed ranks are refused by value_info
            return set()
        if values is None:
            return set()
        confirmed: set[str] = set()
        for n, v in zip(sorted(names), values, strict=True):
            if isinstance(v, np.ndarray):
                self.types[n] = TensorInfo(n, self.types[n].elem_type, (None,) * v.ndim)
                confirmed.add(n)
        return confirmed


# --------------------------------------------------------------------------------------------------
# type helpers


def with_outputs(model: onnx.ModelProto, names: Sequence[str]) -> bytes:
    """``model`` serialized with ``names`` as extra (untyped) outputs, to run it once and see them; the
    model itself is left as it was."""
    present = {o.name for o in model.graph.output}
    added = [n for n in names if n not in present]
    try:
        for n in added:
            model.graph.output.append(helper.make_empty_tensor_value_info(n))
        data: bytes = model.SerializeToString()
        return data
    finally:
        del model.graph.output[len(model.graph.output) - len(added) :]


def serialized_size(model: onnx.ModelProto) -> float:
    """About the bytes of ``model`` serialized; protobuf's ``ByteSize`` fails above 2 GB, so sum the parts.

    ``inf`` when a single part is already too large to measure.
    """
    from google.protobuf.message import EncodeError

    graph = model.graph
    parts = [graph.node, graph.initializer, graph.sparse_initializer, graph.input, graph.output]
    parts += [graph.value_info, model.functions]
    try:
        return float(sum(p.ByteSize() for part in parts for p in part))
    except EncodeError:
        return float("inf")


def type_text(t: onnx.TypeProto) -> str:
    """``seq(map(int64,tensor(float32)))``: onnxruntime's notation with numpy dtype names."""
    kind = t.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({dtype_name(t.tensor_type.elem_type)})"
    if kind == "sparse_tensor_type":
        return f"sparse_tensor({dtype_name(t.sparse_tensor_type.elem_type)})"
    if kind == "sequence_type":
        return f"seq({type_text(t.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({type_text(t.optional_type.elem_type)})"
    if kind == "map_type":
        return f"map({dtype_name(t.map_type.key_type)},{type_text(t.map_type.value_type)})"
    return "undefined"


def declared_symbols(model: onnx.ModelProto) -> frozenset[str]:
    """The symbolic dims the model file itself names on its main graph's inputs, outputs and value_info."""
    graph = model.graph
    return frozenset(
        d.dim_param
        for vi in [*graph.input, *graph.output, *graph.value_info]
        if vi.type.HasField("tensor_type")
        for d in vi.type.tensor_type.shape.dim
        if d.HasField("dim_param") and d.dim_param
    )


def clean(shape: Shape) -> Shape:
    """Negative dims (``-1``, which some exporters write for "any") as unknown dims."""
    if shape is None:
        return None
    return tuple(None if isinstance(d, int) and d < 0 else d for d in shape)


def complete(info: TensorInfo | None) -> bool:
    return info is not None and info.elem_type != 0 and info.shape is not None


def from_ort(name: str, type_name: str, shape: Sequence[object] | None) -> TensorInfo | None:
    """``tensor(float)`` and onnxruntime's dims -> TensorInfo; ``None`` for non-tensors."""
    if not type_name.startswith("tensor(") or not type_name.endswith(")"):
        return None
    try:
        elem = int(onnx.TensorProto.DataType.Value(type_name[len("tensor(") : -1].upper()))
    except ValueError:
        return None
    return TensorInfo(name, elem, tuple(d if isinstance(d, int | str) else None for d in shape or ()))


__all__ = ["BoundaryTypes", "clean", "serialized_size", "type_text"]
