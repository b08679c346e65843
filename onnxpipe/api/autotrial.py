"""``split --stages auto`` on this machine: the chosen split run briefly against the whole model, and one
stage when the pipeline does not pay here.

``auto`` chooses the stage count from the estimates: the slowest stage over 1..CPUs stages.  The
estimates leave out what a pipeline adds per micro-batch (a hand-off between workers, a session call per
stage, the workers sharing the CPUs with the driver): on a small machine and a small model that is more
than the split saves, and ``run --compare`` then said the pipeline was slower than one session of the
whole model (0.66x for the sample ResNet on 2 CPUs, right after ``auto`` had chosen 2 stages).  So when
``auto`` chooses more than one stage here, the split is written to a temporary folder and run as ``run``
runs it, beside one session of the whole model (one thread, the baseline ``run --compare`` names
``session_1_thread``); when the pipeline's throughput is below that session's, the plan of one stage is
taken instead, and a note says why in one line.  The measurement is one function
(:func:`measure_gain`), which tests replace.
"""

from __future__ import annotations

import dataclasses
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path

from onnxpipe.core.errors import OnnxpipeError
from onnxpipe.core.options import opt
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.cost.profile import CostSource, Profile
from onnxpipe.export.options import ExportOptions
from onnxpipe.export.stages import write_stages
from onnxpipe.ir.model import ModelView
from onnxpipe.planning.request import PlanRequest
from onnxpipe.planning.types import Plan
from onnxpipe.runtime.inputs import input_shapes_for, random_inputs
from onnxpipe.runtime.pipeline import Pipeline

TRIAL_MICROBATCHES = 32
"""Micro-batches of one round of the short run, as many as ``run`` measures by default."""
TRIAL_ROUNDS = 3


def measure_gain(view: ModelView, plan: Plan) -> float:
    """The pipeline's throughput over one session's of the whole model (one thread), on the same random
    micro-batches at the planned shapes: ``plan`` written to a temporary folder and run as ``run`` runs
    it by default (thread workers: no process is started, so a caller's script needs no ``__main__``
    guard); each side's best of :data:`TRIAL_ROUNDS` rounds of :data:`TRIAL_MICROBATCHES`."""
    assert view.path is not None
    with tempfile.TemporaryDirectory(prefix="onnxpipe-auto-") as tmp:
        out = Path(tmp) / "stages"
        manifest = write_stages(view, plan, out, ExportOptions())
        feeds = random_inputs(view.path, input_shapes_for(manifest, view.path, {}), TRIAL_MICROBATCHES)
        session = open_session(view.path, session_options(threads=1))
        with Pipeline.from_manifest(out) as pipe:
            pipe.run_many(feeds[:4])  # warm-up
            piped = min(timeit.repeat(lambda: pipe.run_many(feeds), number=1, repeat=TRIAL_ROUNDS))
        session.run(None, feeds[0])
        whole = min(
            timeit.repeat(lambda: [session.run(None, f) for f in feeds], number=1, repeat=TRIAL_ROUNDS)
        )
    return whole / piped if piped > 0 else 1.0


def paid_here(
    view: ModelView,
    the_plan: Plan,
    profile: Profile,
    request: PlanRequest,
    one_stage: Callable[[], Plan],
    gain: Callable[[ModelView, Plan], float] | None = None,
) -> Plan:
    """``the_plan`` when ``auto`` chose one stage, or when its pipeline beats one session of the whole
    model in a short run here (``gain``, default :func:`measure_gain`); else ``one_stage()``, with a note
    that says why.  Only for ``auto`` on this machine (no devices file), on measured costs of a model file
    with no node cut (a static profile says nothing of this machine's speed)."""
    applies = (
        request.stages == "auto"
        and request.devices is None
        and the_plan.k > 1
        and not the_plan.node_splits
        and profile.source == CostSource.PROFILE.value
        and view.path is not None
    )
    if not applies:
        return the_plan
    try:
        ratio = (gain or measure_gain)(view, the_plan)
    except (OnnxpipeError, OSError, RuntimeError) as e:  # random inputs a model refuses, a full disk...
        note = f"{opt('stages', 'auto')}: the split could not be run against the whole model here ({e})"
        return dataclasses.replace(the_plan, notes=(*the_plan.notes, note))
    measured = (
        f"a short run of the {the_plan.k}-stage pipeline here gave {ratio:.2f}x the throughput of one "
        "session of the whole model (one thread)"
    )
    if ratio >= 1.0:
        return dataclasses.replace(the_plan, notes=(*the_plan.notes, f"{opt('stages', 'auto')}: {measured}"))
    whole = one_stage()
    note = (
        f"{opt('stages', 'auto')} chose 1 stage: {measured}; on this machine the hand-offs between stages "
        f"cost more than the split saves (give {opt('stages')} K to split anyway)"
    )
    return dataclasses.replace(
        whole, notes=(*whole.notes, note), stage_counts_tried=the_plan.stage_counts_tried
    )
