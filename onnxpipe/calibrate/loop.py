"""Calibration: time the exported stages and correct the profile the partition was made from.

Why: a profile attributes onnxruntime's time for the whole model to its nodes; a stage exported on its
own can run a few percent faster or slower than the share attributed to its nodes (fusions found or lost
at the cut, a session's per-run cost, regions spread by FLOPs), so a plan balanced on paper is a few
percent off when its stages run.  Running together, as a pipeline, they change again, and not alike:
the pipeline's own threads (the driver that hands micro-batches over, the caller that takes the results)
wake next to the last worker more than the first (the ``calibrate`` and ``pipeline`` benchmarks measure
both, ``benchmarks/results/calibrate.json``).

How: export the plan's stages to a scratch folder and time them, alone or together as a pinned thread
pipeline (:mod:`.timing`); scale every node of stage ``s`` by ``measured_s / estimated_s`` and partition
again, while the cut moves and a stage is off by more than ``tolerance``, at most ``rounds`` times.  The
corrected profile is an ordinary :class:`~onnxpipe.cost.profile.Profile`, on which the partitioner stays
exact: the final plan's estimates are the stages' own times.

Each round must run no worse than the one before by calibration's own measure, how evenly the timed cut
ran (:func:`measured_balance`, a ratio, so that rounds timed while the machine ran at different speeds
compare): a round that ran less evenly, by more than the tolerance, stops the calibration, and the cut
that ran the most evenly of those timed is kept, as it was planned (:func:`kept_round`); the note says
so.  Why: the correction assumes a stage costs the sum of its nodes, and a stage whose weights stay in
the CPU's cache between its runs costs less than its share of the whole model (``docs/devices.md``), so
one factor per stage can move the cut back and forth instead of settling.

A decoder balanced for both phases (:mod:`onnxpipe.planning.decoder_plan`) is calibrated at both
(:func:`calibrate_phases`): its stages are timed at the prompt's shapes and at a generation step's, and
each phase's profile is corrected by its own stage times.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from onnxpipe.calibrate.timing import StageTimer, time_stages
from onnxpipe.core.choices import Phase
from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt
from onnxpipe.cost.profile import Profile, corrected
from onnxpipe.ir.model import ModelView
from onnxpipe.planning.types import Plan

DEFAULT_TOLERANCE = 0.02


@dataclass(frozen=True)
class CalibrationRound:
    """One round: the cut, the stages' estimated and measured seconds, and the factors applied."""

    bounds: tuple[int, ...]
    estimated_seconds: tuple[float, ...]
    measured_seconds: tuple[float, ...]

    @staticmethod
    def of(plan: Plan, measured: Sequence[float], phase: Phase | None = None) -> CalibrationRound:
        """``plan``'s cut and its stages' estimates at ``phase`` (:func:`stage_estimates`) against the
        ``measured`` seconds."""
        return CalibrationRound(_bounds(plan), stage_estimates(plan, phase), tuple(measured))

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
    return tuple(dict(s.phase_seconds).get(phase, s.compute_seconds) for s in plan.stages)


@dataclass(frozen=True)
class Calibrated:
    """What a calibration hands back: the profiles the plan was made from, the plan, what each round
    timed and how evenly each timed cut ran; ``went_back``: the round whose timed cut was kept over the
    last correction's (None when the last correction stands), and ``stopped``: whether a round that ran
    less evenly than the one before ended the calibration early."""

    profiles: Mapping[Phase | None, Profile]
    plan: Plan
    rounds: tuple[Mapping[Phase | None, CalibrationRound], ...]
    balances: tuple[float, ...]
    went_back: int | None = None
    stopped: bool = False

    def note(self, how: str) -> str:
        """The manifest's note: how far the estimates were off in each round (at each phase, for a
        decoder calibrated at both), how evenly each timed cut ran, and which cut was kept."""
        said = _how_far(self.rounds, how) + _evenly(self.balances)
        n = len(self.rounds)
        if self.stopped:
            said += f"; round {n} ran less evenly than round {n - 1}, so calibration stopped there" + (
                "" if self.went_back is None else f" and kept the cut timed in round {self.went_back + 1}"
            )
        elif self.went_back is not None:
            said += f"; kept the cut timed in round {self.went_back + 1}, which ran the most evenly"
        if self.went_back is not None:
            return said + ": its estimates are those it was planned with"
        return said + "; the estimates below come from the corrected costs"


