"""Calibration on the devices: each stage timed on its own device's runtime, the devices' costs corrected,
and the model partitioned again (``split --calibrate --devices FILE``).

Why: a plan made from onnxruntime's costs, or from a device's costs scaled from them, is balanced on
paper; run on OpenVINO or tract its stages are not (each runtime fuses and vectorises differently, and
some of a runtime's time is attributed to nodes only by static cost: :mod:`onnxpipe.cost.runtime_profile`).
This closes the loop on the runtime each stage will run on.

How: the first plan gives every device's per-node costs (its own profile, measured here on its runtime, or
scaled).  Each round exports the plan's stages to a scratch folder, opens stage ``s`` on device ``s``'s
engine (:mod:`onnxpipe.core.runtimes`), feeds it what the earlier stages computed from one set of seeded
random inputs, and times the stages in turns (:func:`onnxpipe.calibrate.timing.time_in_turns`).  The
costs of device ``s`` (and of every device set up like it) for the nodes of stage ``s`` are scaled by
``measured / estimated``, written as each device's profile in a scratch folder (so that the next plan
reads them instead of measuring again), and the model is partitioned again; until the cut settles or
every stage is within ``tolerance``.  The plan returned names the devices as the devices file does, its
cost records saying they were calibrated.

Every device of the plan must be available here (its runtime installed, its provider or OpenVINO device
present): a stage is timed where it will run, never extrapolated.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType

import numpy as np

from onnxpipe.calibrate.loop import DEFAULT_TOLERANCE, CalibrationRound
from onnxpipe.calibrate.timing import scratch_stages, time_in_turns
from onnxpipe.cluster.costs import DeviceCosts, provider_available
from onnxpipe.cluster.model import Cluster, Device, _frozen
from onnxpipe.core.choices import CostSource
from onnxpipe.core.errors import UsageError, error_line
from onnxpipe.core.options import opt
from onnxpipe.core.runtimes import Engine, open_engine
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import Manifest
from onnxpipe.planning.request import PlanRequest
from onnxpipe.planning.types import Plan

MakePlan = Callable[[Profile, PlanRequest], Plan]
DeviceTimer = Callable[[ModelView, Plan, Profile, Mapping[str, Device]], list[float]]


def check_devices_here(cluster: Cluster) -> None:
    """Refuse, naming the device, a cluster with a device this machine cannot run a stage on."""
    for i, d in enumerate(cluster.devices):
        if not provider_available(d):
            raise UsageError(
                f"{cluster.label}: devices[{i}] ({d.name}) runs on {d.runtime_label}, which is not available "
                f"here, so {opt('CalibrationOptions.rounds')} cannot time its stage; calibrate on a machine "
                "that has every device, or give that device a profile measured on it (profile_path) and "
                "leave "
                f"{opt('CalibrationOptions.rounds')} out"
            )


def time_stages_on_devices(
    view: ModelView,
    plan: Plan,
    profile: Profile,
    devices: Mapping[str, Device],
    *,
    runs: int = 20,
    warmup: int = 3,
) -> list[float]:
    """Median seconds of each stage of ``plan`` on its device's runtime (``devices`` by name), the stages
    taking turns, at the profile's shapes."""
    with scratch_stages(view, plan) as (out, manifest):
        engines = list(ready_engines(view, profile, out, manifest, devices, warmup))
        try:
            return time_in_turns(engines, runs=runs)
        finally:
            for engine, _, _ in engines:
                engine.close()


def ready_engines(
    view: ModelView,
    profile: Profile,
    out: Path,
    manifest: Manifest,
    devices: Mapping[str, Device],
    warmup: int,
) -> Iterator[tuple[Engine, list[str], dict[str, np.ndarray]]]:
    """Each stage of the split in ``out`` open on its device's engine (``devices`` by the manifest's
    device names), warmed up on what the earlier stages computed from one set of seeded random inputs,
    with its output names and the feeds it is timed on."""
    values: dict[str, np.ndarray] = dict(random_feeds(view, profile.input_shapes))
    for st in manifest.stages:
        device = devices[st.device]
        config = device.engine_config()
        where = f"stage {st.index} ({st.file})"

        def refused(e: Exception, where: str = where, label: str = config.label) -> Exception:
            return UsageError(
                f"{where} does not load in {label} ({error_line(e)}); give its device another runtime"
            )

        engine = open_engine(out / st.file, config, fail=refused)
        feeds = {t.name: values[t.name] for t in st.inputs}
        names = [t.name for t in st.outputs]
        try:
            for _ in range(max(1, warmup)):
                results = engine.run(names, feeds)
        except Exception as e:
            engine.close()
            raise UsageError(
                f"stage {st.index} fails in {config.label} ({error_line(e)}); give its device another runtime"
            ) from e
        values.update(zip(names, results, strict=True))
        yield engine, names, feeds


