"""Calibration on the devices: each stage timed, the costs corrected, and the model partitioned again
(``split --calibrate --devices FILE``).

Why: a plan made from onnxruntime's costs, or from a device's costs scaled from them, is balanced on
paper; run on OpenVINO or tract its stages are not (each runtime fuses and vectorises differently, and
some of a runtime's time is attributed to nodes only by static cost: :mod:`onnxpipe.cost.runtime_profile`),
and even on onnxruntime a stage run alone, over and over as on a device of its own, is not the sum of its
nodes' shares of the whole model (its weights may stay in the CPU's cache between its runs when the
whole model's do not: ``docs/devices.md``).  This closes the loop with the stages as they run.

Where each stage is timed depends on whether its device is here
(:func:`onnxpipe.cluster.costs.timed_on_itself`):

* a device **here** (``profile_here``, its runtime available; its costs profiled on it) runs its stage on
  its own runtime and settings, and that time corrects its own costs (and those of every device here set
  up like it, so that a node moving to a twin keeps its time);
* a device only **described** (``speed``, ``op_speeds``, or a profile measured on it elsewhere) cannot be
  timed on itself: its stage is timed here as the reference profile was measured (onnxruntime on the CPU
  with the profile's threads), that time corrects the reference's *machine-relative* costs of the
  stage's nodes, and the device's costs follow them: the reference's divided by its declared speed (or
  its own profile scaled by the same correction).  Its speed is never replaced by this machine's.

The time a described device would take is the stage's time here converted as its costs are
(:func:`device_seconds`); the rounds compare those with the plan's estimates, and stop, and keep a cut,
as every calibration does (:func:`onnxpipe.calibrate.loop.run_rounds`).  The plan returned names the
devices as the devices file does, its cost records saying how they were calibrated.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from onnxpipe.calibrate.loop import DEFAULT_TOLERANCE, Calibrated, CalibrationRound, Rounds, run_rounds
from onnxpipe.calibrate.timing import in_turns, own_clock, ready_engines, scratch_stages
from onnxpipe.cluster.costs import CostMethod, DeviceCosts, reference_setting, timed_on_itself
from onnxpipe.cluster.model import Cluster, Device
from onnxpipe.core.choices import CostSource
from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt
from onnxpipe.core.runtime_kinds import EngineConfig
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.model import ModelView
from onnxpipe.planning.request import PlanRequest
from onnxpipe.planning.types import Plan

MakePlan = Callable[[Profile, PlanRequest], Plan]
DeviceTimer = Callable[[ModelView, Plan, Profile, Mapping[str, Device]], list[float]]
"""Seconds each stage of a plan takes here, opened as the device of its stage's name says (the
default: :func:`time_stages_on_devices`)."""


def timing_devices(cluster: Cluster, threads: int) -> dict[str, Device]:
    """What each device's stage is opened on here, by device name: a device here as it is; a described
    one as the reference profile was measured (onnxruntime on the CPU with its ``threads``)."""
    reference = EngineConfig(threads=threads)
    return {d.name: d if timed_on_itself(d) else Device(d.name, reference) for d in cluster.devices}


def how_timed(cluster: Cluster, threads: int) -> str:
    """How the stages of a plan for ``cluster`` are timed, for the note (``threads``: the reference
    profile's)."""
    clock = own_clock([d.engine_config() for d in timing_devices(cluster, threads).values()])[1]
    return (
        f"each stage timed alone {clock}, on its device's runtime, or, for a device not here, as the "
        "reference profile was measured and divided by the device's speed"
    )


def device_seconds(measured: float, device_estimate: float, machine_estimate: float, here: bool) -> float:
    """The seconds a stage takes on its device, from ``measured`` (its time here): the time itself for
    a device here; for a described one, the time here converted as the device's costs are converted
    from the reference's (``device_estimate / machine_estimate``: its speed, its op speeds or its own
    profile), a stage the reference gives no time keeping its estimate."""
    if here:
        return measured
    if machine_estimate > 0:
        return measured * device_estimate / machine_estimate
    return device_estimate


def time_stages_on_devices(
    view: ModelView,
    plan: Plan,
    profile: Profile,
    devices: Mapping[str, Device],
    *,
    runs: int = 20,
    warmup: int = 3,
) -> list[float]:
    """Median seconds of each stage of ``plan`` on the runtime ``devices`` gives its device's name, the
    stages taking turns, at the profile's shapes, by their :func:`~onnxpipe.calibrate.timing.own_clock`."""
    configs = {name: d.engine_config() for name, d in devices.items()}
    with scratch_stages(view, plan, profile) as (out, manifest):
        engines = list(ready_engines(view, profile, out, manifest, configs, warmup=warmup))
        return in_turns(engines, runs=runs, clock=own_clock(list(configs.values()))[0])


@dataclass(frozen=True)
class _Costs:
    """The costs a round's plan is made from: the reference profile (machine-relative, corrected by
    the stages timed as it was measured) and the rows of the devices that carry their own (a device
    here not at the reference's setting, corrected by its own stage; a described device's own profile,
    corrected as the reference)."""

    reference: Profile
    own: Mapping[str, Mapping[str, float]]
    calibrated: bool = False
    """Whether a round corrected these costs; the first plan, before any, reads the devices file as it
    is."""

    def corrected(self, plan: Plan, round_: CalibrationRound, cluster: Cluster) -> _Costs:
        """These costs with each stage's nodes scaled by what the round measured of it."""
        by_name = {d.name: d for d in cluster.devices}
        threads = self.reference.threads
        reference = dict(self.reference.node_seconds)
        own = {name: dict(row) for name, row in self.own.items()}
        for name, row in _own_rows(plan, cluster, threads).items():  # a device this plan uses first
            own.setdefault(name, dict(row))
        for stage, factor in zip(plan.stages, round_.factors, strict=True):
            device = by_name[stage.device]
            if timed_on_itself(device) and not reference_setting(device.engine, threads):
                alike = [d for d in cluster.devices if timed_on_itself(d) and d.engine == device.engine]
                rows = [own[d.name] for d in alike if d.name in own]
            else:  # timed as the reference: its machine-relative costs, and the described devices' own rows
                rows = [
                    reference,
                    *(own[d.name] for d in cluster.devices if d.name in own and not timed_on_itself(d)),
                ]
            for row in rows:
                for n in stage.node_names:
                    if n in row:
                        row[n] *= factor
        seconds = MappingProxyType(reference)
        fixed = dataclasses.replace(self.reference, node_seconds=seconds, total_seconds=sum(seconds.values()))
        return _Costs(fixed, {name: MappingProxyType(row) for name, row in own.items()}, calibrated=True)

    def cluster(self, cluster: Cluster, folder: Path) -> Cluster:
        """``cluster`` with every device that carries its own costs reading them from a scratch profile;
        the others (scaled from the reference, or at its setting) take the corrected reference as it is."""
        devices: list[Device] = []
        for i, d in enumerate(cluster.devices):
            if d.name not in self.own:
                devices.append(d)
                continue
            path = folder / f"device-{i}.json"
            seconds = MappingProxyType(dict(self.own[d.name]))
            dataclasses.replace(
                self.reference,
                source=CostSource.PROFILE,
                node_seconds=seconds,
                total_seconds=sum(seconds.values()),
            ).save(path)
            devices.append(dataclasses.replace(d, profile_path=str(path), profile_here=False))
        return Cluster(tuple(devices), cluster.links, cluster.source)


def _own_rows(plan: Plan, cluster: Cluster, threads: int) -> dict[str, Mapping[str, float]]:
    """The costs of the devices of ``plan`` that carry their own (not the reference's, scaled or not),
    as ``plan`` was made with them: a device first used after a correction (another order, another
    stage count) starts from its own costs, without the corrections made before it was used."""
    by_name = {d.name: d for d in cluster.devices}
    rows: dict[str, Mapping[str, float]] = {}
    for r in plan.device_costs:
        d = by_name[r.device]
        if d.profile_path is not None or (timed_on_itself(d) and not reference_setting(d.engine, threads)):
            rows[r.device] = r.node_seconds
    return rows


def _round(
    view: ModelView, plan: Plan, costs: _Costs, timer: DeviceTimer, cluster: Cluster
) -> CalibrationRound:
    """Time ``plan``'s stages and compare each device's time with the plan's estimate."""
    by_name = {d.name: d for d in cluster.devices}
    reference = costs.reference.node_seconds
    measured = timer(view, plan, costs.reference, timing_devices(cluster, costs.reference.threads))
    on_devices = [
        device_seconds(
            m,
            stage.compute_seconds,
            sum(reference.get(n, 0.0) for n in stage.node_names),
            timed_on_itself(by_name[stage.device]),
        )
        for stage, m in zip(plan.stages, measured, strict=True)
    ]
    return CalibrationRound.of(plan, on_devices)


def calibrate_on_devices(
    view: ModelView,
    profile: Profile,
    request: PlanRequest,
    make_plan: MakePlan,
    *,
    rounds: int = 2,
    tolerance: float = DEFAULT_TOLERANCE,
    timer: DeviceTimer | None = None,
) -> Calibrated:
    """The plan of ``request`` (which has devices) after calibrating every stage (see the module
    docstring), what each round measured (in the devices' seconds) and how evenly each cut ran."""
    cluster = _check(profile, request)
    measure = timer or time_stages_on_devices
    with tempfile.TemporaryDirectory(prefix="onnxpipe-calibrate-devices-") as tmp:

        def make(costs: _Costs) -> Plan:
            if not costs.calibrated:  # the first plan: the devices file as it is
                return make_plan(profile, request)
            devices = costs.cluster(cluster, Path(tmp))
            return make_plan(costs.reference, dataclasses.replace(request, devices=devices))

        def time_round(costs: _Costs, plan: Plan) -> Rounds:
            return {None: _round(view, plan, costs, measure, cluster)}

        def correct(costs: _Costs, plan: Plan, done: Rounds) -> _Costs:
            return costs.corrected(plan, done[None], cluster)

        calibrated = run_rounds(
            _Costs(profile, {}), make, time_round, correct, lambda c: {None: c.reference}, rounds, tolerance
        )
    return dataclasses.replace(
        calibrated, plan=_as_devices_file_says(calibrated.plan, cluster, profile.threads)
    )


def _check(profile: Profile, request: PlanRequest) -> Cluster:
    """The request's devices, after refusing what cannot be calibrated."""
    cluster = request.devices
    if cluster is None:
        raise UsageError(f"calibrating on devices needs a devices file ({opt('devices')})")
    described = [d.name for d in cluster.devices if not timed_on_itself(d)]
    if described and not profile.on_reference:
        raise UsageError(
            f"{cluster.label}: device {described[0]} is not here, so its stage is timed as the reference "
            f"profile was measured, in onnxruntime, and the profile was measured on {profile.runtime}: give "
            "a profile measured in onnxruntime, or set profile_here on every device"
        )
    return cluster


def _as_devices_file_says(plan: Plan, cluster: Cluster, threads: int) -> Plan:
    """``plan`` with its devices as the devices file wrote them (not the scratch profiles) and cost
    records saying how each device's costs were calibrated."""
    by_name = {d.name: d for d in cluster.devices}
    notes: list[DeviceCosts] = []
    for r in plan.device_costs:
        d = by_name[r.device]
        notes.append(DeviceCosts(r.device, *_calibrated_source(d, r, threads), r.node_seconds))
    kept = plan.cluster
    if kept is not None:
        kept = Cluster(tuple(by_name[d.name] for d in kept.devices), kept.links, kept.source)
    return dataclasses.replace(plan, device_costs=tuple(notes), cluster=kept)


def _calibrated_source(device: Device, record: DeviceCosts, threads: int) -> tuple[CostMethod, str]:
    """A calibrated device's cost method and source, as the devices file set it up (a device here
    read its corrected costs from a scratch profile)."""
    if timed_on_itself(device):
        on, own = device.engine.label, device.engine.threads
        return "profiled", f"profiled on {on} with {own} thread(s); calibrated per stage on {on}"
    here = f"its stages timed here in onnxruntime (CPUExecutionProvider) with {threads} thread(s)"
    if device.profile_path is not None:
        return "profile_file", (
            f"profile file {device.profile_path}; corrected as the reference's costs were ({here})"
        )
    return record.method, f"{record.source}; the reference calibrated ({here}), the speed kept"
