"""The cluster a pipeline runs on: devices in pipeline order and the links between them.

A balanced pipeline depends on the cluster, not only on the model (BaPipe): a stage on a device three times
faster should hold three times the work, a stage must fit its device's memory, and a slow link makes a
cut expensive.  This module reads that description from a JSON file (``--devices devices.json``, format in
``docs/devices.md``), validates every field with a message that names the file and the JSON path at fault,
and turns the reference profile into per-device costs, recording how each device's costs were obtained so
that the manifest can say whether a number was measured or extrapolated.

Nothing here partitions or schedules: :mod:`onnxpipe.partition` takes the plain numbers that
:class:`Cluster` exposes (``speeds``, ``mem_caps``, ``bandwidths``, ``latencies``), and
:mod:`onnxpipe.orders` searches device orders over the device *types* that :func:`device_type` defines.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from onnxpipe.core.errors import UsageError
from onnxpipe.core.jsonread import Document, Fields, Rule, Value, describe
from onnxpipe.core.units import parse_bytes, parse_rate

REFERENCE_PROVIDER = "CPUExecutionProvider"
"""The provider the reference profile is measured with (``onnxpipe profile`` runs on the CPU)."""

OptionValue = str | int | float | bool
"""A provider option as JSON allows it; onnxruntime turns every value into a string itself."""


def _frozen(m: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    return MappingProxyType(dict(m or {}))


@dataclass(frozen=True)
class Device:
    """One accelerator or host that runs one stage.

    ``speed`` is how many times faster than the machine of the reference profile this device runs the
    model (2.0 halves every node's time); ``op_speeds`` overrides it per ONNX op type, because a GPU speeds
    up a MatMul far more than a Reshape.  ``memory_bytes`` is what a stage may use on it (parameters plus
    the activations held for the micro-batches in flight); ``None`` means no limit.

    How the device's costs are obtained (see :func:`device_costs`): from ``profile_path``, a profile of the
    model measured on the device itself; else, when ``profile_here`` is set and ``provider`` is available
    on this machine, by profiling here with that provider and ``threads``; else by scaling the reference
    profile with ``speed`` / ``op_speeds``.
    """

    name: str
    provider: str = REFERENCE_PROVIDER
    provider_options: Mapping[str, OptionValue] = field(default_factory=_frozen)
    threads: int = 1
    memory_bytes: int | None = None
    speed: float = 1.0
    op_speeds: Mapping[str, float] = field(default_factory=_frozen)
    profile_path: str | None = None
    profile_here: bool = False

    @property
    def memory_cap(self) -> float:
        """``memory_bytes`` as a number the partitioner can compare with (``inf`` when unlimited)."""
        return math.inf if self.memory_bytes is None else float(self.memory_bytes)

    def speed_of(self, op_type: str) -> float:
        """The speed-up this device gives a node of ``op_type`` over the reference machine."""
        return float(self.op_speeds.get(op_type, self.speed))

    def to_obj(self) -> dict[str, Any]:
        """The device as it is written in a devices file (and in the manifest)."""
        obj: dict[str, Any] = {
            "name": self.name,
            "provider": self.provider,
            "provider_options": dict(self.provider_options),
            "threads": self.threads,
            "memory_bytes": self.memory_bytes,
            "speed": self.speed,
        }
        if self.op_speeds:
            obj["op_speeds"] = dict(self.op_speeds)
        if self.profile_path is not None:
            obj["profile_path"] = self.profile_path
        if self.profile_here:
            obj["profile_here"] = True
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
    a free order, the best selection: :mod:`onnxpipe.orders`).  ``source`` names the file it came from.
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
    def homogeneous(
        k: int,
        threads: int = 1,
        *,
        bandwidth_bytes_per_s: float = math.inf,
        latency_s: float = 0.0,
        memory_bytes: int | None = None,
        name: str = "cpu",
    ) -> Cluster:
        """``k`` reference CPUs (``cpu0``...): what a plan without ``--devices`` runs on."""
        if k < 1:
            raise UsageError(f"a cluster needs at least one device, got {k}; choose --stages 1 or more")
        dev = [Device(f"{name}{i}", threads=threads, memory_bytes=memory_bytes) for i in range(k)]
        link = Link(bandwidth_bytes_per_s, latency_s)
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
                f"{self._where()}: {k} stages need {k} devices but the cluster has {self.size}; "
                f"choose --stages between 1 and {self.size} or add devices"
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
                f"{self._where()}: the links differ, so devices can only run in the order the file lists "
                "them; write links as one object (the same network between every pair) to let the planner "
                "reorder devices"
            )
        links = (link,) * (len(order) - 1) if link is not None else ()
        return Cluster(tuple(self.devices[i] for i in order), links, self.source)

    def to_obj(self) -> dict[str, Any]:
        """The cluster as a devices file writes it (links always as a list)."""
        return {"devices": [d.to_obj() for d in self.devices], "links": [lk.to_obj() for lk in self.links]}

    def to_json(self) -> str:
        return json.dumps(self.to_obj(), indent=2, allow_nan=False) + "\n"

    @staticmethod
    def from_obj(obj: Any, source: str = "devices file", base: Path | None = None) -> Cluster:
        """Validate a parsed devices file; ``base`` is the folder relative ``profile_path`` are taken from."""
        return _read_cluster(Document(source, UsageError, _ADVICE).read(obj), base)

    def _where(self) -> str:
        return self.source or "cluster"


def load_cluster(path: str | Path) -> Cluster:
    """Read and validate a devices file (``--devices``); every error names the file and the JSON path."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{p}: no such devices file; give a JSON file as described in docs/devices.md")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{p}: cannot be read ({e}); give a UTF-8 JSON devices file") from e
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(
            f"{p}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); fix the devices file"
        ) from e
    return Cluster.from_obj(obj, str(p), p.parent)


