"""The boundary contract: what another runtime needs to know of every tensor between stages.

Why: a runtime other than onnxruntime (OpenVINO, tract, a Triton server) binds stage inputs and outputs
by the manifest.  It cannot use exporters' private symbols (``unk__44``, ``p2o.DynamicDimension.0``) or
the expression strings shape inference writes (``floor(height/2 - 1/2) + 1``), and a shape the source
declared may simply be wrong (an output declared ``[1, seqlen]`` that is really ``(16, 1, 8210)``).  So
each boundary tensor and model input/output carries in the manifest:

* ``shape``: its symbolic dims normalised to the model inputs' own symbols, an int where fixed, null
  otherwise (never another name, never an expression);
* ``profiled_shape``: its concrete shape at the profiled input shapes;
* ``batch_axis``: the axis carrying the batch dim the model inputs share at axis 0 (or none).

Concrete shapes come from the symbols where they can, and otherwise from one run of the source at the
profiled shapes (:meth:`ContractMaker.observe`); a second run with each input symbol grown by a step of
its own tells which unnamed dims follow which input symbol.  The first run also checks the declared
shapes: a declared shape
that disagrees with the run is replaced by unknown dims of the observed rank (in the stage files too,
since this happens before they are written) and a plan note says so.  The run is made only when some
boundary dim is not settled by the symbols, and with onnxruntime's basic optimizations: most splits
(CNNs at fixed shapes) pay nothing for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from onnxpipe.core.dims import Shape
from onnxpipe.core.errors import UsageError
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.export.boundary import BoundaryTypes, clean, with_outputs
from onnxpipe.export.build import nodes_within
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.model import ModelView, TensorInfo, dims_text
from onnxpipe.ir.shapes import resolve_input_shapes, symbol_sizes


@dataclass(frozen=True)
class TensorContract:
    """One tensor's entry in the contract (see the module docstring)."""

    shape: Shape
    profiled_shape: tuple[int, ...] | None
    batch_axis: int | None


def batch_symbol(view: ModelView) -> str | None:
    """The symbol at axis 0 of every model input (of rank 1 or more), if they all share one."""
    found = {shape[0] for name in view.inputs if (shape := view.tensor(name).shape)}
    only = found.pop() if len(found) == 1 else None
    return only if isinstance(only, str) else None


