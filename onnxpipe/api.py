"""The Python API: the same steps as the CLI, returning typed results instead of printing.

Each step can be called on its own (``load_model`` → ``profile_model`` → ``make_plan`` →
``export_stages`` → ``verify``) or all at once through :func:`split`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from onnxpipe.calibrate.loop import calibrate as run_calibration
from onnxpipe.calibrate.timing import DEFAULT_CALIBRATION_MODE, CalibrationMode, choose_timer, time_model
from onnxpipe.cluster.devicesfile import load_cluster
from onnxpipe.cluster.model import Cluster
from onnxpipe.core.errors import PartitionError, UsageError
from onnxpipe.cost.measure import profile_model
from onnxpipe.cost.profile import Profile
from onnxpipe.cost.static import static_profile
from onnxpipe.export.checks import check_exportable
from onnxpipe.export.stages import ExternalData, export_stages
from onnxpipe.ir.model import ModelView, load_model
from onnxpipe.manifest import Manifest
from onnxpipe.plan.cluster import plan_pipeline
from onnxpipe.plan.planner import DEFAULT_TIME_SLACK, make_interleaved_plan, make_plan
from onnxpipe.plan.request import ScheduleRequest
from onnxpipe.plan.types import Plan
from onnxpipe.verification.verify import VerifyReport, verify

COST_SOURCES = ("profile", "static")


@dataclass(frozen=True)
class SplitResult:
    """What :func:`split` produced: the plan, the manifest written, and the verification (if run)."""

    plan: Plan
    manifest: Manifest
    out_dir: Path
    report: VerifyReport | None


def get_profile(
    view: ModelView,
    *,
    cost: str = "profile",
    profile: Profile | str | Path | None = None,
    threads: int | None = None,
    runs: int = 30,
    warmup: int = 3,
    shapes: Mapping[str, Sequence[int]] | None = None,
    progress: bool = False,
) -> Profile:
    """A profile for ``view``: a saved one (checked to belong to it), a measured one, or static costs.

    A saved profile fixes the threads and input shapes its costs were measured with, so asking for
    other ones alongside it is refused rather than silently ignored.
    """
    if profile is not None:
        prof = profile if isinstance(profile, Profile) else Profile.load(Path(profile))
        prof.check_matches(view)
        name = Path(prof.origin).name if prof.origin else "the profile"
        if threads is not None and threads != prof.threads:
            raise UsageError(
                f"--threads {threads}: {name} was measured with {prof.threads} thread(s); "
                "profile again with --threads or leave --threads out"
            )
        if cost == "static":
            raise UsageError(f"--cost static: {name} holds measured costs; give one or the other")
        for inp, dims in (shapes or {}).items():
            if tuple(prof.input_shapes.get(inp, ())) != tuple(dims):
                raise UsageError(
                    f"--shape {inp}: {name} was measured at {inp}={list(prof.input_shapes.get(inp, ()))}; "
                    "profile again with this --shape or leave it out"
                )
        return prof
    threads = 1 if threads is None else threads
    if cost not in COST_SOURCES:
        raise UsageError(f"--cost {cost!r}: choose one of {', '.join(COST_SOURCES)}")
    if threads < 1:
        raise UsageError(f"--threads {threads}: give a positive number of intra-op threads")
    if cost == "static":
        # static costs do not depend on threads, but the plan records what the stages will run with
        return dataclasses.replace(static_profile(view, shapes=shapes), threads=threads)
    return profile_model(view, threads=threads, runs=runs, warmup=warmup, shapes=shapes, progress=progress)


def check_plan_request(
    stages: int | str,
    devices: Cluster | str | Path | None,
    order: str,
    schedule: ScheduleRequest | None,
    workers: int | None = None,
    time_slack: float | None = None,
) -> Cluster | None:
    """Validate what can be validated without costs (cheap, so it runs before profiling); returns the
    loaded cluster."""
    if isinstance(stages, str) and stages != "auto":
        raise UsageError(f"--stages {stages!r}: give a number of stages or 'auto'")
    if order not in ("fixed", "free"):
        raise UsageError(f"--order {order!r}: choose fixed or free")
    cluster = load_cluster(devices) if isinstance(devices, str | Path) else devices
    if workers is not None:
        _check_workers(stages, workers, cluster, order, schedule)
    if time_slack is not None:
        if workers is None or workers == stages:
            raise UsageError(
                f"--time-slack {time_slack}: it trades time for balanced weights between workers that run "
                "several stages each; give --workers W with --stages a multiple of W above W"
            )
        if not (math.isfinite(time_slack) and time_slack >= 0):
            raise UsageError(f"--time-slack {time_slack}: give a finite share of 0 or more (0.01 is 1%)")
    if stages == "auto" and cluster is None:
        raise UsageError("--stages auto needs --devices: the cluster bounds how many stages to try")
    if cluster is not None and isinstance(stages, int) and stages > cluster.size:
        raise PartitionError(
            f"{cluster.source or 'the devices file'}: {stages} stages need {stages} devices but it lists "
            f"{cluster.size}; choose --stages between 1 and {cluster.size}"
        )
    if schedule is not None:
        schedule.candidates()
    return cluster


def _check_workers(
    stages: int | str, workers: int, cluster: Cluster | None, order: str, schedule: ScheduleRequest | None
) -> None:
    """``--workers``: identical CPU workers streaming inference, each running the same number of stages."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise UsageError(f"--workers {workers!r}: give a positive number of workers")
    if not isinstance(stages, int):
        raise UsageError("--workers needs a number of --stages: an interleaved split deals them out in turn")
    if stages % workers:
        raise UsageError(
            f"--stages {stages} --workers {workers}: every worker runs the same number of stages; "
            f"give a multiple of {workers} stages"
        )
    if cluster is not None or order != "fixed":
        raise UsageError("--workers plans identical workers; it cannot be combined with --devices or --order")
    if schedule is not None and schedule.kind != "stream":
        raise UsageError(
            f"--workers: interleaved stages are planned for inference (--schedule stream), "
            f"not {schedule.kind}"
        )


