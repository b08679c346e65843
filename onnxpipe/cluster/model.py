"""The cluster a pipeline runs on: devices in pipeline order and the links between them.

A balanced pipeline depends on the cluster, not only on the model (BaPipe): a stage on a device three times
faster should hold three times the work, a stage must fit its device's memory, and a slow link makes a
cut expensive.  This module holds the description itself, frozen: :class:`Device`, :class:`Link` and
:class:`Cluster`; :mod:`onnxpipe.cluster.devicesfile` reads it from a JSON file (``--devices
devices.json``, format in ``docs/devices.md``) and :mod:`onnxpipe.cluster.costs` turns the reference
profile into per-device costs.

Nothing here partitions or schedules: :mod:`onnxpipe.partition` takes the plain numbers that
:class:`Cluster` exposes (``speeds``, ``mem_caps``, ``bandwidths``, ``latencies``), and
:mod:`onnxpipe.planning.orders` searches device orders over the device *types* that :func:`device_type`
defines.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt
from onnxpipe.core.runtime_kinds import EngineConfig

REFERENCE_PROVIDER = "CPUExecutionProvider"
"""The provider the reference profile is measured with (``onnxpipe profile`` runs on the CPU)."""


def _frozen(m: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    return MappingProxyType(dict(m or {}))


def option_text(value: object) -> str:
    """An option as the runtimes take it: JSON's ``true`` stays ``true``, not Python's ``True``."""
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Device:
    """One accelerator or host that runs one stage.

    ``engine`` is how its stage is opened: the runtime and its settings (an execution provider and its
    options, the threads, OpenVINO's device and config), the options as the text the runtimes take
    (:func:`option_text`).  ``speed`` is how many times faster than the machine of the reference profile
    this device runs the model (2.0 halves every node's time); ``op_speeds`` overrides it per ONNX op
    type, because a GPU speeds up a MatMul far more than a Reshape.  ``memory_bytes`` is what a stage may
    use on it (parameters plus the activations held for the micro-batches in flight); ``None`` means no
    limit.

    How the device's costs are obtained (see :func:`device_costs`): from ``profile_path``, a profile of the
    model measured on the device itself; else, when ``profile_here`` is set and its engine is available
    on this machine, by profiling here with it; else by scaling the reference profile with ``speed`` /
    ``op_speeds``.
    """

    name: str
    engine: EngineConfig = field(default_factory=EngineConfig)
    memory_bytes: int | None = None
    speed: float = 1.0
    op_speeds: Mapping[str, float] = field(default_factory=_frozen)
    profile_path: str | None = None
    profile_here: bool = False

    def engine_config(self, threads: int | None = None) -> EngineConfig:
        """How to open this device's stage (:func:`onnxpipe.core.runtimes.open_engine`); ``threads``
        replaces the device's own."""
        return self.engine if threads is None else replace(self.engine, threads=threads)

    @property
    def memory_cap(self) -> float:
        """``memory_bytes`` as a number the partitioner can compare with (``inf`` when unlimited)."""
        return math.inf if self.memory_bytes is None else float(self.memory_bytes)

    def speed_of(self, op_type: str) -> float:
        """The speed-up this device gives a node of ``op_type`` over the reference machine."""
        return float(self.op_speeds.get(op_type, self.speed))

    def to_obj(self) -> dict[str, Any]:
        """The device as it is written in a devices file (and in the manifest)."""
        e = self.engine
        obj: dict[str, Any] = {
            "name": self.name,
            "provider": e.provider,
            "provider_options": dict(e.provider_options),
            "threads": e.threads,
            "memory_bytes": self.memory_bytes,
            "speed": self.speed,
        }
        if self.op_speeds:
            obj["op_speeds"] = dict(self.op_speeds)
        if self.profile_path is not None:
            obj["profile_path"] = self.profile_path
        if self.profile_here:
            obj["profile_here"] = True
        kind = e.kind
        if not kind.reference:  # written only when set: older files stay as they were
            obj["runtime"] = e.runtime.value
        if not kind.takes_provider:  # onnxruntime's, refused for another runtime
            del obj["provider"], obj["provider_options"]
        if kind.takes_openvino_device:
            obj["openvino_device"] = e.openvino_device
            if e.openvino_config:
                obj["openvino_config"] = dict(e.openvino_config)
        return obj


@dataclass(frozen=True)
class Link:
    """The connection from one device to the next: a micro-batch's cut takes ``bytes / bandwidth + latency``.

    ``bandwidth_bytes_per_s`` is ``inf`` for devices that share memory.  Links are full duplex: activations
    going forward and gradients coming back do not wait for each other.
    """

    bandwidth_bytes_per_s: float = math.inf
    latency_s: float = 0.0

    def seconds(self, nbytes: float) -> float:
        """Time to send ``nbytes`` over this link: the partitioner's ``bytes / bandwidth + latency``.

        The latency is paid even for an empty message: the next stage still waits for the go-ahead.
        """
        return max(0.0, nbytes) / self.bandwidth_bytes_per_s + self.latency_s

    def to_obj(self) -> dict[str, Any]:
        bw = self.bandwidth_bytes_per_s
        return {"bandwidth_bytes_per_s": None if math.isinf(bw) else bw, "latency_s": self.latency_s}


@dataclass(frozen=True)
class Cluster:
    """Devices in pipeline order and the ``len(devices) - 1`` links between consecutive ones.

    Stage ``i`` runs on ``devices[i]``; a plan with fewer stages than devices uses the first ones (or, with
    a free order, the best selection: :mod:`onnxpipe.planning.orders`).  ``source`` names the file it came
    from.
    """

    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    source: str | None = None

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError("a cluster needs at least one device")
        if len(self.links) != len(self.devices) - 1:
            raise ValueError(f"{len(self.devices)} devices need {len(self.devices) - 1} links")

    @staticmethod
    def homogeneous(k: int, threads: int = 1, *, bandwidth_bytes_per_s: float = math.inf) -> Cluster:
        """``k`` reference CPUs (``cpu0``...): what a plan without a devices file runs on."""
        if k < 1:
            raise UsageError(
                f"a cluster needs at least one device, got {k}; choose {opt('stages')} 1 or more"
            )
        engine = EngineConfig(threads=threads)
        dev = [Device(f"cpu{i}", engine) for i in range(k)]
        link = Link(bandwidth_bytes_per_s)
        return Cluster(tuple(dev), (link,) * (k - 1))

    @property
    def size(self) -> int:
        return len(self.devices)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)

    @property
    def speeds(self) -> tuple[float, ...]:
        return tuple(d.speed for d in self.devices)

    @property
    def mem_caps(self) -> tuple[float, ...]:
        return tuple(d.memory_cap for d in self.devices)

    @property
    def bandwidths(self) -> tuple[float, ...]:
        """Bandwidth of the link *into* each stage: ``[i]`` feeds device ``i`` (``[0]`` is ``inf``)."""
        return (math.inf, *(lk.bandwidth_bytes_per_s for lk in self.links))

    @property
    def latencies(self) -> tuple[float, ...]:
        """Latency of the link into each stage (``[0]`` is 0: the model input is already there)."""
        return (0.0, *(lk.latency_s for lk in self.links))

    @property
    def uniform_link(self) -> Link | None:
        """The one link every pair of devices shares, or ``None`` when links differ (or there are none).

        Only then may the devices be reordered or a subset used out of file order: a link list describes the
        connection between *consecutive* devices, and says nothing about other pairs.
        """
        if not self.links or any(lk != self.links[0] for lk in self.links):
            return None
        return self.links[0]

    def prefix(self, k: int) -> Cluster:
        """The first ``k`` devices and the links between them: a ``k``-stage plan in file order."""
        if not 1 <= k <= self.size:
            raise UsageError(
                f"{self.label}: {k} stages need {k} devices but the cluster has {self.size}; "
                f"choose {opt('stages')} between 1 and {self.size} or add devices"
            )
        return Cluster(self.devices[:k], self.links[: k - 1], self.source)

    def arranged(self, order: Sequence[int]) -> Cluster:
        """The devices at indices ``order``, in that order (a subset is fine): for ``--order free``."""
        if sorted(set(order)) != sorted(order) or any(not 0 <= i < self.size for i in order) or not order:
            raise ValueError(f"not a selection of distinct device indices: {list(order)}")
        if list(order) == list(range(len(order))):
            return self.prefix(len(order))
        link = self.uniform_link
        if link is None and len(order) > 1:
            raise UsageError(
                f"{self.label}: the links differ, so devices can only run in the order the file lists "
                "them; write links as one object (the same network between every pair) to let the planner "
                "reorder devices"
            )
        links = (link,) * (len(order) - 1) if link is not None else ()
        return Cluster(tuple(self.devices[i] for i in order), links, self.source)

    def to_obj(self) -> dict[str, Any]:
        """The cluster as a devices file writes it (links always as a list)."""
        return {"devices": [d.to_obj() for d in self.devices], "links": [lk.to_obj() for lk in self.links]}

    @property
    def label(self) -> str:
        """How messages name the cluster: the file it came from, or ``"cluster"``."""
        return self.source or "cluster"


# --------------------------------------------------------------------------------------------------
# device types (for the free-order search)


def device_type(device: Device) -> tuple[Any, ...]:
    """Everything but the name: two devices of one type are interchangeable in any pipeline position.

    A profile file counts as part of the type (two devices with their own profiles are different, even if
    the files happen to agree), so grouping never merges devices whose costs might differ.
    """
    values = (getattr(device, f.name) for f in fields(Device) if f.name != "name")
    return tuple(tuple(sorted(v.items())) if isinstance(v, Mapping) else v for v in values)
