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

from onnxpipe.cluster import Cluster, load_cluster
from onnxpipe.costs import static_profile
from onnxpipe.errors import UsageError
from onnxpipe.export import check_exportable, export_stages
from onnxpipe.manifest import Manifest
from onnxpipe.model import ModelView, load_model
from onnxpipe.plan import Plan, make_plan
from onnxpipe.planner import ScheduleRequest, plan_pipeline
from onnxpipe.profile import Profile, profile_model
from onnxpipe.verification import VerifyReport, verify

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
    threads: int = 1,
    runs: int = 30,
    warmup: int = 3,
    shapes: Mapping[str, Sequence[int]] | None = None,
    progress: bool = False,
) -> Profile:
    """A profile for ``view``: a saved one (checked to belong to it), a measured one, or static costs."""
    if profile is not None:
        prof = profile if isinstance(profile, Profile) else Profile.load(Path(profile))
        prof.check_matches(view)
        return prof
    if cost not in COST_SOURCES:
        raise UsageError(f"--cost {cost!r}: choose one of {', '.join(COST_SOURCES)}")
    if threads < 1:
        raise UsageError(f"--threads {threads}: give a positive number of intra-op threads")
    if cost == "static":
        # static costs do not depend on threads, but the plan records what the stages will run with
        return dataclasses.replace(static_profile(view, shapes=shapes), threads=threads)
    return profile_model(view, threads=threads, runs=runs, warmup=warmup, shapes=shapes, progress=progress)


def plan(
    view: ModelView,
    profile: Profile,
    stages: int | str,
    *,
    devices: Cluster | str | Path | None = None,
    bandwidth_bytes_per_s: float = math.inf,
    order: str = "fixed",
    schedule: ScheduleRequest | None = None,
) -> Plan:
    """The plan for ``stages`` stages (or ``"auto"``): :func:`make_plan` on identical workers when no
    devices file, schedule or order is asked for, else :func:`onnxpipe.planner.plan_pipeline`."""
    if isinstance(stages, str) and stages != "auto":
        raise UsageError(f"--stages {stages!r}: give a number of stages or 'auto'")
    if order not in ("fixed", "free"):
        raise UsageError(f"--order {order!r}: choose fixed or free")
    cluster = load_cluster(devices) if isinstance(devices, str | Path) else devices
    simple = cluster is None and order == "fixed" and (schedule is None or schedule.kind == "stream")
    if simple and isinstance(stages, int):
        mb = schedule.microbatches if schedule is not None and schedule.microbatches else 8
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
    threads: int = 1,
    runs: int = 30,
    warmup: int = 3,
    bandwidth_bytes_per_s: float = math.inf,
    shapes: Mapping[str, Sequence[int]] | None = None,
    force: bool = False,
    run_verify: bool = True,
    external_data: str = "auto",
    progress: bool = False,
    devices: Cluster | str | Path | None = None,
    order: str = "fixed",
    schedule: ScheduleRequest | None = None,
) -> SplitResult:
    """Load, profile (or reuse a profile), partition optimally, export K stages, and verify them."""
    view = load_model(model)
    # refuse an output folder in use, or a model onnxruntime cannot run, before minutes of profiling
    check_exportable(view, out, force=force)
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
    the_plan = plan(
        view,
        prof,
        stages,
        devices=devices,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        order=order,
        schedule=schedule,
    )
    out_dir = Path(out)
    manifest = export_stages(view, the_plan, out_dir, force=force, external_data=external_data)
    report = verify(out_dir, shapes=shapes) if run_verify else None
    return SplitResult(plan=the_plan, manifest=manifest, out_dir=out_dir, report=report)