def _how_far(rounds: Sequence[Mapping[Phase | None, CalibrationRound]], how: str) -> str:
    n = len(rounds)
    each = ", ".join(f"{_off(r)} in round {i + 1}" for i, r in enumerate(rounds))
    return f"calibrated in {n} round(s), {how}: the estimates were off by up to {each}"


def _evenly(balances: Sequence[float]) -> str:
    """How evenly each timed cut ran, for the note (nothing for a single round that held)."""
    if len(balances) < 2:
        return ""
    shown = ", ".join(f"{b:.2f}" for b in balances)
    return f"; the busiest stage over the mean, as timed in each round: {shown}"


def worse_than_last(balances: Sequence[float], slack: float = 0.0) -> bool:
    """Whether the last timed cut ran less evenly than the one timed before it, by more than ``slack``
    (a fraction: rounds within it ran alike, as far as a timing on a drifting machine tells): calibration
    stops."""
    return len(balances) > 1 and balances[-1] > balances[-2] * (1.0 + slack)


def kept_round(
    balances: Sequence[float],
    timed_cuts: Sequence[object],
    last_cut: object,
    stopped: bool,
    slack: float = 0.0,
) -> int | None:
    """The timed round whose cut calibration hands back instead of the last plan (``last_cut``, the cut
    the last correction made), or None when the last plan stands.

    An earlier cut is kept when it ran more evenly than the last one timed (``balances[i]`` of the cut
    ``timed_cuts[i]``), by more than ``slack``, and the last plan is not that very cut; after a stop
    (``stopped``: the last timed round ran less evenly than the one before) the last plan is that worse
    cut, never kept.  Ties go to the earlier round.  Why the last correction stands within the slack:
    its estimates come from the most timings.  Plain numbers, so that the rule is tested without timing
    anything.
    """
    if not balances:
        return None
    best = min(range(len(balances)), key=lambda i: (balances[i], i))
    clearly = balances[-1] > balances[best] * (1.0 + slack)
    if stopped or (clearly and last_cut != timed_cuts[best]):
        return best if best != len(balances) - 1 else None
    return None


def _off(done: Mapping[Phase | None, CalibrationRound]) -> str:
    if list(done) == [None]:
        return f"{done[None].worst_error * 100:.1f}%"
    return ", ".join(f"{r.worst_error * 100:.1f}% at {p}" for p, r in done.items() if p is not None)


def calibrate_phases(
    view: ModelView,
    profiles: Mapping[Phase | None, Profile],
    make_plan: Callable[[Mapping[Phase | None, Profile]], Plan],
    *,
    rounds: int = 2,
    tolerance: float = DEFAULT_TOLERANCE,
    timer: StageTimer | None = None,
) -> Calibrated:
    """Correct the profiles a plan is made from by the stages' own times until the cut settles: one
    profile (``None``), or one per phase (a decoder's prompt and generation step, balanced together by
    :mod:`onnxpipe.planning.decoder_plan`): each round times the stages at every phase's shapes, corrects
    each phase's profile by that phase's stage times, and plans again from all of them; it stops when
    every phase's stages are within ``tolerance`` or the cut does not move.  Why both phases: a stage
    run alone differs from its share of the whole model by different amounts at the two shapes (a
    generation step's few tiny nodes make a session's per-run cost and a stage's copied nodes weigh far
    more), so each phase needs its own correction.  When a round runs less evenly than the one before,
    and which cut is kept then: :func:`run_rounds`.
    """
    measure = timer or time_stages

    def time_round(current: Mapping[Phase | None, Profile], plan: Plan) -> Rounds:
        return {
            phase: CalibrationRound.of(plan, measure(view, plan, prof), phase)
            for phase, prof in current.items()
        }

    def correct(
        current: Mapping[Phase | None, Profile], plan: Plan, done: Rounds
    ) -> dict[Phase | None, Profile]:
        stage_nodes = [s.node_names for s in plan.stages]
        return {p: corrected(prof, stage_nodes, done[p].factors) for p, prof in current.items()}

    return run_rounds(
        dict(profiles), make_plan, time_round, correct, lambda current: current, rounds, tolerance
    )


