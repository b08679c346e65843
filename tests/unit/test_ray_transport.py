"""What the Ray backend sends and keeps, without Ray: messages of inline pieces, the nodes' cache of
shipped stage files, a trip's hops, and what an alive node can still host."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from onnxpipe.runtime.backends import ray_wire
from onnxpipe.runtime.backends.ray_recovery import missing_resources, request_of
from onnxpipe.runtime.backends.ray_wire import INLINE_PIECE, Leg, pack, slots_for, unpack
from onnxpipe.runtime.backends.stage_cache import ShipFailure, ShippedFile, StageCache
from onnxpipe.runtime.trips import Trip


def _tensors(nbytes: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(nbytes)
    return {
        "a": rng.standard_normal(nbytes // 8).astype(np.float32),
        "mask": rng.integers(0, 2, (3, 5)).astype(bool),
        "ids": rng.integers(0, 1000, (7,)).astype(np.int64),
        "scalar": np.array(2.5, dtype=np.float64),
        "empty": np.zeros((0, 4), dtype=np.float16),
    }


@pytest.mark.parametrize("nbytes", [0, 1000, INLINE_PIECE, 5 * INLINE_PIECE + 17])
def test_a_message_holds_its_tensors_in_inline_pieces(nbytes: int) -> None:
    tensors = _tensors(nbytes)
    slots = slots_for(tensors)
    message = pack(tensors, slots, sent=1.0)
    header, pieces = message[0], message[1:]
    assert len(message) == slots == header.needs and header.inline
    assert all(len(p) <= INLINE_PIECE for p in pieces)
    back = unpack(header, [np.array(p) for p in pieces])
    assert list(back) == list(tensors)
    for name, value in tensors.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape
        np.testing.assert_array_equal(back[name], value)
        assert back[name].flags.writeable and back[name].ctypes.data % 16 == 0


def test_a_message_needing_more_pieces_than_asked_puts_the_rest_in_its_last_one() -> None:
    tensors = {"x": np.arange(4 * INLINE_PIECE // 4, dtype=np.float32)}
    message = pack(tensors, 3, sent=0.0)
    header = message[0]
    assert len(message) == 3 and not header.inline and header.needs == 5
    np.testing.assert_array_equal(unpack(header, message[1:])["x"], tensors["x"])
    padded = pack(tensors, 9, sent=0.0)  # fewer than asked: empty pieces after
    assert len(padded) == 9 and padded[0].inline and len(padded[-1]) == 0
    np.testing.assert_array_equal(unpack(padded[0], padded[1:])["x"], tensors["x"])


def test_a_large_message_goes_whole_and_strings_go_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_wire, "INLINE_LIMIT", 1000)
    big = {"x": np.ones(1000, dtype=np.float32)}
    message = pack(big, slots_for(big), sent=0.0)
    assert len(message) == 2 and not message[0].inline and len(message[1]) == 4000
    np.testing.assert_array_equal(unpack(message[0], message[1:])["x"], big["x"])
    words = {"w": np.array(["a", "bc"], dtype=object), "n": np.ones(2)}
    message = pack(words, slots_for(words), sent=0.0)
    back = unpack(message[0], message[1:])
    assert back["w"].tolist() == ["a", "bc"] and back["n"].tolist() == [1.0, 1.0]


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
            inline_in=True,
        ),
        Leg(
            1,
            received=10.007,
            run_seconds=0.002,
            sent=10.010,
            bytes_in=50,
            inline_in=True,
        ),
    )
    trip = Trip(1, 10.0, 10.012, legs, bytes_in=100, inline_in=True, bytes_out=20, inline_out=False)
    assert [round(h.seconds, 6) for h in trip.hops] == [0.002, 0.001, 0.002]
    assert [h.bytes for h in trip.hops] == [100, 50, 20] and not trip.hops[-1].inline
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
