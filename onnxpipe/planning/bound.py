"""When one node bounds a plan: no cut goes below the costliest node, so stages beyond a count stop
helping.

The lower bound a plan reports is ``max(total / K, largest node)``; once the largest node wins, every
further stage only adds links.  A ratio of 1.000 to that bound then reads as perfect while a stage may
sit at a tenth of the bottleneck (GPT-2's LM head bounds every split past three stages).  The note says
which node, its share, and from which K on more stages stop helping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnxpipe.core.options import opt
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.model import ModelView
from onnxpipe.planning.types import Plan

NODE_SPLITTING = (
    f"only splitting that node itself could go further: {opt('split_nodes', 'auto')} cuts a MatMul, Gemm "
    "or Conv with constant weights into parts in consecutive stages"
)
"""What could go below a bounding node (:mod:`onnxpipe.planning.nodesplit`, ``split_nodes="auto"``)."""


@dataclass(frozen=True)
class Bound:
    """The costliest node, its share of the model's time and of the bottleneck, and ``useful_stages``:
    the most stages that can still help (``ceil(total / largest)``)."""

    node: str
    op_type: str
    seconds: float
    share_of_model: float
    share_of_bottleneck: float
    useful_stages: int


def bounding_node(view: ModelView, profile: Profile, plan: Plan) -> Bound | None:
    """The node that bounds ``plan`` (the largest node's cost reaches ``total / K``), else None."""
    costs = {n: profile.node_seconds.get(n, 0.0) for s in plan.stages for n in s.node_names}
    total = sum(costs.values())
    if plan.k < 2 or total <= 0:
        return None
    node, seconds = max(costs.items(), key=lambda item: item[1])
    if seconds * plan.k < total * (1 - 1e-9):
        return None
    info = view.node_by_name.get(node)
    return Bound(
        node=node,
        op_type=info.op_type if info is not None else "?",
        seconds=seconds,
        share_of_model=seconds / total,
        share_of_bottleneck=seconds / plan.bottleneck_seconds if plan.bottleneck_seconds > 0 else 1.0,
        useful_stages=max(1, math.ceil(total / seconds - 1e-9)),
    )


def bound_note(bound: Bound, k: int) -> str:
    """The plan's note for ``bound`` at ``k`` stages."""
    beyond = (
        f"{k} stages are no faster than {bound.useful_stages}"
        if k > bound.useful_stages
        else f"more than {bound.useful_stages} stages cannot help"
    )
    return (
        f"one node bounds this plan: {bound.node} ({bound.op_type}) costs {bound.seconds * 1e3:.3f} ms, "
        f"{bound.share_of_model:.0%} of the model's time and {bound.share_of_bottleneck:.0%} of the "
        f"bottleneck, and no cut goes below it: {beyond}; {NODE_SPLITTING}"
    )
