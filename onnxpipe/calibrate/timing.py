"""Timing a plan's stages on this machine, for calibration: each alone taking turns, or together as a
pinned thread pipeline; and the whole model once, for the machine's speed at that moment.

Why two ways, and why ``alone`` is the default, is :class:`onnxpipe.calibrate.options.CalibrationOptions`'
docstring; what the times are for is :mod:`onnxpipe.calibrate.loop`'s.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from onnxpipe.cluster.costs import reference_setting
from onnxpipe.core.choices import CalibrationMode, LocalMode, choice
from onnxpipe.core.errors import UsageError, error_line
from onnxpipe.core.options import opt
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.core.runtime_kinds import EngineConfig
from onnxpipe.core.runtimes import ALONE_BLOCK, Engine, median_seconds, open_engine, time_in_turns
from onnxpipe.cost.profile import Profile
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import Manifest
from onnxpipe.planning.types import Plan
from onnxpipe.runtime.affinity import available_cpus, cpu_sets, physical_cores
from onnxpipe.runtime.backends.ray_backend import RayBackend
from onnxpipe.runtime.backends.ray_resources import load_ray_resources
from onnxpipe.runtime.base import LocalConfig, RayConfig
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.spec import manifest_placements

StageTimer = Callable[[ModelView, Plan, Profile], list[float]]
"""Seconds each stage of a plan takes alone (the default: :func:`time_stages`)."""

TURNS_MAX_PARAM_BYTES = 1 << 30
"""Up to this many bytes of weights in all, stages timed alone take turns with all their sessions open;
beyond it they are timed one after the other, one session open at a time."""


MIN_RUNS = 30
MAX_RUNS = 1000
TIMED_SECONDS = 0.25
"""Stages timed alone run at least :data:`MIN_RUNS` times each, and more when they are short, up to
:data:`MAX_RUNS`, so that each is timed over about this many seconds.  Why: the median of 30 runs of a
stage of a millisecond spans 30 ms, and a machine whose speed drifts within seconds then moved the
stages' relative times by 10-20% from one timing to the next (a decoder's stages at its generation step,
GPT-2 at 8 layers in 3 stages, here); timed over a quarter of a second each they held within a few
percent at the prompt's shape."""

WINDOW_SECONDS = 1.0
WINDOW_MIN_RUNS = 5
"""On a cluster each stage is timed over a window of back-to-back runs at least this long (ten periods
of a CPU quota's usual 100 ms) and of at least this many runs: see :func:`time_stages_on_cluster`."""

PIPELINE_MICROBATCHES = 24
PIPELINE_REPEATS = 2
PIPELINE_WARMUP = 8
MAX_ROTATIONS = 4


@contextmanager
def scratch_stages(
    view: ModelView, plan: Plan, profile: Profile | None = None
) -> Iterator[tuple[Path, Manifest]]:
    """``plan``'s stages exported to a temporary folder (removed afterwards), and their manifest."""
    with tempfile.TemporaryDirectory(prefix="onnxpipe-calibrate-") as tmp:
        out = Path(tmp) / "stages"
        yield out, export_stages(view, plan, out, feeds=_first_sample(profile))


def time_stages(
    view: ModelView, plan: Plan, profile: Profile, *, runs: int | None = None, warmup: int = 3
) -> list[float]:
    """Median seconds of each stage of ``plan`` run alone (:func:`ready_engines`), ``runs`` times each
    (default :func:`timed_runs`), in turns; stages whose weights together pass
    :data:`TURNS_MAX_PARAM_BYTES` one after the other, one engine open at a time, as one stage alone fits
    where the whole model may not."""
    if runs is None:
        runs = timed_runs(profile.total_seconds / max(1, plan.k))
    with scratch_stages(view, plan, profile) as (out, manifest):
        stages = ready_engines(view, profile, out, manifest, warmup=warmup)
        if sum(st.param_bytes for st in manifest.stages) <= TURNS_MAX_PARAM_BYTES:
            return in_turns(list(stages), runs=runs)
        seconds: list[float] = []
        for stage in stages:
            seconds.extend(in_turns([stage], runs=runs, block=runs))
            del stage  # closed, and let go of, before the next one opens
        return seconds


