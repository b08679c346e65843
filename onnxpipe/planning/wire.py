"""Boundaries compressed on the link (``boundary_dtype``): which tensors travel narrower, and what the
planner counts for them.

Only float32 activations are compressed: the model's inputs and outputs, weights, values of weights or
shapes alone, integers and booleans cross as they are.  For a fixed dtype every float32 activation that
crosses a cut is compressed, and the planner plans with their compressed bytes
(:meth:`BoundaryDtype.wire_bytes`: half for float16, a quarter plus a 4-byte scale for int8), so a cut is
placed where the bytes it really sends are few.  ``auto`` plans with float32 first, finds the cuts whose
transfer into a stage takes longer than the slowest stage computes (those that bound the pipeline at
their link's rate), and plans again with the tensors entering those stages as float16; without links of
a finite rate it compresses nothing and says so.  The exporter writes the casts into the stage files
(:func:`onnxpipe.export.stages.compress_stage`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType

from onnxpipe.core.choices import BoundaryDtype
from onnxpipe.core.options import opt
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapevalues import value_kinds
from onnxpipe.planning.request import PlanRequest
from onnxpipe.planning.sequences import tensor_sizes
from onnxpipe.planning.types import Plan, StageSpec

FLOAT32 = 1
"""``onnx.TensorProto.FLOAT``."""


def compressible(view: ModelView) -> frozenset[str]:
    """The float32 activations of ``view``: what a compressed boundary may narrow.  Not the values of
    weights or shapes alone (:mod:`onnxpipe.ir.shapevalues`), should one still cross: a ``Resize``'s
    scales or a mask of ``-3.4e38`` would change meaning, rounded."""
    ends = set(view.inputs) | set(view.outputs) | set(view.weights)
    kinds = value_kinds(view)
    return frozenset(
        n
        for n, t in view.tensors.items()
        if t.elem_type == FLOAT32 and n not in ends and not kinds.recomputable(n)
    )


def compressed_profile(view: ModelView, profile: Profile, wire: Mapping[str, BoundaryDtype]) -> Profile:
    """``profile`` with the tensors of ``wire`` at the bytes they take on the link."""
    if not wire:
        return profile
    sizes = tensor_sizes(view, profile)
    sizes.update({t: dtype.wire_bytes(sizes.get(t, 0)) for t, dtype in wire.items()})
    return dataclasses.replace(profile, tensor_bytes=MappingProxyType(sizes))


def plan_with_wire(
    view: ModelView,
    profile: Profile,
    request: PlanRequest,
    make: Callable[[Mapping[str, BoundaryDtype]], Plan],
) -> Plan:
    """The plan ``make`` makes with the tensors it is given at their compressed bytes
    (:func:`compressed_profile` of its profiles), those ``request.boundary_dtype`` compresses, and the
    tensors it compresses (:attr:`Plan.boundary_dtypes`, those that cross a cut)."""
    dtype = request.boundary_dtype
    if dtype == BoundaryDtype.FLOAT32:
        return make({})
    floats = compressible(view)
    sizes = MappingProxyType(tensor_sizes(view, profile))
    if dtype == BoundaryDtype.AUTO:
        first = make({})
        links = request.devices is not None or not math.isinf(request.bandwidth_bytes_per_s)
        slowest = max(s.compute_seconds for s in first.stages)
        # the stages whose transfer in takes longer than the slowest stage computes (at their links' rates)
        slow = [s.index for s in first.stages[1:] if links and s.transfer_seconds > slowest]
        if not slow:
            why = (
                "no link is slow enough to bound the pipeline"
                if links
                else f"there are no links to weigh (no {opt('devices')})"
            )
            note = f"{opt('boundary_dtype', BoundaryDtype.AUTO)}: every boundary stays float32: {why}"
            return dataclasses.replace(first, notes=(*first.notes, note))
        entering = {t for i in slow for t in first.stages[i].inputs if t in floats}
        wire = dict.fromkeys(entering, BoundaryDtype.FLOAT16)
    else:
        wire = dict.fromkeys(floats, dtype)
    made = make(wire)
    return dataclasses.replace(
        made, tensor_bytes=sizes, boundary_dtypes=MappingProxyType(_crossing(made, wire))
    )


def _crossing(plan: Plan, wire: Mapping[str, BoundaryDtype]) -> dict[str, BoundaryDtype]:
    """The tensors of ``wire`` that some stage of ``plan`` receives."""
    received: Collection[str] = {t for s in plan.stages for t in s.inputs}
    return {t: d for t, d in wire.items() if t in received}


def stage_boundary(wire: Mapping[str, BoundaryDtype], spec: StageSpec) -> BoundaryDtype:
    """What the compressed float32 activations ``spec`` receives cross as (``wire``: a plan's
    :attr:`~Plan.boundary_dtypes`; float32 when none is)."""
    return next((wire[t] for t in spec.inputs if t in wire), BoundaryDtype.FLOAT32)
