"""Tests of onnxpipe.cluster: the devices file, its validation, and per-device costs."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from paths import REPO_ROOT

from onnxpipe.cluster.costs import device_costs, scale_costs
from onnxpipe.cluster.devicesfile import load_cluster, read_cluster
from onnxpipe.cluster.model import Cluster, Device, Link, device_type
from onnxpipe.core.errors import UsageError
from onnxpipe.core.runtime_kinds import EngineConfig
from onnxpipe.core.runtimes import runs_here
from onnxpipe.core.units import parse_bytes, parse_rate

ROOT = REPO_ROOT
EXAMPLES = ROOT / "examples" / "devices"


def _dev(device_name: str, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": device_name,
        "provider": "CPUExecutionProvider",
        "threads": 2,
        "memory_bytes": 1000,
    }
    d.update(extra)
    return d


def _write(tmp_path: Path, obj: Any, name: str = "devices.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(obj), encoding="utf-8")
    return p


def _error(tmp_path: Path, obj: Any) -> str:
    p = _write(tmp_path, obj)
    with pytest.raises(UsageError) as info:
        load_cluster(p)
    msg = str(info.value)
    assert msg.startswith(str(p) + ": "), msg
    return msg


# --------------------------------------------------------------------------------------------------
# the three documented examples


def test_example_two_cpus() -> None:
    c = load_cluster(EXAMPLES / "two_cpus.json")
    assert c.names == ("cpu0", "cpu1")
    assert all(d.engine.threads == 4 and d.profile_here for d in c.devices)
    assert c.mem_caps == (8589934592.0, 8589934592.0)
    assert c.links == (Link(1e10, 2e-5),)
    assert c.speeds == (1.0, 1.0)
    assert device_type(c.devices[0]) == device_type(c.devices[1])


def test_example_cpu_gpu() -> None:
    c = load_cluster(EXAMPLES / "cpu_gpu.json")
    host, gpu = c.devices
    assert host.engine.provider == "CPUExecutionProvider" and host.memory_bytes == 32 * 2**30
    assert gpu.engine.provider == "CUDAExecutionProvider"
    # as the runtimes take them: JSON's numbers and booleans as text
    assert dict(gpu.engine.provider_options) == {
        "device_id": "0",
        "arena_extend_strategy": "kSameAsRequested",
    }
    assert read_cluster(c.to_obj(), base=EXAMPLES).devices == c.devices  # written as read: text stays text
    assert gpu.speed == 6 and gpu.speed_of("MatMul") == 25 and gpu.speed_of("Relu") == 6
    assert c.links[0].bandwidth_bytes_per_s == 12e9 and c.links[0].latency_s == 1e-5


def test_example_edge_1248() -> None:
    c = load_cluster(EXAMPLES / "edge_1248.json")
    assert c.speeds == (1.0, 2.0, 4.0, 8.0)
    assert c.mem_caps == tuple(float(g * 2**30) for g in (1, 2, 4, 8))
    assert c.uniform_link == Link(12_500_000.0, 0.0005)  # 100 Mbit/s
    assert c.bandwidths == (math.inf, 12.5e6, 12.5e6, 12.5e6)
    assert c.latencies == (0.0, 5e-4, 5e-4, 5e-4)
    assert len({device_type(d) for d in c.devices}) == 4


@pytest.mark.parametrize("name", ["two_cpus", "cpu_gpu", "edge_1248"])
def test_docs_show_the_example_files(name: str) -> None:
    """Every example in docs/devices.md is the file under examples/devices/ (description aside)."""
    text = (ROOT / "docs" / "devices.md").read_text(encoding="utf-8")
    blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", text, flags=re.S)]
    on_disk = json.loads((EXAMPLES / f"{name}.json").read_text(encoding="utf-8"))
    on_disk.pop("description", None)
    assert on_disk in blocks


@pytest.mark.parametrize("name", ["two_cpus", "cpu_gpu", "edge_1248"])
def test_round_trip(name: str) -> None:
    c = load_cluster(EXAMPLES / f"{name}.json")
    again = read_cluster(json.loads(json.dumps(c.to_obj(), allow_nan=False)), "again")
    assert again.devices == c.devices
    assert again.links == c.links


# --------------------------------------------------------------------------------------------------
# validation: file, JSON path, what to do


def test_missing_file_and_bad_json(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such devices file"):
        load_cluster(tmp_path / "nope.json")
    p = tmp_path / "bad.json"
    p.write_text('{"devices": [', encoding="utf-8")
    with pytest.raises(UsageError, match=r"bad\.json: not valid JSON .*line 1"):
        load_cluster(p)
    p.write_text('{"devices": [{"name": "gpu', encoding="utf-8")
    with pytest.raises(UsageError, match=r"JSON \(Unterminated string starting at line 1 column 23\)"):
        load_cluster(p)


def test_missing_required_key_names_the_path(tmp_path: Path) -> None:
    d = _dev("b")
    del d["memory_bytes"]
    msg = _error(
        tmp_path,
        {"devices": [_dev("a"), _dev("c"), d], "links": {"bandwidth_bytes_per_s": 1, "latency_s": 0}},
    )
    assert "devices[2].memory_bytes: missing" in msg


def test_unknown_key_suggests_the_right_one(tmp_path: Path) -> None:
    msg = _error(tmp_path, {"devices": [_dev("a", memory=5)]})
    assert "devices[0].memory: unknown key; did you mean 'memory_bytes'?" in msg
    msg = _error(tmp_path, {"devices": [_dev("a")], "link": []})
    assert "link: unknown key; did you mean 'links'?" in msg


def _documented_keys(heading: str) -> set[str]:
    """The keys in the first column of the table under ``heading`` in docs/devices.md."""
    text = (ROOT / "docs" / "devices.md").read_text(encoding="utf-8")
    table = text.split(heading, 1)[1].split("\n\n", 2)[1]
    return set(re.findall(r"^\| `(\w+)` \|", table, flags=re.MULTILINE))


def test_the_keys_a_devices_file_takes_are_the_documented_ones(tmp_path: Path) -> None:
    """A device's and a link's keys are read from their records' fields (less onnxpipe's own): they
    must stay those docs/devices.md lists, so that a field added to a record for onnxpipe's own use does
    not become a key a devices file may set unnoticed (as the engine's optimization level is not)."""
    from onnxpipe.cluster import devicesfile

    assert _documented_keys("Each device:") | {"description"} == devicesfile._DEVICE_KEYS
    assert _documented_keys("Each link:") | {"description"} == devicesfile._LINK_KEYS
    for internal in ("level", "engine"):
        msg = _error(tmp_path, {"devices": [_dev("a", **{internal: "ORT_DISABLE_ALL"})]})
        assert f"devices[0].{internal}: unknown key" in msg, msg


def test_bad_provider_suggests(tmp_path: Path) -> None:
    msg = _error(tmp_path, {"devices": [_dev("a", provider="CUDAProvider")]})
    assert "devices[0].provider" in msg and "CUDAExecutionProvider" in msg


@pytest.mark.parametrize(
    ("field", "value", "expect"),
    [
        ("threads", 0, "devices[0].threads: expected a whole number of threads >= 1"),
        ("threads", True, "devices[0].threads"),
        ("speed", -1, "devices[0].speed: must be greater than 0"),
        ("speed", "fast", "devices[0].speed: expected a number"),
        ("memory_bytes", 0, "devices[0].memory_bytes: must be greater than 0"),
        ("memory_bytes", "lots", "devices[0].memory_bytes: 'lots' is not a size"),
        ("memory_bytes", 1.5, "devices[0].memory_bytes: expected a whole number of bytes"),
        ("op_speeds", {"MatMul": 0}, "devices[0].op_speeds.MatMul: must be greater than 0"),
        (
            "provider_options",
            {"x": [1]},
            "devices[0].provider_options.x: expected a string, number or boolean",
        ),
        ("name", "", "devices[0].name: expected a non-empty string"),
        ("profile_here", "yes", "devices[0].profile_here: expected true or false"),
    ],
)
def test_bad_device_fields(tmp_path: Path, field: str, value: Any, expect: str) -> None:
    assert expect in _error(tmp_path, {"devices": [_dev("a", **{field: value})]})


def test_whole_messages(tmp_path: Path) -> None:
    """A message is one line: the file, the JSON path, what is wrong (values as jsonread describes them),
    and what to do (the format's own advice, or a pointer to docs/devices.md)."""
    p = str(tmp_path / "devices.json")
    d = _dev("b")
    del d["memory_bytes"]
    link = {"bandwidth_bytes_per_s": 1, "latency_s": 0}
    assert _error(tmp_path, {"devices": [_dev("a"), _dev("c"), d], "links": link}) == (
        f"{p}: devices[2].memory_bytes: missing; every device needs name, threads, memory_bytes, and "
        "provider unless its runtime is not onnxruntime"
    )
    assert _error(tmp_path, {"devices": [_dev("a", speed="fast")]}) == (
        f"{p}: devices[0].speed: expected a number, got string 'fast'; see docs/devices.md"
    )
    assert _error(tmp_path, {"devices": [_dev("a", threads=True)]}) == (
        f"{p}: devices[0].threads: expected a whole number of threads >= 1, got true; see docs/devices.md"
    )
    assert _error(tmp_path, {"devices": [_dev("a", memory_bytes="lots")]}) == (
        f"{p}: devices[0].memory_bytes: 'lots' is not a size; "
        'write bytes (8000000000) or a size like "8 GiB" or "512 MB"'
    )
    assert _error(tmp_path, {"devices": [_dev("a", provider=7)]}) == (
        f"{p}: devices[0].provider: int 7 is not an onnxruntime execution provider; "
        "use an onnxruntime provider name (e.g. CPUExecutionProvider)"
    )
    assert _error(tmp_path, {"devices": [_dev("a")], "links": 5}) == (
        f"{p}: links: a single device has no links; remove links (got int 5)"
    )
    assert _error(tmp_path, {"devices": [_dev("a", speed=10**400)]}).startswith(
        f"{p}: devices[0].speed: expected a number, got int 1000"
    )


def test_whole_number_floats_are_bytes(tmp_path: Path) -> None:
    c = load_cluster(_write(tmp_path, {"devices": [_dev("a", memory_bytes=8e9)]}))
    assert c.devices[0].memory_bytes == 8_000_000_000 and type(c.devices[0].memory_bytes) is int


def test_duplicate_names(tmp_path: Path) -> None:
    msg = _error(
        tmp_path, {"devices": [_dev("a"), _dev("a")], "links": [{"bandwidth_bytes_per_s": 1, "latency_s": 0}]}
    )
    assert "devices[1].name: 'a' is already the name of devices[0]" in msg


def test_links_count_and_fields(tmp_path: Path) -> None:
    devs = [_dev("a"), _dev("b"), _dev("c")]
    assert "links: missing; give 2 links" in _error(tmp_path, {"devices": devs})
    link = {"bandwidth_bytes_per_s": 1e6, "latency_s": 0}
    assert "3 devices need 2 links" in _error(tmp_path, {"devices": devs, "links": [link]})
    two = devs[:2]
    assert "links: missing; give 1 link (one between" in _error(tmp_path, {"devices": two})  # not "1 links"
    assert "2 devices need 1 link (devices[i]" in _error(tmp_path, {"devices": two, "links": [link, link]})
    bad = {"bandwidth_bytes_per_s": 0, "latency_s": 0}
    assert "links[1].bandwidth_bytes_per_s: must be greater than 0" in _error(
        tmp_path, {"devices": devs, "links": [link, bad]}
    )
    neg = {"bandwidth_bytes_per_s": 1, "latency_s": -1}
    assert "links.latency_s: must not be negative" in _error(tmp_path, {"devices": devs, "links": neg})
    rate = {"bandwidth_bytes_per_s": "fast", "latency_s": 0}
    assert "links.bandwidth_bytes_per_s: 'fast' is not a rate" in _error(
        tmp_path, {"devices": devs, "links": rate}
    )
    assert "a single device has no links" in _error(tmp_path, {"devices": [_dev("a")], "links": [link]})


def test_links_null_bandwidth_is_free(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        {"devices": [_dev("a"), _dev("b")], "links": [{"bandwidth_bytes_per_s": None, "latency_s": 0}]},
    )
    c = load_cluster(p)
    assert c.links[0].bandwidth_bytes_per_s == math.inf
    assert c.links[0].seconds(10**9) == 0.0
    assert c.to_obj()["links"][0]["bandwidth_bytes_per_s"] is None


def test_empty_and_wrong_top_level(tmp_path: Path) -> None:
    assert "devices: expected a non-empty list" in _error(tmp_path, {"devices": []})
    assert "devices: missing" in _error(tmp_path, {})
    assert "top level: expected an object" in _error(tmp_path, [1, 2])


def test_profile_path(tmp_path: Path) -> None:
    (tmp_path / "gpu_profile.json").write_text("{}", encoding="utf-8")
    p = _write(tmp_path, {"devices": [_dev("a", profile_path="gpu_profile.json")]})
    c = load_cluster(p)
    assert c.devices[0].profile_path == str(tmp_path / "gpu_profile.json")
    msg = _error(tmp_path, {"devices": [_dev("a", profile_path="gpu_profile.json", speed=2)]})
    assert "devices[0].profile_path: give either a profile of the device's own or speed/op_speeds" in msg
    msg = _error(tmp_path, {"devices": [_dev("a", profile_path="missing.json")]})
    assert "devices[0].profile_path" in msg and "no such file" in msg
    msg = _error(tmp_path, {"devices": [_dev("a", profile_path="gpu_profile.json", profile_here=True)]})
    assert "either profile_path or profile_here" in msg


def test_memory_null_is_unlimited(tmp_path: Path) -> None:
    c = load_cluster(_write(tmp_path, {"devices": [_dev("a", memory_bytes=None)]}))
    assert c.devices[0].memory_bytes is None and c.mem_caps == (math.inf,)


def test_units() -> None:
    assert parse_bytes("8 GiB") == 8 * 2**30
    assert parse_bytes("512MB") == 512_000_000
    assert parse_bytes("1.5 KiB") == 1536
    assert parse_rate("100 Mbit/s") == 12_500_000.0
    assert parse_rate("1 Gbit/s") == 125_000_000.0
    assert parse_rate("12 GB/s") == 12e9
    assert parse_rate("2 MiB/s") == 2 * 2**20
    for bad in ("8 parsecs", "GiB", "", "-1 GiB"):
        with pytest.raises(ValueError):
            parse_bytes(bad)
    with pytest.raises(ValueError):
        parse_rate("100 Mbit")


# --------------------------------------------------------------------------------------------------
# clusters built in code


def test_homogeneous_default() -> None:
    c = Cluster.homogeneous(3, threads=4, bandwidth_bytes_per_s=1e9)
    assert c.names == ("cpu0", "cpu1", "cpu2")
    assert all(d.engine.threads == 4 and d.speed == 1 and d.memory_bytes is None for d in c.devices)
    assert c.bandwidths == (math.inf, 1e9, 1e9)
    assert c.uniform_link == Link(1e9, 0.0)
    with pytest.raises(UsageError):
        Cluster.homogeneous(0)


def test_prefix_and_arranged() -> None:
    c = load_cluster(EXAMPLES / "edge_1248.json")
    assert c.prefix(2).names == ("board-x1", "board-x2")
    assert c.arranged([3, 0]).names == ("board-x8", "board-x1")
    assert c.arranged([3, 0]).links == (Link(12.5e6, 5e-4),)
    with pytest.raises(UsageError, match="choose `stages` between 1 and 4"):
        c.prefix(5)
    with pytest.raises(ValueError):
        c.arranged([1, 1])
    mixed = Cluster((Device("a"), Device("b"), Device("c")), (Link(1e9, 0), Link(1e6, 0)))
    assert mixed.uniform_link is None
    assert mixed.arranged([0, 1]).names == ("a", "b")  # file order is always fine
    with pytest.raises(UsageError, match="links differ"):
        mixed.arranged([1, 0])


def test_link_seconds() -> None:
    lk = Link(1e6, 0.01)
    assert lk.seconds(0) == 0.01
    assert lk.seconds(2e6) == pytest.approx(2.01)


# --------------------------------------------------------------------------------------------------
# per-device costs


REFERENCE = {"mm": 0.010, "relu": 0.002, "other": 0.001}
OP_TYPES = {"mm": "MatMul", "relu": "Relu"}  # "other" has no known op type


def test_scale_costs_overall_and_per_op_type() -> None:
    assert scale_costs(REFERENCE, OP_TYPES, Device("x", speed=2)) == pytest.approx(
        {"mm": 0.005, "relu": 0.001, "other": 0.0005}
    )
    gpu = Device("g", speed=4, op_speeds={"MatMul": 20})
    assert scale_costs(REFERENCE, OP_TYPES, gpu) == pytest.approx(
        {"mm": 0.0005, "relu": 0.0005, "other": 0.00025}
    )


def test_device_costs_records_how() -> None:
    folder = Path(__file__).parent
    devices = (
        Device(
            "ref", profile_here=True, engine=EngineConfig(threads=1)
        ),  # same as the reference: reused, not measured
        Device("cpu4", profile_here=True, engine=EngineConfig(threads=4)),  # measured here
        Device(
            "cuda", profile_here=True, speed=5, engine=EngineConfig(provider="CUDAExecutionProvider")
        ),  # not here: scaled
        Device("board", speed=3, op_speeds={"MatMul": 6}),
        Device("own", profile_path=str(folder / "x.json")),
    )
    cluster = Cluster(devices, (Link(),) * 4)
    measured: list[str] = []
    loaded: list[str] = []

    def measure(d: Device) -> dict[str, float]:
        measured.append(d.name)
        return {n: t / 2 for n, t in REFERENCE.items()}

    def load(d: Device, path: str) -> dict[str, float]:
        loaded.append(path)
        return {n: t * 10 for n, t in REFERENCE.items()}

    costs = device_costs(cluster, REFERENCE, OP_TYPES, measure=measure, load=load, reference_threads=1)
    assert measured == ["cpu4"]
    assert loaded == [str(folder / "x.json")]
    by = {c.device: c for c in costs}
    assert by["ref"].method == "profiled" and dict(by["ref"].node_seconds) == REFERENCE
    assert by["ref"].source == "profiled on CPUExecutionProvider with 1 thread"
    assert by["cpu4"].method == "profiled" and by["cpu4"].node_seconds["mm"] == 0.005
    assert by["cpu4"].source == "profiled on CPUExecutionProvider with 4 threads"
    if not runs_here(devices[2].engine):
        assert by["cuda"].method == "scaled"
        assert (
            by["cuda"].source
            == "scaled from reference by speed 5 (CUDAExecutionProvider is not available here)"
        )
        assert by["cuda"].node_seconds["mm"] == pytest.approx(0.002)
    assert by["board"].source == "scaled from reference by speed 3 (MatMul 6)"
    assert by["board"].node_seconds["mm"] == pytest.approx(0.010 / 6)
    assert by["board"].node_seconds["relu"] == pytest.approx(0.002 / 3)
    assert by["own"].method == "profile_file" and by["own"].node_seconds["mm"] == pytest.approx(0.1)
    assert (by["board"].device, by["board"].method) == ("board", "scaled")


def test_device_costs_without_callables() -> None:
    c = Cluster((Device("own", profile_path="p.json"),), ())
    with pytest.raises(UsageError, match="profile_path is set"):
        device_costs(c, REFERENCE, OP_TYPES)
    c = Cluster((Device("cpu4", profile_here=True, engine=EngineConfig(threads=4)),), ())
    with pytest.raises(UsageError, match="profile_here"):
        device_costs(c, REFERENCE, OP_TYPES, reference_threads=1)