Rounds = Mapping[Phase | None, CalibrationRound]
"""What one round timed, at each phase (``None``: the plan's one profiled shape)."""
S = TypeVar("S")


def run_rounds(
    start: S,
    make_plan: Callable[[S], Plan],
    time_round: Callable[[S, Plan], Rounds],
    correct: Callable[[S, Plan, Rounds], S],
    profiles: Callable[[S], Mapping[Phase | None, Profile]],
    rounds: int,
    tolerance: float,
) -> Calibrated:
    """The rounds every calibration runs, on the costs ``start`` a plan is made from (profiles, or a
    devices file's costs): plan, time the plan's stages, and stop when every stage is within
    ``tolerance``, when the corrected costs plan the same cut on the same devices, or when the round ran
    less evenly than the one before (:func:`worse_than_last`; the module says why); else correct the
    costs and plan again.  The cut kept is the last one, or an earlier one that ran more evenly
    (:func:`kept_round`), as it was planned.
    """
    if rounds < 1:
        raise UsageError(f"{opt('CalibrationOptions.rounds', rounds)}: give at least 1 round")
    current = start
    plan = make_plan(current)
    history: list[Rounds] = []
    balances: list[float] = []
    timed: list[tuple[S, Plan]] = []  # each timed cut, as it was planned
    stopped = False
    for _ in range(rounds):
        done = time_round(current, plan)
        history.append(done)
        balances.append(measured_balance(done, _workers(plan)))
        timed.append((current, plan))
        stopped = worse_than_last(balances, tolerance)
        if stopped or max(r.worst_error for r in done.values()) <= tolerance:
            break
        current = correct(current, plan, done)
        new_plan = make_plan(current)
        moved = _where(new_plan) != _where(plan)
        plan = new_plan
        if not moved:  # same cut: the corrected estimates are the stages' own times already
            break
    kept = kept_round(balances, [_where(p) for _, p in timed], _where(plan), stopped, tolerance)
    if kept is not None:
        current, plan = timed[kept]
    return Calibrated(
        profiles(current), plan, tuple(history), tuple(balances), went_back=kept, stopped=stopped
    )


def _where(plan: Plan) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """A plan's cut and the devices its stages run on: what a new plan must change to count as moved."""
    return _bounds(plan), tuple(s.device for s in plan.stages)


def _workers(plan: Plan) -> tuple[int, ...] | None:
    """Each stage's worker when several stages share one (an interleaved split), else None."""
    if plan.workers is None:
        return None
    return tuple(s.index if s.worker is None else s.worker for s in plan.stages)


def measured_balance(
    done: Mapping[Phase | None, CalibrationRound], workers: Sequence[int] | None = None
) -> float:
    """How evenly a timed cut ran: over the phases, the worst of the busiest stage's measured time over
    the mean (of the busiest worker's, summing its stages, when ``workers`` says which runs which).  A
    ratio, so that rounds timed while the machine ran at different speeds compare; a round that
    measured nothing is not known to be even (infinity)."""
    worst = 0.0
    for r in done.values():
        seconds = list(r.measured_seconds)
        if workers is not None:
            per: dict[int, float] = {}
            for w, t in zip(workers, seconds, strict=True):
                per[w] = per.get(w, 0.0) + t
            seconds = list(per.values())
        total = sum(seconds)
        if not seconds or not total > 0:
            return math.inf
        worst = max(worst, max(seconds) * len(seconds) / total)
    return worst
