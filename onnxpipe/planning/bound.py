"""When one node bounds a plan: no cut goes below the costliest node, so stages beyond a count stop
helping.

The lower bound a plan reports is ``max(total / K, largest node)``; once the largest node wins, every
further stage only adds links.  A ratio of 1.000 to that bound then reads as perfect while a stage may
sit at a tenth of the bottleneck (GPT-2's LM head bounds every split past three stages).  The note says
which node, its share, and from which K on more stages stop helping.
"""

from __future__ import annotations

import math

from onnxpipe.core.options import opt
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.model import ModelView
from onnxpipe.planning.types import Plan


def bound_note(view: ModelView, profile: Profile, plan: Plan) -> str | None:
    """The plan's note when one node bounds it (the largest node's cost reaches ``total / K``): which
    node, its share of the model's time and of the bottleneck, and the most stages that can still help
    (``ceil(total / largest)``), and what could go below it (:mod:`onnxpipe.planning.nodesplit`); None
    when no node bounds it."""
    costs = {n: profile.node_seconds.get(n, 0.0) for s in plan.stages for n in s.node_names}
    total = sum(costs.values())
    if plan.k < 2 or total <= 0:
        return None
    node, seconds = max(costs.items(), key=lambda item: item[1])
    if seconds * plan.k < total * (1 - 1e-9):
        return None
    info = view.node_by_name.get(node)
    useful = max(1, math.ceil(total / seconds - 1e-9))
    of_bottleneck = seconds / plan.bottleneck_seconds if plan.bottleneck_seconds > 0 else 1.0
    beyond = (
        f"{plan.k} stages are no faster than {useful}"
        if plan.k > useful
        else f"more than {useful} stages cannot help"
    )
    return (
        f"one node bounds this plan: {node} ({info.op_type if info is not None else '?'}) costs "
        f"{seconds * 1e3:.3f} ms, {seconds / total:.0%} of the model's time and {of_bottleneck:.0%} of the "
        f"bottleneck, and no cut goes below it: {beyond}; only splitting that node itself could go further: "
        f"{opt('split_nodes', 'auto')} cuts a MatMul, Gemm or Conv with constant weights into parts in "
        "consecutive stages"
    )
