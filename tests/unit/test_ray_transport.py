"""What the Ray backend keeps, without Ray: the nodes' cache of shipped stage files, a trip's hops, and
what an alive node can still host (its frames: tests/unit/test_ray_plane.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from onnxpipe.runtime.backends.ray_resources import missing_resources, request_of
from onnxpipe.runtime.backends.stage_cache import ShipFailure, ShippedFile, StageCache
from onnxpipe.runtime.trips import Leg, Trip


def _file(data: bytes, name: str = "stage_0.onnx") -> ShippedFile:
    return ShippedFile(name, hashlib.sha256(data).hexdigest(), len(data))


def test_the_cache_keeps_a_file_that_arrived_whole_and_refuses_one_that_did_not(tmp_path: Path) -> None:
    cache = StageCache(tmp_path / "cache")
    model, weights = b"model bytes" * 100, b"w" * 3000
    files = [_file(model), _file(weights, "stage_0.onnx.data")]
    assert cache.missing(files) == [f.sha256 for f in files]
    for f, data in zip(files, (model, weights), strict=True):
        for offset in range(0, len(data), 512):  # in chunks, in order
            cache.write(f.sha256, offset, data[offset : offset + 512])
        cache.seal(f, "stage 0 (stage_0.onnx)")
    assert cache.missing(files) == []
    path = cache.stage_path(files)
    assert path.name == "stage_0.onnx" and path.read_bytes() == model
    assert (path.parent / "stage_0.onnx.data").read_bytes() == weights
    assert cache.stage_path(files) == path  # the same stage: the same folder

    damaged = ShippedFile("stage_1.onnx", hashlib.sha256(b"other").hexdigest(), 5)
    cache.write(damaged.sha256, 0, b"otheR")
    with pytest.raises(ShipFailure, match=r"stage 1 \(stage_1.onnx\): stage_1.onnx arrived with sha256"):
        cache.seal(damaged, "stage 1 (stage_1.onnx)")
    assert cache.missing([damaged]) == [damaged.sha256]
    assert not [p for p in (tmp_path / "cache" / "blobs").iterdir() if p.name.startswith(".")]
    with pytest.raises(ShipFailure, match="came after byte 0"):
        cache.write(damaged.sha256, 0, b"")
        cache.write(damaged.sha256, 3, b"x")
    empty = _file(b"", "empty.bin")
    cache.write(empty.sha256, 0, b"")
    cache.seal(empty, "stage 2")
    assert cache.missing([empty]) == []


def test_a_trip_s_hops_and_overhead() -> None:
    legs = (
        Leg(
            0,
            received=10.002,
            run_seconds=0.003,
            sent=10.006,
            bytes_in=100,
        ),
        Leg(
            1,
            received=10.007,
            run_seconds=0.002,
            sent=10.010,
            bytes_in=50,
        ),
    )
    trip = Trip(1, 10.0, 10.012, legs, bytes_in=100, bytes_out=20)
    assert [round(h.seconds, 6) for h in trip.hops] == [0.002, 0.001, 0.002]
    assert [h.bytes for h in trip.hops] == [100, 50, 20]
    assert trip.overhead_seconds == pytest.approx(0.012 - 0.005)


def test_what_no_alive_node_has_is_named() -> None:
    ask = request_of({"num_cpus": 1, "num_gpus": 0, "resources": {"node_b": 1}})
    assert ask == {"CPU": 1.0, "node_b": 1.0}
    nodes = [
        {"Alive": True, "Resources": {"CPU": 2.0, "node_a": 1.0}},
        {"Alive": False, "Resources": {"CPU": 1.0, "node_b": 1.0}},
    ]
    assert missing_resources(ask, nodes) == ["node_b 1"]
    nodes.append({"Alive": True, "Resources": {"node_b": 1.0}})
    assert missing_resources(ask, nodes) == ["all of them on one node"]
    nodes.append({"Alive": True, "Resources": {"CPU": 1.0, "node_b": 2.0}})
    assert missing_resources(ask, nodes) is None


def test_a_link_s_bandwidth_is_its_slope_and_its_latency_the_smallest_frame_s_excess() -> None:
    from onnxpipe.runtime.backends.ray_links import fit_link

    rate = 12.5e6  # 100 Mbit/s
    exact = {n: 2e-4 + n / rate for n in (1024, 65536, 1 << 20, 4 << 20)}
    latency, bandwidth = fit_link(exact)
    assert bandwidth == pytest.approx(rate) and latency == pytest.approx(2e-4)
    bucket = {**exact, 1024: 5e-5}  # a rate limiter's bucket let the small frame through early
    latency, bandwidth = fit_link(bucket)
    assert latency == pytest.approx(5e-5) and bandwidth == pytest.approx(rate, rel=0.01)
    assert fit_link({1024: 3e-4, 4096: 3e-4}) == (3e-4, None)  # more bytes took no longer: free
    assert fit_link({1024: 3e-4}) == (3e-4, None)