def timed_runs(stage_seconds: float) -> int:
    """Runs that time a stage of about ``stage_seconds`` over :data:`TIMED_SECONDS` (at least
    :data:`MIN_RUNS`, at most :data:`MAX_RUNS`)."""
    if not stage_seconds > 0:
        return MIN_RUNS
    return max(MIN_RUNS, min(MAX_RUNS, math.ceil(TIMED_SECONDS / stage_seconds)))


ReadyStage = tuple[Engine, list[str], dict[str, np.ndarray]]
"""A stage's engine, its output names and the feeds it is timed on."""


def ready_engines(
    view: ModelView,
    profile: Profile,
    out: Path,
    manifest: Manifest,
    configs: Mapping[str, EngineConfig] | None = None,
    *,
    warmup: int = 3,
) -> Iterator[ReadyStage]:
    """Each stage of the split in ``out``, in stage order, open on the engine ``configs`` gives its
    device's name (default: onnxruntime on the CPU with the profile's threads, as the profile was
    measured), warmed up on what the earlier stages computed from :func:`profile_feeds` (a generator: a
    caller that drops each stage before taking the next holds one engine at a time)."""
    values: dict[str, np.ndarray] = profile_feeds(view, profile)
    reference = EngineConfig(threads=profile.threads)
    # on this machine's onnxruntime no runtime can be given instead: only calibration can be left out
    remedy = (
        "give its device another runtime"
        if configs is not None
        else f"leave out {opt('CalibrationOptions.rounds')}"
    )
    for st in manifest.stages:
        config = reference if configs is None else configs[st.device]
        where = f"stage {st.index} ({st.file})"

        def refused(e: Exception, where: str = where, label: str = config.label) -> Exception:
            return UsageError(f"{where} does not load in {label} ({error_line(e)}); {remedy}")

        engine = open_engine(out / st.file, config, fail=refused)
        feeds = {t.name: values[t.name] for t in st.inputs}
        names = [t.name for t in st.outputs]
        try:
            for _ in range(max(1, warmup)):
                results = engine.run(names, feeds)
        except Exception as e:
            engine.close()
            raise UsageError(f"stage {st.index} fails in {config.label} ({error_line(e)}); {remedy}") from e
        values.update(zip(names, results, strict=True))
        yield engine, names, feeds
        del engine, feeds, results


def in_turns(
    stages: Sequence[ReadyStage],
    *,
    runs: int,
    block: int = ALONE_BLOCK,
    clock: Callable[[], float] | None = None,
) -> list[float]:
    """:func:`~onnxpipe.core.runtimes.time_in_turns` of ``stages``, their engines closed afterwards."""
    try:
        return time_in_turns(stages, runs=runs, block=block, clock=clock)
    finally:
        for engine, _, _ in stages:
            engine.close()


def own_clock(configs: Sequence[EngineConfig]) -> tuple[Callable[[], float], str]:
    """The clock that times stages opened as ``configs`` say, and its name for the notes: the calling
    thread's CPU time when every stage runs in onnxruntime on the CPU with one thread, else the wall
    clock.

    Why: onnxruntime runs a one-thread session in the caller's thread, so that thread's CPU time is the
    stage's own work, and what other processes took of the CPU meanwhile is left out, as a device of
    its own would not lose it.  On a shared machine whose other processes kept most of its CPUs busy the
    wall clock swung the ratio of two stages' medians between 2.8x and 4.9x where their CPU times held
    at 3.1-3.2x (``benchmarks/bench_calibrate.py --devices``): a long stage is preempted more often than a
    short one, and its median stretched more.  Sessions with more threads, and other runtimes or
    providers, work on threads of their own (or a device's): only the wall clock sees all of it.
    """
    if configs and all(reference_setting(c, 1) for c in configs):
        return time.thread_time, "by the CPU time of its one thread"
    return time.perf_counter, "by the wall clock"


