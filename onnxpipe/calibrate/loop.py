"""Calibration: time the exported stages and correct the profile the partition was made from.

Why: a profile attributes onnxruntime's time for the whole model to its nodes; a stage exported on its
own can run a few percent faster or slower than the share attributed to its nodes (fusions found or lost
at the cut, a session's per-run cost, regions spread by FLOPs), so a plan balanced on paper is a few
percent off when its stages run.  Running together, as a pipeline, they change again, and not alike:
the pipeline's own threads (the driver that hands micro-batches over, the caller that takes the results)
wake next to the last worker more than the first (the ``calibrate`` and ``pipeline`` benchmarks measure
both, ``benchmarks/results/calibrate.json``).

How: export the plan's stages to a scratch folder and time them
(:data:`onnxpipe.calibrate.modes.CalibrationMode`): ``alone`` runs each stage by itself at the
profiled shapes (its inputs from running the earlier stages once) and takes the median of ``runs``
timed runs after ``warmup``, the stages taking turns a few runs at a time; ``pipeline`` runs them
together as a thread pipeline, each worker pinned to CPUs of its own, and takes each worker's median
session time over a stream of micro-batches.  Then scale every node of stage ``s`` by
``measured_s / estimated_s`` and partition again; repeat while the cut moves and a stage is off by more
than ``tolerance``, at most ``rounds`` times.  The corrected profile is an ordinary
:class:`~onnxpipe.cost.profile.Profile`: the final plan's estimates are the stages' own times.  Only the
profile's per-node seconds change; the partitioner stays exact on the corrected numbers.  Of the cuts it
timed, calibration keeps the one that ran most evenly (:func:`kept_round`), so it never hands back a cut
that ran worse than one it measured.

A decoder balanced for both phases (:mod:`onnxpipe.plan.phases`) is calibrated at both
(:func:`calibrate_phases`): its stages are timed at the prompt's shapes and at a generation step's, and
each phase's profile is corrected by its own stage times.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from onnxpipe.calibrate.modes import DEFAULT_CALIBRATION_MODE, CalibrationMode
from onnxpipe.calibrate.timing import StageTimer, time_stages
from onnxpipe.core.errors import UsageError
from onnxpipe.cost.profile import Profile, corrected
from onnxpipe.ir.decoder_kinds import Phase
from onnxpipe.ir.model import ModelView
from onnxpipe.plan.types import Plan

DEFAULT_TOLERANCE = 0.02


@dataclass(frozen=True)
class CalibrationOptions:
    """Whether and how ``split`` calibrates: ``rounds`` of timing and partitioning again (0: none), each
    timing the stages as ``mode`` says."""

    rounds: int = 0
    mode: CalibrationMode = DEFAULT_CALIBRATION_MODE


@dataclass(frozen=True)
class CalibrationRound:
    """One round: the cut, the stages' estimated and measured seconds, and the factors applied."""

    bounds: tuple[int, ...]
    estimated_seconds: tuple[float, ...]
    measured_seconds: tuple[float, ...]

    @property
    def factors(self) -> tuple[float, ...]:
        pairs = zip(self.measured_seconds, self.estimated_seconds, strict=True)
        return tuple(m / e if e > 0 else 1.0 for m, e in pairs)

    @property
    def worst_error(self) -> float:
        """The largest ``|estimated - measured| / measured`` of the round."""
        pairs = zip(self.measured_seconds, self.estimated_seconds, strict=True)
        return max((abs(e - m) / m for m, e in pairs if m > 0), default=0.0)


def _bounds(plan: Plan) -> tuple[int, ...]:
    return tuple(len(s.node_names) for s in plan.stages)


def stage_estimates(plan: Plan, phase: Phase | None) -> tuple[float, ...]:
    """Each stage's estimated seconds at ``phase`` (a two-phase decoder plan keeps both phases'), or
    the plan's stage times for its one profiled shape (``None``)."""
    if phase is None:
        return tuple(s.compute_seconds for s in plan.stages)
    return tuple(dict(s.phase_seconds).get(phase.value, s.compute_seconds) for s in plan.stages)


