"""The devices file (``--devices devices.json``, format in ``docs/devices.md``), read and validated.

Every field is checked with :mod:`onnxpipe.core.jsonread`, and every error names the file and the JSON
path at fault (``devices.json: devices[2].memory_bytes: ...``).  Unknown keys are refused with the
closest known one: a hand-written file whose misspelled optional key passed silently would plan for
another machine than the user's.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from onnxpipe.cluster.model import REFERENCE_PROVIDER, Cluster, Device, Link, _frozen, option_text
from onnxpipe.core.choices import Runtime, values
from onnxpipe.core.errors import UsageError
from onnxpipe.core.jsonread import Document, Fields, Rule, Value, describe
from onnxpipe.core.runtime_kinds import DEFAULT_OPENVINO_DEVICE, EngineConfig, kind_of
from onnxpipe.core.text import counted
from onnxpipe.core.units import parse_bytes, parse_rate


def load_cluster(path: str | Path) -> Cluster:
    """Read and validate a devices file (``--devices``); every error names the file and the JSON path."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{p}: no such devices file; give a JSON file as described in docs/devices.md")
    return read_cluster(Document(str(p), UsageError, _ADVICE).load(p), str(p), p.parent)


# a device's keys are its record's fields and its engine's (but the optimization level, onnxpipe's own),
# and a description for the reader of the file
_DEVICE_KEYS = (
    {f.name for f in fields(Device) if f.name != "engine"}
    | {f.name for f in fields(EngineConfig) if f.name != "level"}
    | {"description"}
)
_REQUIRED_DEVICE_KEYS = ("name", "threads", "memory_bytes")
_NEEDS = (
    "every device needs "
    + ", ".join(_REQUIRED_DEVICE_KEYS)
    + ", and provider unless its runtime is not onnxruntime"
)
_LINK_KEYS = {f.name for f in fields(Link)} | {"description"}
_TOP_KEYS = {"devices", "links", "description"}

_ADVICE = "see docs/devices.md"
_NAME: Rule[str] = Rule(lambda s: bool(s.strip()), "a non-empty string")
_FILE_NAME: Rule[str] = Rule(lambda s: s != "", "a file name")


def read_cluster(obj: Any, source: str = "devices file", base: Path | None = None) -> Cluster:
    """Validate a parsed devices file; ``base`` is the folder relative ``profile_path`` are taken from."""
    top = Document(source, UsageError, _ADVICE).read(obj).fields().only(_TOP_KEYS)
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
        f.need(key, _NEEDS)
    name = f["name"].string(_NAME)
    runtime = _runtime(f.get("runtime", Runtime.ONNXRUNTIME.value))
    kind = kind_of(runtime)
    for taken, keys, whose, owner in (
        (kind.takes_provider, ("provider", "provider_options"), "onnxruntime's", Runtime.ONNXRUNTIME),
        (kind.takes_openvino_device, ("openvino_device", "openvino_config"), "OpenVINO's", Runtime.OPENVINO),
    ):
        given = [key for key in keys if key in f.raw]
        if given and not taken:
            raise f[given[0]].fail(
                f"is {whose}, and this device's runtime is {runtime.value}",
                f"remove it, or set runtime to {owner.value}",
            )
    if kind.takes_provider:
        f.need("provider", "a device run by onnxruntime names its execution provider (or set runtime)")
    provider = _provider(f["provider"]) if kind.takes_provider else REFERENCE_PROVIDER
    ov_device = f.get("openvino_device", DEFAULT_OPENVINO_DEVICE).string(_NAME)
    ov_config = f.get("openvino_config", {}).dict_of(Value.scalar)
    options = f.get("provider_options", {}).dict_of(Value.scalar)
    threads = f["threads"].integer(1, expected="a whole number of threads >= 1")
    memory = _memory(f["memory_bytes"])
    speed = _positive(f.get("speed", 1.0))
    op_speeds = _op_speeds(f.get("op_speeds", {}))
    profile_path = _profile_path(f, base)
    here = f.get("profile_here", False).boolean()
    if here and profile_path is not None:
        raise f["profile_here"].fail("give either profile_path or profile_here, not both")
    engine = EngineConfig(
        provider=provider,
        provider_options=tuple((k, option_text(v)) for k, v in options.items()),
        threads=threads,
        runtime=runtime,
        openvino_device=ov_device,
        openvino_config=tuple((k, option_text(v)) for k, v in ov_config.items()),
    )
    return Device(
        name=name,
        engine=engine,
        memory_bytes=memory,
        speed=speed,
        op_speeds=_frozen(op_speeds),
        profile_path=profile_path,
        profile_here=here,
    )


def _runtime(v: Value) -> Runtime:
    if isinstance(v.raw, str) and v.raw in values(Runtime):
        return Runtime(v.raw)
    raise v.fail(
        f"{describe(v.raw)} is not a runtime onnxpipe runs stages on",
        f"use one of {', '.join(values(Runtime))}",
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
            f"give {counted(n - 1, 'link')} (one between each pair of consecutive devices) "
            "or one link object for a network every device shares",
        )
    if isinstance(raw, dict):
        return (v.object(_link),) * (n - 1)
    if not isinstance(raw, list):
        raise v.expected("a list of links or one link object")
    if len(raw) != n - 1:
        raise v.fail(
            f"{n} devices need {counted(n - 1, 'link')} (devices[i] -> devices[i+1]), got {len(raw)}",
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


def with_links(path: Path, links: Sequence[Mapping[str, Any]]) -> tuple[str, Cluster]:
    """The devices file at ``path`` with its ``links`` replaced by ``links`` (one object per pair of
    consecutive devices, as the format says), as text to write and as the cluster it reads as: every
    other key as the user wrote it."""
    load_cluster(path)  # the file as it is must be valid first: its errors name it
    obj = json.loads(path.read_text(encoding="utf-8"))
    obj["links"] = [dict(link) for link in links]
    cluster = read_cluster(obj, str(path), path.parent)
    return json.dumps(obj, indent=2) + "\n", cluster
