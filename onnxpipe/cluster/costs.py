"""Each device's cost of every node: read from its own profile, measured here, or scaled from the reference.

The planner needs one cost per node *on each device*; how each was obtained is recorded
(:class:`DeviceCosts`) so that the manifest says whether a number was measured or extrapolated.  The
profiler and the profile reader are passed in as callables, so that this room needs nothing of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from onnxpipe.cluster.model import REFERENCE_PROVIDER, Cluster, Device, _frozen
from onnxpipe.core.errors import UsageError
from onnxpipe.core.runtime_kinds import EngineConfig
from onnxpipe.core.runtimes import runs_here

CostMethod = Literal["profile_file", "profiled", "scaled"]


@dataclass(frozen=True)
class DeviceCosts:
    """Node seconds of the model on one device, and how they were obtained (for the manifest).

    ``method`` is ``"profile_file"`` (the device's own saved profile), ``"profiled"`` (measured here on the
    device's provider) or ``"scaled"`` (the reference profile divided by ``speed`` or ``op_speeds``);
    ``source`` says the same in words, e.g. ``"scaled from reference by speed 3"``.
    """

    device: str
    method: CostMethod
    source: str
    node_seconds: Mapping[str, float] = field(repr=False)


def timed_on_itself(device: Device) -> bool:
    """Whether ``device`` is here to be measured on: no profile of its own was given, it asks to be
    profiled here (``profile_here``) and its runtime and provider are available.  Any other device is
    only described (its ``speed``, ``op_speeds`` or a profile measured on it elsewhere): this machine can
    time its stage only as the reference profile was measured, never as the device runs it."""
    return device.profile_path is None and device.profile_here and runs_here(device.engine)


def reference_setting(engine: EngineConfig, reference_threads: int | None = None) -> bool:
    """Whether ``engine`` runs as the reference profile was measured (what ``onnxpipe profile`` measures):
    onnxruntime on :data:`REFERENCE_PROVIDER` without options, with the reference's threads (``None``:
    not compared)."""
    return (
        engine.kind.reference
        and engine.provider == REFERENCE_PROVIDER
        and not engine.provider_options
        and (reference_threads is None or engine.threads == reference_threads)
    )


def scale_costs(
    node_seconds: Mapping[str, float], op_types: Mapping[str, str], device: Device
) -> dict[str, float]:
    """Reference node seconds as they would be on ``device``: each divided by the speed of its op type.

    A node missing from ``op_types`` gets the device's overall ``speed``.
    """
    return {n: float(t) / device.speed_of(op_types.get(n, "")) for n, t in node_seconds.items()}


def describe_scaling(device: Device) -> str:
    """``"scaled from reference by speed 3"`` (plus the per-op-type speeds when there are any)."""
    text = f"scaled from reference by speed {device.speed:g}"
    if device.op_speeds:
        per_op = ", ".join(f"{k} {v:g}" for k, v in sorted(device.op_speeds.items()))
        text += f" ({per_op})"
    return text


def device_costs(
    cluster: Cluster,
    reference: Mapping[str, float],
    op_types: Mapping[str, str],
    *,
    measure: Callable[[Device], Mapping[str, float]] | None = None,
    load: Callable[[Device, str], Mapping[str, float]] | None = None,
    reference_threads: int | None = None,
) -> tuple[DeviceCosts, ...]:
    """Node seconds on every device of ``cluster``, each with a record of how it was obtained.

    In order of preference, because a measurement on the device beats an extrapolation:

    1. ``profile_path``: ``load(device, path)`` reads the device's own profile of this model (it should
       raise :class:`~onnxpipe.core.errors.ProfileError` if the profile belongs to another model);
    2. ``profile_here`` and the provider is available here: ``measure(device)`` profiles the model with the
       device's provider, options and threads.  When that is exactly the reference setting (same provider,
       no options, same threads) the reference profile is reused instead of measuring twice;
    3. otherwise the reference is scaled by ``speed`` / ``op_speeds`` (:func:`scale_costs`); a device that
       asked to be profiled here but whose provider is missing says so in its ``source``.

    ``measure`` and ``load`` are callables so that this module needs nothing from the profiler; without
    them, devices that need them raise :class:`UsageError`.  ``reference_threads`` is the thread count of
    the reference profile (``None``: not compared).
    """
    out: list[DeviceCosts] = []
    for i, d in enumerate(cluster.devices):
        if d.profile_path is not None:
            if load is None:
                raise UsageError(
                    f"{cluster.label}: devices[{i}].profile_path is set but profiles cannot be loaded "
                    "here; remove profile_path or give speed"
                )
            secs = {n: float(t) for n, t in load(d, d.profile_path).items()}
            out.append(DeviceCosts(d.name, "profile_file", f"profile file {d.profile_path}", _frozen(secs)))
            continue
        if timed_on_itself(d):
            if reference_setting(d.engine, reference_threads):
                secs = {n: float(t) for n, t in reference.items()}
            elif measure is None:
                raise UsageError(
                    f"{cluster.label}: devices[{i}].profile_here asks to profile on {d.engine.label} but "
                    "no profiler was given; set profile_here to false"
                )
            else:
                secs = {n: float(t) for n, t in measure(d).items()}
            on, threads = d.engine.runs_on, d.engine.threads
            source = f"profiled on {on} with {threads} thread{'s' if threads != 1 else ''}"
            out.append(DeviceCosts(d.name, "profiled", source, _frozen(secs)))
            continue
        source = describe_scaling(d)
        if d.profile_here:
            missing = d.engine_config().runs_on
            source += f" ({missing} is not available here)"
        out.append(DeviceCosts(d.name, "scaled", source, _frozen(scale_costs(reference, op_types, d))))
    return tuple(out)