def calibrate(
    view: ModelView,
    profile: Profile,
    make_plan: Callable[[Profile], Plan],
    *,
    rounds: int = 2,
    tolerance: float = DEFAULT_TOLERANCE,
    timer: StageTimer | None = None,
) -> tuple[Profile, Plan, list[CalibrationRound]]:
    """Correct ``profile`` by the stages' own times until the cut settles (see the module docstring).

    Returns the corrected profile, the plan made from it, and what each round measured.
    """
    fixed, plan, history = calibrate_phases(
        view,
        {None: profile},
        lambda profiles: make_plan(profiles[None]),
        rounds=rounds,
        tolerance=tolerance,
        timer=timer,
    )
    return fixed[None], plan, [done[None] for done in history]


def calibrate_phases(
    view: ModelView,
    profiles: Mapping[Phase | None, Profile],
    make_plan: Callable[[Mapping[Phase | None, Profile]], Plan],
    *,
    rounds: int = 2,
    tolerance: float = DEFAULT_TOLERANCE,
    timer: StageTimer | None = None,
) -> tuple[dict[Phase | None, Profile], Plan, list[dict[Phase | None, CalibrationRound]]]:
    """:func:`calibrate` for a plan made from several profiles of one model, one per phase (a decoder's
    prompt and generation step, balanced together by :mod:`onnxpipe.plan.phases`): each round times
    the stages at every phase's shapes, corrects each phase's profile by that phase's stage times, and
    plans again from all of them; it stops when every phase's stages are within ``tolerance`` or the
    cut does not move.  It keeps the cut that ran most evenly of those it timed (:func:`kept_round`):
    the last plan, with its corrected costs, when its cut is that one; else that round's plan as it was
    made, with the profiles it was made from.  Why both phases: a stage run alone differs from its
    share of the whole model by different amounts at the two shapes (a generation step's few tiny nodes
    make a session's per-run cost and a stage's copied nodes weigh far more), so each phase needs its
    own correction.
    """
    if rounds < 1:
        raise UsageError(f"--calibrate {rounds}: give at least 1 round")
    measure = timer or time_stages
    current = dict(profiles)
    plan = make_plan(current)
    history: list[dict[Phase | None, CalibrationRound]] = []
    timed: list[tuple[dict[Phase | None, Profile], Plan]] = []  # each timed cut, as it was planned
    for _ in range(rounds):
        done = {
            phase: CalibrationRound(
                bounds=_bounds(plan),
                estimated_seconds=stage_estimates(plan, phase),
                measured_seconds=tuple(measure(view, plan, prof)),
            )
            for phase, prof in current.items()
        }
        history.append(done)
        timed.append((current, plan))
        if max(r.worst_error for r in done.values()) <= tolerance:
            break
        stage_nodes = [s.node_names for s in plan.stages]
        current = {p: corrected(prof, stage_nodes, done[p].factors) for p, prof in current.items()}
        new_plan = make_plan(current)
        moved = _bounds(new_plan) != _bounds(plan)
        plan = new_plan
        if not moved:  # same cut: the corrected estimates are the stages' own times already
            break
    best = kept_round(history)
    if _bounds(plan) == history[best][next(iter(history[best]))].bounds:
        return current, plan, history
    return dict(timed[best][0]), timed[best][1], history


def measured_balance(done: Mapping[Phase | None, CalibrationRound]) -> float:
    """How evenly a timed cut ran: the worst phase's max/mean of the measured stage times (a ratio, so
    that rounds timed while the machine ran at different speeds compare)."""
    worst = 0.0
    for r in done.values():
        total = sum(r.measured_seconds)
        if total > 0:
            worst = max(worst, max(r.measured_seconds) * len(r.measured_seconds) / total)
    return worst


def kept_round(history: Sequence[Mapping[Phase | None, CalibrationRound]]) -> int:
    """The round whose cut calibration keeps: the one that ran most evenly when timed (the first of
    equals).  Why not simply the last: the correction assumes a stage costs the sum of its nodes, and
    where it does not (a generation step whose stage of two small layers keeps its weights in the cache
    and one of three does not) the corrected costs can move the cut to one that runs worse than a cut
    already timed; a cut never timed is not kept over one that was."""
    return min(range(len(history)), key=lambda i: (measured_balance(history[i]), i))