# --------------------------------------------------------------------------------------------------
# device types (for the free-order search)


def device_type(device: Device) -> tuple[Any, ...]:
    """Everything but the name: two devices of one type are interchangeable in any pipeline position.

    A profile file counts as part of the type (two devices with their own profiles are different, even if
    the files happen to agree), so grouping never merges devices whose costs might differ.
    """
    return (
        device.provider,
        tuple(sorted((k, str(v)) for k, v in device.provider_options.items())),
        device.threads,
        device.memory_bytes,
        device.speed,
        tuple(sorted(device.op_speeds.items())),
        device.profile_path,
        device.profile_here,
    )


# --------------------------------------------------------------------------------------------------
# per-device costs


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

    def to_obj(self) -> dict[str, Any]:
        return {"device": self.device, "method": self.method, "source": self.source}


def provider_available(device: Device) -> bool:
    """Whether this machine's onnxruntime can run ``device.provider`` (so it can be profiled here)."""
    import onnxruntime as ort

    return device.provider in ort.get_available_providers()


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
    reference_provider: str = REFERENCE_PROVIDER,
    reference_threads: int | None = None,
) -> tuple[DeviceCosts, ...]:
    """Node seconds on every device of ``cluster``, each with a record of how it was obtained.

    In order of preference, because a measurement on the device beats an extrapolation:

    1. ``profile_path``: ``load(device, path)`` reads the device's own profile of this model (it should
       raise :class:`~onnxpipe.errors.ProfileError` if the profile belongs to another model);
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
                    f"{cluster._where()}: devices[{i}].profile_path is set but profiles cannot be loaded "
                    "here; remove profile_path or give speed"
                )
            secs = {n: float(t) for n, t in load(d, d.profile_path).items()}
            out.append(DeviceCosts(d.name, "profile_file", f"profile file {d.profile_path}", _frozen(secs)))
            continue
        if d.profile_here and provider_available(d):
            same_as_reference = (
                d.provider == reference_provider
                and not d.provider_options
                and (reference_threads is None or d.threads == reference_threads)
            )
            if same_as_reference:
                secs = {n: float(t) for n, t in reference.items()}
            elif measure is None:
                raise UsageError(
                    f"{cluster._where()}: devices[{i}].profile_here asks to profile on {d.provider} but "
                    "no profiler was given; set profile_here to false"
                )
            else:
                secs = {n: float(t) for n, t in measure(d).items()}
            source = f"profiled on {d.provider} with {d.threads} thread{'s' if d.threads != 1 else ''}"
            out.append(DeviceCosts(d.name, "profiled", source, _frozen(secs)))
            continue
        source = describe_scaling(d)
        if d.profile_here:
            source += f" ({d.provider} is not available here)"
        out.append(DeviceCosts(d.name, "scaled", source, _frozen(scale_costs(reference, op_types, d))))
    return tuple(out)


# --------------------------------------------------------------------------------------------------
# reading a devices file

_DEVICE_KEYS = {
    "name",
    "provider",
    "provider_options",
    "threads",
    "memory_bytes",
    "speed",
    "op_speeds",
    "profile_path",
    "profile_here",
    "description",
}
_REQUIRED_DEVICE_KEYS = ("name", "provider", "threads", "memory_bytes")
_LINK_KEYS = {"bandwidth_bytes_per_s", "latency_s", "description"}
_TOP_KEYS = {"devices", "links", "description"}

_ADVICE = "see docs/devices.md"
_NAME: Rule[str] = Rule(lambda s: bool(s.strip()), "a non-empty string")
_FILE_NAME: Rule[str] = Rule(lambda s: s != "", "a file name")


def _read_cluster(top_value: Value, base: Path | None) -> Cluster:
    top = top_value.fields().only(_TOP_KEYS)
    devs = top.need("devices", "list the devices in pipeline order (see docs/devices.md)")
    if not isinstance(devs.raw, list) or not devs.raw:
        raise devs.expected("a non-empty list of devices")
    devices = devs.objects(lambda f: _device(f, base))
    seen: dict[str, int] = {}
    for i, d in enumerate(devices):
        if d.name in seen:
            raise top.doc.fail(
                f"devices[{i}].name",
                f"{d.name!r} is already the name of devices[{seen[d.name]}]",
                "give every device its own name",
            )
        seen[d.name] = i
    links = _links(top.get("links", None), len(devices))
    return Cluster(devices, links, top.doc.source)


def _device(f: Fields, base: Path | None) -> Device:
    f.only(_DEVICE_KEYS)
    for key in _REQUIRED_DEVICE_KEYS:
        f.need(key, "every device needs " + ", ".join(_REQUIRED_DEVICE_KEYS))
    name = f["name"].string(_NAME)
    provider = _provider(f["provider"])
    options = f.get("provider_options", {}).dict_of(Value.scalar)
    threads = f["threads"].integer(1, expected="a whole number of threads >= 1")
    memory = _memory(f["memory_bytes"])
    speed = _positive(f.get("speed", 1.0))
    op_speeds = _op_speeds(f.get("op_speeds", {}))
    profile_path = _profile_path(f, base)
    here = f.get("profile_here", False).boolean()
    if here and profile_path is not None:
        raise f["profile_here"].fail("give either profile_path or profile_here, not both")
    return Device(
        name=name,
        provider=provider,
        provider_options=_frozen(options),
        threads=threads,
        memory_bytes=memory,
        speed=speed,
        op_speeds=_frozen(op_speeds),
        profile_path=profile_path,
        profile_here=here,
    )


def _provider(v: Value) -> str:
    import onnxruntime as ort

    known = list(ort.get_all_providers())
    if isinstance(v.raw, str) and v.raw in known:
        return v.raw
    close = difflib.get_close_matches(v.raw, known, n=1, cutoff=0.4) if isinstance(v.raw, str) else []
    hint = f"did you mean {close[0]!r}?" if close else "use an onnxruntime provider name"
    raise v.fail(
        f"{describe(v.raw)} is not an onnxruntime execution provider", f"{hint} (e.g. CPUExecutionProvider)"
    )


def _positive(v: Value) -> float:
    x = v.finite()
    if x <= 0:
        raise v.fail(f"must be greater than 0, got {v.raw!r}")
    return x


def _non_negative(v: Value) -> float:
    x = v.finite()
    if x < 0:
        raise v.fail(f"must not be negative, got {v.raw!r}")
    return x


def _op_speeds(v: Value) -> dict[str, float]:
    out: dict[str, float] = {}
    for op, s in v.fields().items():
        if not op:
            raise v.fail('an op type must be a non-empty name such as "MatMul"')
        out[op] = _positive(s)
    return out


def _memory(v: Value) -> int | None:
    """Bytes (``8589934592``, or ``8.0e9``: a whole float), a size (``"8 GiB"``), or ``null`` for no limit."""
    raw = v.raw
    if raw is None:
        return None
    if isinstance(raw, str):
        n = v.parsed(
            parse_bytes,
            what="a size",
            advice='write bytes (8000000000) or a size like "8 GiB" or "512 MB"',
        )
    elif isinstance(raw, float) and math.isfinite(raw) and raw.is_integer():
        n = int(raw)
    else:
        n = v.integer(None, expected='a whole number of bytes, a size like "8 GiB" or null')
    if n <= 0:
        raise v.fail(f"must be greater than 0, got {raw!r}", "write null for no limit")
    return n


def _profile_path(f: Fields, base: Path | None) -> str | None:
    """The device's own profile, relative to the devices file's folder (``base``); it must exist."""
    v = f.get("profile_path", None)
    given = v.opt_string(_FILE_NAME)
    if given is None:
        return None
    if "speed" in f.raw or "op_speeds" in f.raw:
        raise v.fail("give either a profile of the device's own or speed/op_speeds, not both")
    p = Path(given)
    if not p.is_absolute() and base is not None:
        p = base / p
    if not p.is_file():
        raise v.fail(f"{p}: no such file", "save one with 'onnxpipe profile' on that device, or give speed")
    return str(p)


def _links(v: Value, n: int) -> tuple[Link, ...]:
    """``links`` for ``n`` devices: a list of ``n - 1`` links, or one link object shared by all."""
    raw = v.raw
    if n == 1:
        if raw is None or raw == []:
            return ()
        if isinstance(raw, dict):
            v.object(_link)
            return ()
        raise v.fail("a single device has no links", f"remove links (got {describe(raw)})")
    if raw is None:
        raise v.fail(
            "missing",
            f"give {n - 1} links (one between each pair of consecutive devices) "
            "or one link object for a network every device shares",
        )
    if isinstance(raw, dict):
        return (v.object(_link),) * (n - 1)
    if not isinstance(raw, list):
        raise v.expected("a list of links or one link object")
    if len(raw) != n - 1:
        raise v.fail(
            f"{n} devices need {n - 1} links (devices[i] -> devices[i+1]), got {len(raw)}",
            "or write one link object for a network every device shares",
        )
    return v.objects(_link)


def _link(f: Fields) -> Link:
    f.only(_LINK_KEYS)
    for key in ("bandwidth_bytes_per_s", "latency_s"):
        f.need(key, "every link needs bandwidth_bytes_per_s and latency_s")
    return Link(_bandwidth(f["bandwidth_bytes_per_s"]), _non_negative(f["latency_s"]))


def _bandwidth(v: Value) -> float:
    """Bytes per second, a rate (``"100 Mbit/s"``), or ``null`` for a free link (``inf``)."""
    if v.raw is None:
        return math.inf
    if not isinstance(v.raw, str):
        return _positive(v)
    bw = v.parsed(parse_rate, what="a rate", advice='write bytes per second (12500000) or e.g. "100 Mbit/s"')
    if bw <= 0:
        raise v.fail(f"must be greater than 0, got {v.raw!r}")
    return bw


def effective_speeds(costs: Sequence[DeviceCosts], reference: Mapping[str, float]) -> tuple[float, ...]:
    """One overall speed per device: reference total over the device's total for the same nodes.

    Exact for devices scaled by one ``speed``; for per-op-type speeds or a device's own profile it is the
    speed-up on the model as a whole, which is what a partitioner taking one cost sequence and per-device
    speeds can use (a stage of mostly MatMuls on a GPU is then estimated a little pessimistically).
    """
    ref_total = math.fsum(float(t) for t in reference.values())
    out = []
    for c in costs:
        total = math.fsum(float(c.node_seconds.get(n, 0.0)) for n in reference)
        out.append(ref_total / total if total > 0 and ref_total > 0 else 1.0)
    return tuple(out)