def calibrate_on_devices(
    view: ModelView,
    profile: Profile,
    request: PlanRequest,
    make_plan: MakePlan,
    *,
    rounds: int = 2,
    tolerance: float = DEFAULT_TOLERANCE,
    timer: DeviceTimer | None = None,
) -> tuple[Plan, list[CalibrationRound]]:
    """The plan of ``request`` (which has devices) after calibrating every stage on its device (see the
    module docstring), and what each round measured."""
    if rounds < 1:
        raise UsageError(f"{opt('CalibrationOptions.rounds', rounds)}: give at least 1 round")
    cluster = request.devices
    if cluster is None:
        raise UsageError(f"calibrating on devices needs a devices file ({opt('devices')})")
    check_devices_here(cluster)
    measure = timer or time_stages_on_devices
    by_name = {d.name: d for d in cluster.devices}
    plan = make_plan(profile, request)
    records = {r.device: r for r in plan.device_costs}
    costs = {r.device: dict(r.node_seconds) for r in plan.device_costs}
    history: list[CalibrationRound] = []
    with tempfile.TemporaryDirectory(prefix="onnxpipe-calibrate-devices-") as tmp:
        for _ in range(rounds):
            measured = measure(view, plan, profile, by_name)
            done = CalibrationRound(
                bounds=tuple(len(s.node_names) for s in plan.stages),
                estimated_seconds=tuple(s.compute_seconds for s in plan.stages),
                measured_seconds=tuple(measured),
            )
            history.append(done)
            if done.worst_error <= tolerance:
                break
            for stage, factor in zip(plan.stages, done.factors, strict=True):
                # devices set up alike (same runtime and settings, here) run a node alike: the stage's
                # measurement corrects all of them, so that a node moving to a twin keeps its time
                config = by_name[stage.device].engine_config()
                for name in [d.name for d in cluster.devices if d.engine_config() == config]:
                    row = costs.setdefault(name, {})
                    for n in stage.node_names:
                        row[n] = row.get(n, 0.0) * factor
            calibrated = _with_profiles(cluster, profile, costs, Path(tmp))
            new_plan = make_plan(profile, dataclasses.replace(request, devices=calibrated))
            moved = [len(s.node_names) for s in new_plan.stages] != [len(s.node_names) for s in plan.stages]
            plan = new_plan
            if not moved:
                break
    return _as_devices_file_says(plan, by_name, records, costs), history


def _with_profiles(
    cluster: Cluster, profile: Profile, costs: Mapping[str, Mapping[str, float]], folder: Path
) -> Cluster:
    """``cluster`` with every device whose costs are known reading them from a profile of its own."""
    devices: list[Device] = []
    for d in cluster.devices:
        if d.name not in costs:
            devices.append(d)
            continue
        path = folder / f"device-{len(devices)}.json"
        seconds = MappingProxyType(dict(costs[d.name]))
        dataclasses.replace(
            profile,
            source=CostSource.PROFILE,
            node_seconds=seconds,
            total_seconds=sum(seconds.values()),
        ).save(path)
        devices.append(
            dataclasses.replace(d, profile_path=str(path), profile_here=False, speed=1.0, op_speeds=_frozen())
        )
    return Cluster(tuple(devices), cluster.links, cluster.source)


def _as_devices_file_says(
    plan: Plan,
    by_name: Mapping[str, Device],
    records: Mapping[str, DeviceCosts],
    costs: Mapping[str, Mapping[str, float]],
) -> Plan:
    """``plan`` with its devices as the devices file wrote them (not the scratch profiles) and cost
    records saying each device's costs were calibrated on it."""
    notes: list[DeviceCosts] = []
    for r in plan.device_costs:
        first = records.get(r.device, r)
        device = by_name[r.device]
        notes.append(
            DeviceCosts(
                r.device,
                "profiled",
                f"{first.source}; calibrated per stage on {device.runtime_label}",
                _frozen(costs.get(r.device, r.node_seconds)),
            )
        )
    cluster = plan.cluster
    if cluster is not None:
        cluster = Cluster(tuple(by_name[d.name] for d in cluster.devices), cluster.links, cluster.source)
    return dataclasses.replace(plan, device_costs=tuple(notes), cluster=cluster)