def time_stages_in_pipeline(
    view: ModelView,
    plan: Plan,
    profile: Profile,
    *,
    microbatches: int = PIPELINE_MICROBATCHES,
    repeats: int = PIPELINE_REPEATS,
    warmup: int = PIPELINE_WARMUP,
) -> list[float]:
    """Seconds of each stage's session run in a thread pipeline of ``plan``'s stages, each worker pinned
    to ``profile.threads`` CPUs of its own, streaming one set of seeded random inputs at the profile's
    shapes.

    The pipeline is opened once per rotation of the CPUs among the stages (K rotations, at most
    :data:`MAX_ROTATIONS`): a stage then does not look dear because its CPU was the slower one while it
    was timed (a neighbour on a shared host), while what the pipeline does to a stage wherever it runs
    (the driver waking next to the last worker) stays.  In each, after ``warmup`` micro-batches,
    ``repeats`` streams of ``microbatches`` give every stage's median; each stage's time is the median
    of those, so that a burst of other work during one stream does not set the cut.
    """
    k, t = len(plan.stages), profile.threads
    sets = cpu_sets([t] * k)  # None (a caller with too few CPUs): once, unpinned
    medians: list[list[float]] = []
    with scratch_stages(view, plan, profile) as (out, manifest):
        feeds = profile_feeds(view, profile)
        for turn in range(min(k, MAX_ROTATIONS) if sets else 1):
            own = sets[turn:] + sets[:turn] if sets else [()] * k
            placements = [replace(p, cpus=own[i]) for i, p in enumerate(manifest_placements(manifest, t))]
            with Pipeline.from_manifest(
                out, LocalConfig(mode=LocalMode.THREADS), placements=placements
            ) as pipe:
                medians += _stream_medians(pipe, feeds, warmup, max(1, repeats), microbatches)
    return [statistics.median(stage) for stage in zip(*medians, strict=True)]


def _stream_medians(
    pipe: Pipeline, feeds: Mapping[str, Any], warmup: int, repeats: int, microbatches: int
) -> list[list[float]]:
    """After ``warmup`` micro-batches, each stage's median session run in each of ``repeats`` streams of
    ``microbatches``."""
    pipe.run_many([feeds] * warmup)
    medians: list[list[float]] = []
    for _ in range(repeats):
        pipe.reset_stats()
        for _ in pipe.stream([feeds] * microbatches):
            pass
        runs = [[rec.run_end - rec.run_start for rec in st.records] for st in pipe.stats()]
        medians.append([statistics.median(r) for r in runs])
    return medians


def time_stages_on_cluster(
    view: ModelView, plan: Plan, profile: Profile, config: RayConfig, *, warmup: int = PIPELINE_WARMUP
) -> list[float]:
    """Seconds per run of each stage of ``plan`` on a Ray cluster, each stage's actor where ``config``
    puts it (its resources: the node it will run on), its files shipped there: after ``warmup``
    micro-batches of one set of seeded random inputs at the profile's shapes stream through the
    pipeline, every actor runs its stage back to back on what it received, all at once, for a window of
    :data:`WINDOW_SECONDS` (:meth:`~onnxpipe.runtime.backends.ray_backend.RayBackend.time_windows`).

    Why a window and not the median of the streamed runs: a node under a CPU quota ran each run of a few
    milliseconds at full speed and was throttled between runs, so the medians never showed it, and a
    stage on such a node kept an equal share of the work."""
    with scratch_stages(view, plan, profile) as (out, manifest):
        feeds = profile_feeds(view, profile)
        placements = manifest_placements(manifest, None if manifest.cluster else profile.threads)
        resources = config.resources
        if resources is not None and len(resources) != manifest.k:
            raise UsageError(
                f"{opt('CalibrationOptions.ray_resources')}: {len(resources)} entries for the {manifest.k} "
                "stages timed; give one per stage, or a default"
            )
        with Pipeline.from_manifest(out, config, placements=placements) as pipe:
            pipe.run_many([feeds] * max(1, warmup))
            assert isinstance(pipe.backend, RayBackend)
            return pipe.backend.time_windows(WINDOW_SECONDS, WINDOW_MIN_RUNS)