def plan(
    view: ModelView,
    profile: Profile,
    stages: int | str,
    *,
    devices: Cluster | str | Path | None = None,
    bandwidth_bytes_per_s: float = math.inf,
    order: str = "fixed",
    schedule: ScheduleRequest | None = None,
    workers: int | None = None,
    time_slack: float | None = None,
) -> Plan:
    """The plan for ``stages`` stages (or ``"auto"``): :func:`make_plan` on identical workers when no
    devices file, schedule or order is asked for, :func:`make_interleaved_plan` when ``workers`` is fewer
    than the stages, else :func:`onnxpipe.planner.plan_pipeline`."""
    cluster = check_plan_request(stages, devices, order, schedule, workers, time_slack)
    simple = cluster is None and order == "fixed" and (schedule is None or schedule.kind == "stream")
    if simple and isinstance(stages, int):
        mb = schedule.microbatches if schedule is not None and schedule.microbatches else 8
        if workers is not None and workers != stages:
            return make_interleaved_plan(
                view,
                profile,
                stages,
                workers,
                bandwidth_bytes_per_s=bandwidth_bytes_per_s,
                microbatches=mb,
                time_slack=DEFAULT_TIME_SLACK if time_slack is None else time_slack,
            )
        return make_plan(view, profile, stages, bandwidth_bytes_per_s=bandwidth_bytes_per_s, microbatches=mb)
    return plan_pipeline(
        view,
        profile,
        stages if isinstance(stages, int) else "auto",
        cluster=cluster,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        order="free" if order == "free" else "fixed",
        schedule=schedule,
    )