class ContractMaker:
    """Builds :class:`TensorContract` entries for one export; :meth:`observe` first, when it can run."""

    def __init__(self, view: ModelView, input_shapes: Mapping[str, Sequence[int]]) -> None:
        self.view = view
        self.input_shapes = dict(input_shapes)
        self.symbols = frozenset(
            d for name in view.inputs for d in (view.tensor(name).shape or ()) if isinstance(d, str)
        )
        resolved: Mapping[str, Sequence[int]]
        try:  # a plan made without shapes (static costs in tests) profiled at the defaults
            resolved = resolve_input_shapes(view, input_shapes or None)
        except UsageError:  # an input of unknown rank: nothing to size the symbols by
            resolved = input_shapes
        self.sizes = symbol_sizes(view, resolved)
        self.batch = batch_symbol(view)
        self.observed: dict[str, tuple[int, ...]] = {}
        self.symbols_seen: dict[str, tuple[str | None, ...]] = {}
        """Per observed tensor, the input symbol each dim followed when the inputs grew (or None)."""
        self.notes: list[str] = []

    def normalized(self, shape: Shape) -> Shape:
        """``shape`` with every dim that is neither an int nor a model input's symbol as unknown."""
        if shape is None:
            return None
        return tuple(d if isinstance(d, int) or d in self.symbols else None for d in clean(shape) or ())

    def settled(self, shape: Shape) -> tuple[int, ...] | None:
        """The concrete dims of ``shape`` at the profiled input shapes, when the symbols settle them."""
        shape = self.normalized(shape)
        if shape is None:
            return None
        dims: list[int] = []
        for d in shape:
            if isinstance(d, int):
                dims.append(d)
            elif isinstance(d, str) and d in self.sizes:
                dims.append(self.sizes[d])
            else:
                return None
        return tuple(dims)

    def observe(self, names: Iterable[str], types: BoundaryTypes) -> None:
        """Run the source once at the profiled shapes, if some tensor of ``names`` is not settled by the
        symbols, and keep every one's observed shape; fix declared shapes the run contradicts.

        Best effort: a model that does not run here keeps the symbols' answer (null where they have
        none), as the stage checks report what is really wrong.
        """
        wanted = [n for n in dict.fromkeys(names) if n not in types.other]
        if not wanted or all(self.settled(types.describe(n)[1]) is not None for n in wanted):
            return
        data = with_outputs(self.view.proto, wanted)
        try:
            shapes = resolve_input_shapes(self.view, self.input_shapes or None)
            feeds = random_feeds(self.view, shapes, seed=0)
            # log_severity 4: a probe that fails is expected and handled, not an error for the user to read
            session = open_session(data, session_options(level="ORT_ENABLE_BASIC", log_severity=4))
            values = session.run(wanted, feeds)
        except Exception:  # noqa: BLE001 - best effort, see the docstring
            return
        for name, value in zip(wanted, values, strict=True):
            if isinstance(value, np.ndarray):
                self.observed[name] = tuple(int(d) for d in value.shape)
        self._check_declared(types)
        self._vary(session, wanted, shapes)

    def _vary(self, session: Any, wanted: list[str], shapes: Mapping[str, Sequence[int]]) -> None:
        """Run once more with each input symbol grown by a step of its own (1, 2, ...): a dim that was
        the symbol's size and grew by its step is that symbol (a made-up ``unk__7`` that is the batch).
        Best effort: a model that does not run at those sizes keeps null dims."""
        steps = {sym: i + 1 for i, sym in enumerate(sorted(self.symbols))}
        if not steps:
            return
        grown: dict[str, list[int]] = {}
        for name in self.view.inputs:
            declared = self.view.tensor(name).shape or ()
            dims = list(shapes[name])
            for axis, d in enumerate(declared):
                if isinstance(d, str) and d in steps and axis < len(dims):
                    dims[axis] += steps[d]
            grown[name] = dims
        try:
            values = session.run(wanted, random_feeds(self.view, grown, seed=0))
        except Exception:  # noqa: BLE001 - best effort, see the docstring
            return
        for name, value in zip(wanted, values, strict=True):
            first = self.observed.get(name)
            if not isinstance(value, np.ndarray) or first is None or len(first) != value.ndim:
                continue
            found: list[str | None] = []
            for before, after in zip(first, value.shape, strict=True):
                match = [
                    sym
                    for sym, step in steps.items()
                    if self.sizes.get(sym) == before and after - before == step
                ]
                found.append(match[0] if len(match) == 1 else None)
            self.symbols_seen[name] = tuple(found)

    def _check_declared(self, types: BoundaryTypes) -> None:
        """Declared shapes the run contradicts become unknown dims of the observed rank."""
        for name, seen in self.observed.items():
            info = types.types.get(name)
            if info is None or info.shape is None:
                continue
            declared = clean(info.shape) or ()
            wrong = len(declared) != len(seen) or any(
                (isinstance(d, int) and d != v)
                or (isinstance(d, str) and d in self.sizes and self.sizes[d] != v)
                for d, v in zip(declared, seen, strict=False)
            )
            if wrong:
                types.types[name] = TensorInfo(name, info.elem_type, (None,) * len(seen))
                self.notes.append(
                    f"tensor {name!r} is declared {dims_text(declared)} but is {seen} at the profiled "
                    "shapes: declared with unknown dims instead"
                )

    def entry(self, name: str, shape: Shape) -> TensorContract:
        """The contract of ``name``, whose declared (described) shape is ``shape``."""
        normal = self.normalized(shape)
        seen = self.symbols_seen.get(name)
        if normal is not None and seen is not None and len(seen) == len(normal):
            normal = tuple(d if d is not None else s for d, s in zip(normal, seen, strict=True))
        profiled = self.observed.get(name) or self.settled(shape)
        if profiled is not None and normal is not None and len(profiled) != len(normal):
            profiled = None
        axis = None
        if self.batch is not None and normal is not None and self.batch in normal:
            axis = normal.index(self.batch)
        return TensorContract(normal, profiled, axis)


def required_opsets(model: onnx.ModelProto) -> tuple[tuple[str, int], ...]:
    """``(domain, version)`` of every op domain the model's nodes use, bodies and local functions
    included, with the version the model imports; sorted."""
    local = {(f.domain, f.name) for f in model.functions}
    used = {
        "" if n.domain == "ai.onnx" else n.domain
        for nodes in (model.graph.node, *(f.node for f in model.functions))
        for n in nodes_within(nodes)
        if (n.domain, n.op_type) not in local
    }
    versions = {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in model.opset_import}
    for f in model.functions:
        for o in f.opset_import:
            versions.setdefault("" if o.domain == "ai.onnx" else o.domain, int(o.version))
    return tuple(sorted((d, versions.get(d, 1)) for d in used))


__all__ = ["ContractMaker", "TensorContract", "batch_symbol", "required_opsets"]