def cluster_timer(
    address: str | None, resources: Path | Sequence[Mapping[str, Any]] | None
) -> tuple[StageTimer, str]:
    """The stage timer of ``mode="ray"``, and how it times, for the note: each plan's stages on the
    cluster at ``address``, placed by ``resources`` (a resources file, read for the plan's number of
    stages, or one mapping per stage)."""

    def timer(view: ModelView, plan: Plan, profile: Profile) -> list[float]:
        given = load_ray_resources(resources, plan.k) if isinstance(resources, Path) else resources
        return time_stages_on_cluster(view, plan, profile, RayConfig(address=address, resources=given))

    return (
        timer,
        "each stage timed on its node of the Ray cluster over a window of back-to-back runs, all at once",
    )


REFERENCE_RUNS = 20


def profile_feeds(view: ModelView, profile: Profile) -> dict[str, Any]:
    """What the stages are timed on: the first of the user's samples the profile was made with
    (``--inputs``), else seeded random inputs at the profile's shapes."""
    first = _first_sample(profile)
    return dict(first) if first is not None else dict(random_feeds(view, profile.input_shapes))


def _first_sample(profile: Profile | None) -> dict[str, Any] | None:
    return profile.samples.first if profile is not None and profile.samples is not None else None


def time_model(
    view: ModelView, profile: Profile, *, runs: int = REFERENCE_RUNS, warmup: int = 3
) -> float | None:
    """Median seconds of the whole model's run at the profile's shapes and threads (the manifest's
    ``plan.reference_seconds`` after a calibration: the machine's speed at the moment the stages were
    timed); None for a model not loaded from a file."""
    source = view.session_source()
    if source is None:
        return None
    external = view.base_dir if isinstance(source, bytes) else None
    session = open_session(source, session_options(threads=profile.threads, external_dir=external))
    feeds = profile_feeds(view, profile)
    names = [o.name for o in session.get_outputs()]
    return median_seconds(lambda: session.run(names, feeds), runs=runs, warmup=max(1, warmup))


def choose_timer(
    mode: CalibrationMode, stages: int, threads: int, cpus: int | None = None, cores: int | None = None
) -> tuple[StageTimer, str]:
    """The stage timer for ``mode`` with ``stages`` stages of ``threads`` threads each, and how it
    times, for the manifest's note (see :data:`CalibrationMode`); ``cpus``: those this process may use,
    ``cores``: the physical cores they are on (default: asked).  A :class:`UsageError` for ``pipeline``
    on too few CPUs."""
    mode = choice(CalibrationMode, mode, "CalibrationOptions.mode")
    if cpus is None or cores is None:
        pool = available_cpus()
        cpus = len(pool) if cpus is None else cpus
        cores = len(physical_cores(pool)) if cores is None else cores
    needed = stages * threads
    if mode == "pipeline" and needed > cpus:
        raise UsageError(
            f"{opt('CalibrationOptions.mode', 'pipeline')} pins each of the {stages} stages' {threads} "
            f"thread(s) to a CPU of its own: {needed} CPUs, and this process may use {cpus}; use "
            f"{opt('CalibrationOptions.mode', 'alone')}"
        )
    if mode == "alone" or needed > cpus or (mode == "auto" and needed > cores):
        return time_stages, "each stage timed alone"
    return time_stages_in_pipeline, "the stages timed running together as a pinned thread pipeline"
