"""Calibration: time each exported stage alone and correct the profile the partition was made from.

Why: a profile attributes onnxruntime's time for the whole model to its nodes; a stage exported on its
own can run a few percent faster or slower than the share attributed to its nodes (fusions found or lost
at the cut, a session's per-run cost, regions spread by FLOPs).  On a 4-layer BERT the two halves ran
6.37 and 6.52 ms alone against estimates of 6.61 and 6.24 ms: a balanced plan on paper, 2% off when run.

How: export the plan's stages to a scratch folder, run each alone at the profiled shapes (its inputs
from running the earlier stages once), take the median of ``runs`` timed runs after ``warmup``, scale
every node of stage ``s`` by ``measured_s / estimated_s``, and partition again; repeat while the cut
moves and a stage is off by more than ``tolerance``, at most ``rounds`` times.  The corrected profile
is an ordinary :class:`~onnxpipe.profile.Profile`: the final plan's estimates are the stages' own times.
Only the profile's per-node seconds change; the partitioner stays exact on the corrected numbers.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from onnxpipe.errors import UsageError
from onnxpipe.export import export_stages
from onnxpipe.feeds import random_feeds
from onnxpipe.model import ModelView
from onnxpipe.ortsession import open_session, session_options
from onnxpipe.plan import Plan
from onnxpipe.profile import Profile

StageTimer = Callable[[ModelView, Plan, Profile], list[float]]
"""Seconds each stage of a plan takes alone (the default: :func:`time_stages`)."""

DEFAULT_TOLERANCE = 0.02


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


def time_stages(
    view: ModelView, plan: Plan, profile: Profile, *, runs: int = 30, warmup: int = 3
) -> list[float]:
    """Median seconds of each stage of ``plan`` run alone, at the profile's shapes and threads.

    The stages are exported to a scratch folder; stage ``s`` is fed what the earlier stages computed
    from one set of seeded random model inputs.
    """
    with tempfile.TemporaryDirectory(prefix="onnxpipe-calibrate-") as tmp:
        out = Path(tmp) / "stages"
        manifest = export_stages(view, plan, out, external_data="auto")
        values: dict[str, np.ndarray] = dict(random_feeds(view, profile.input_shapes))
        options = session_options(threads=profile.threads)
        seconds: list[float] = []
        for st in manifest.stages:
            session = open_session(out / st.file, options)
            feeds = {i.name: values[i.name] for i in session.get_inputs()}
            names = [o.name for o in session.get_outputs()]
            for _ in range(max(1, warmup)):
                results = session.run(names, feeds)
            values.update(zip(names, results, strict=True))
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                session.run(names, feeds)
                times.append(time.perf_counter() - start)
            seconds.append(statistics.median(times))
    return seconds


def corrected(profile: Profile, plan: Plan, factors: Sequence[float]) -> Profile:
    """``profile`` with every node of stage ``s`` of ``plan`` scaled by ``factors[s]``."""
    scale: dict[str, float] = {}
    for st, f in zip(plan.stages, factors, strict=True):
        for name in st.node_names:
            scale[name] = f
    node_seconds: Mapping[str, float] = {n: t * scale.get(n, 1.0) for n, t in profile.node_seconds.items()}
    return replace(profile, node_seconds=node_seconds, total_seconds=sum(node_seconds.values()))


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
    if rounds < 1:
        raise UsageError(f"--calibrate {rounds}: give at least 1 round")
    measure = timer or (lambda v, p, prof: time_stages(v, p, prof))
    plan = make_plan(profile)
    history: list[CalibrationRound] = []
    for _ in range(rounds):
        measured = measure(view, plan, profile)
        done = CalibrationRound(
            bounds=_bounds(plan),
            estimated_seconds=tuple(s.compute_seconds for s in plan.stages),
            measured_seconds=tuple(measured),
        )
        history.append(done)
        if done.worst_error <= tolerance:
            break
        profile = corrected(profile, plan, done.factors)
        new_plan = make_plan(profile)
        moved = _bounds(new_plan) != _bounds(plan)
        plan = new_plan
        if not moved:  # same cut: the corrected estimates are the stages' own times already
            break
    return profile, plan, history