def split(
    model: str | Path,
    stages: int | str,
    out: str | Path,
    *,
    profile: Profile | str | Path | None = None,
    cost: str = "profile",
    threads: int | None = None,
    runs: int = 30,
    warmup: int = 3,
    bandwidth_bytes_per_s: float = math.inf,
    shapes: Mapping[str, Sequence[int]] | None = None,
    force: bool = False,
    run_verify: bool = True,
    external_data: ExternalData = "auto",
    progress: bool = False,
    devices: Cluster | str | Path | None = None,
    order: str = "fixed",
    schedule: ScheduleRequest | None = None,
    calibrate: int = 0,
    calibrate_in: CalibrationMode = DEFAULT_CALIBRATION_MODE,
    workers: int | None = None,
    time_slack: float | None = None,
) -> SplitResult:
    """Load, profile (or reuse a profile), partition optimally, export K stages, and verify them.

    ``calibrate``: rounds of :mod:`onnxpipe.calibrate` (the stages timed, the profile corrected, the
    model partitioned again) before the final export; 0 for none.  ``calibrate_in``: how the stages are
    timed (:data:`~onnxpipe.calibrate.CalibrationMode`).
    """
    out_dir = Path(out).absolute()  # verification must find the folder even if "." is replaced
    view = load_model(model)
    # refuse an output folder in use, a model onnxruntime cannot run, or a bad devices file or
    # schedule before minutes of profiling
    check_exportable(view, out_dir, force=force)
    devices = check_plan_request(stages, devices, order, schedule, workers, time_slack)
    interleaved = workers is not None and workers != stages
    if calibrate and interleaved and calibrate_in == "pipeline":
        raise UsageError(
            "--calibrate-in pipeline times every stage on CPUs of its own, but interleaved stages share "
            "their workers' CPUs: use --calibrate-in alone"
        )
    if calibrate and devices is not None:
        raise UsageError(
            "--calibrate times the stages on this machine, which a devices file plans for other ones; "
            "give each device a profile measured on it (profile_path) instead"
        )
    prof = get_profile(
        view,
        cost=cost,
        profile=profile,
        threads=threads,
        runs=runs,
        warmup=warmup,
        shapes=shapes,
        progress=progress,
    )

    def make(p: Profile) -> Plan:
        return plan(
            view,
            p,
            stages,
            devices=devices,
            bandwidth_bytes_per_s=bandwidth_bytes_per_s,
            order=order,
            schedule=schedule,
            workers=workers,
            time_slack=time_slack,
        )

    if calibrate:
        k = stages if isinstance(stages, int) else len(make(prof).stages)
        timer, how = choose_timer("alone" if interleaved else calibrate_in, k, prof.threads)
        prof, the_plan, rounds = run_calibration(view, prof, make, rounds=calibrate, timer=timer)
        first, last = rounds[0], rounds[-1]
        note = (
            f"calibrated in {len(rounds)} round(s), {how}: the estimates were off by up to "
            f"{first.worst_error * 100:.1f}% at first"
            + (f", {last.worst_error * 100:.1f}% in round {len(rounds)}" if len(rounds) > 1 else "")
            + "; the estimates below come from the corrected costs"
        )
        # the machine's speed as the stages were timed, for a later run to compare its own with
        the_plan = dataclasses.replace(
            the_plan, notes=(*the_plan.notes, note), reference_seconds=time_model(view, prof)
        )
    else:
        the_plan = make(prof)
        measured_here = prof.source == "profile" and devices is None and prof.total_seconds > 0
        if measured_here:  # a measured profile's median whole run is the machine's speed it saw
            the_plan = dataclasses.replace(the_plan, reference_seconds=prof.total_seconds)
    manifest = export_stages(view, the_plan, out_dir, force=force, external_data=external_data)
    report = verify(out_dir, shapes=shapes) if run_verify else None
    return SplitResult(plan=the_plan, manifest=manifest, out_dir=out_dir, report=report)
