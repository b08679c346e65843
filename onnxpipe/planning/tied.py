"""A tied token embedding and LM head held once: the first and the last stage on one worker.

Where one table is both the embedding (read by the model's first nodes) and the LM head (its last ones,
:func:`onnxpipe.ir.decoder.tied_tables`), ``K`` stages on ``K`` workers hold it twice, the first
worker and the last: +30% over the whole model's weights for a tied 0.5B int4 model at two stages, the
memory a pipeline exists to save.  ``K + 1`` stages dealt out to the same ``K`` workers in turn put the
last stage back on worker 0 with the first, which holds the table once (the interleaved search of
:func:`onnxpipe.planning.workers.make_interleaved_plan`, which balances the workers, not the stages).

For a plain ``stages=K`` (no ``workers``) the planner makes both and keeps the tied layout where the
share of weight memory it saves is at least the share of bottleneck it costs (:func:`worth_it`): one
percent of the pipeline's weights buys one percent of its speed.  ``workers=K`` keeps a stage per
worker, ``stages=K+1 workers=K`` the tied layout, whatever they cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from onnxpipe.core.choices import Ends
from onnxpipe.core.errors import PartitionError, UsageError
from onnxpipe.core.options import opt
from onnxpipe.core.text import human_bytes
from onnxpipe.ir.decoder import tied_tables
from onnxpipe.ir.model import ModelView
from onnxpipe.planning.request import PlanRequest
from onnxpipe.planning.types import Plan
from onnxpipe.planning.workers import worker_weights


def worth_it(plain: Plan, tied: Plan, plain_bytes: int, tied_bytes: int) -> bool:
    """The rule: the tied layout is kept when it holds fewer bytes over the workers and its bottleneck is
    slower than the plain split's by at most the share of those bytes it saves."""
    saved = 1 - tied_bytes / plain_bytes if plain_bytes > 0 else 0.0
    return saved > 0 and _slower(plain, tied) <= saved


def _slower(plain: Plan, tied: Plan) -> float:
    if plain.bottleneck_seconds <= 0:
        return 0.0 if tied.bottleneck_seconds <= 0 else float("inf")
    return tied.bottleneck_seconds / plain.bottleneck_seconds - 1


def keeping_tied(view: ModelView, request: PlanRequest, plan_for: Callable[[PlanRequest], Plan]) -> Plan:
    """The plan ``plan_for`` makes of ``request``; for a plain ``stages=K`` (K >= 2, no ``workers``) on
    identical workers of a model with a tied table, the better by :func:`worth_it` of K stages on K
    workers and K + 1 stages on K workers, its notes saying which and why (and why not, off identical
    workers or with ``ends="own"``)."""
    k = request.stages
    if not (isinstance(k, int) and k >= 2 and request.workers is None):
        return plan_for(request)
    tables = tied_tables(view)
    if not tables:
        return plan_for(request)
    named = ", ".join(f"{t} ({human_bytes(view.weights[t])})" for t in tables)
    what = f"the token embedding and the LM head share {named}"
    held = f"{what}, held by the first and the last of {k} workers: {k + 1} stages on {k} workers"
    if not request.on_identical_workers:
        return _noted(
            plan_for(request),
            f"{what}, held by the first and the last stage's devices: {k + 1} stages on {k} workers, "
            f"which would hold it once, are planned on identical workers only, not with "
            f"{request.off_the_chain}",
        )
    if request.decoder.ends == Ends.OWN:
        return _noted(
            plan_for(request),
            f"{held}, which would hold it once, are not planned with {opt('ends', Ends.OWN)}",
        )
    plain = plan_for(replace(request, workers=k))
    try:
        tied = plan_for(replace(request, stages=k + 1, workers=k))
    except (PartitionError, UsageError):
        return _noted(plain, f"{held} cannot be made")
    plain_bytes = sum(worker_weights(view, plain.stages, k))
    tied_bytes = sum(worker_weights(view, tied.stages, k))
    saved, slower = plain_bytes - tied_bytes, _slower(plain, tied)
    figures = (
        f"{human_bytes(saved)} ({saved / max(1, plain_bytes):.1%}) less weight memory over the workers for "
        f"a {abs(slower):.2%} {'slower' if slower >= 0 else 'faster'} bottleneck"
    )
    if worth_it(plain, tied, plain_bytes, tied_bytes):
        return _noted(
            tied,
            f"{what}: {k + 1} stages on {k} workers, the last on worker 0 with the first, "
            f"hold it once: {figures} (kept: the share of memory it saves is at least the share of time); "
            f"{opt('workers', k)} keeps a stage per worker",
        )
    return _noted(
        plain,
        f"{held} would hold it once, {figures} (not kept: the share of time is above that of memory); "
        f"{opt('stages', k + 1)} {opt('workers', k)} asks for it",
    )


def _noted(plan: Plan, note: str) -> Plan:
    return replace(plan, notes=(*plan.notes, note))
