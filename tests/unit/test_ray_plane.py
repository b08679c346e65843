"""The data plane's frames and endpoints (``onnxpipe/runtime/backends/ray_plane.py``), on this machine's
loopback, without Ray."""

from __future__ import annotations

import queue
import socket
import threading
import time

import numpy as np
import pytest

from onnxpipe.runtime.backends.ray_plane import Endpoint, Frame, FrameReader, PlaneError, encode


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    return a, b


def test_a_frame_carries_its_meta_and_tensors_of_every_dtype() -> None:
    """Arrays of numbers travel as their bytes, and arrive as views of the frame's memory (bfloat16 and
    the other ml_dtypes too, named by their dtype's name), strided ones copied; arrays of Python
    objects and of dates travel pickled; a numpy scalar arrives as a 0-d array."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    raw = {
        "x": np.arange(12, dtype=np.float32).reshape(3, 4),
        "ids": np.array([[1, 2, 3]], dtype=np.int64),
        "half": np.ones((2, 2), dtype=np.float16),
        "bf16": np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16),
        "f8": np.array([0.5, -2.0], dtype=ml_dtypes.float8_e5m2),
        "int4": np.array([[1, -3]], dtype=ml_dtypes.int4),
        "complex": np.array([1 + 2j, 3j], dtype=np.complex64),
        "big_endian": np.arange(3, dtype=">i4"),
        "flag": np.array(True),
        "scalar": np.float32(2.5),
        "empty": np.zeros((0, 5), dtype=np.float32),
        "strided": np.arange(20, dtype=np.int32).reshape(4, 5)[:, ::2],
        "bf16_strided": np.ones((4, 4), dtype=ml_dtypes.bfloat16)[::2],
    }
    pickled = {
        "text": np.array(["a", "bc"], dtype=object),
        "dates": np.array(["2026-12-06"], dtype="datetime64[D]"),
    }
    tensors = {**raw, **pickled}
    a, b = _pair()
    with a, b:
        parts, nbytes = encode({"seq": 7, "stage": 1}, tensors)
        writer = threading.Thread(target=lambda: [a.sendall(p) for p in parts])
        writer.start()
        frame = FrameReader(b).read()
        writer.join()
    assert frame.meta == {"seq": 7, "stage": 1}
    assert frame.nbytes == nbytes == sum(p.nbytes for p in parts)
    assert list(frame.tensors) == list(tensors)
    for name, value in tensors.items():
        got = frame.tensors[name]
        assert got.dtype == value.dtype and got.shape == value.shape, name
        assert np.array_equal(got, value), name
        assert isinstance(got.base, bytearray) == (name in raw), name  # a view of the frame, or unpickled
    assert frame.tensors["x"].flags.writeable  # a stage may write into its inputs


def test_a_reader_takes_frames_that_came_together_or_in_pieces() -> None:
    """Frames written back to back (several in one read), one whose header comes in two pieces, and a
    large frame written in pieces each come whole, in order."""
    small = [encode(i, {"x": np.full(3, i, dtype=np.int64)}) for i in range(5)]
    large = encode("large", {"x": np.arange(1 << 18, dtype=np.float32)})  # 1 MiB: beyond a first read
    a, b = _pair()
    with a, b:

        def write() -> None:
            together = b"".join(bytes(p) for parts, _n in small for p in parts)
            a.sendall(together[:5])
            time.sleep(0.05)  # the reader has the first 5 bytes of a header
            a.sendall(together[5:])
            for p in large[0]:
                a.sendall(p)

        writer = threading.Thread(target=write)
        writer.start()
        reader = FrameReader(b)
        frames = [reader.read() for _ in range(6)]
        writer.join()
    assert [f.meta for f in frames] == [0, 1, 2, 3, 4, "large"]
    assert all(np.array_equal(f.tensors["x"], np.full(3, i)) for i, f in enumerate(frames[:5]))
    assert np.array_equal(frames[5].tensors["x"], np.arange(1 << 18, dtype=np.float32))
    assert [f.nbytes for f in frames] == [n for _p, n in small] + [large[1]]


def test_a_closed_connection_between_frames_is_an_eof() -> None:
    a, b = _pair()
    a.close()
    with b, pytest.raises(EOFError):
        FrameReader(b).read()


def test_endpoints_deliver_frames_in_order_and_both_ways() -> None:
    got: queue.SimpleQueue[Frame] = queue.SimpleQueue()
    back: queue.SimpleQueue[Frame] = queue.SimpleQueue()
    one = Endpoint("127.0.0.1", got.put)
    two = Endpoint("127.0.0.1", back.put)
    try:
        big = np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32)  # 1 MiB
        for seq in range(20):
            two.send(one.address, seq, {"big": big + seq})
        frames = [got.get(timeout=10) for _ in range(20)]
        assert [f.meta for f in frames] == list(range(20))
        assert all(np.array_equal(f.tensors["big"], big + f.meta) for f in frames)
        one.send(two.address, "reply", {})
        assert back.get(timeout=10).meta == "reply"
    finally:
        one.close()
        two.close()


def test_a_peer_that_goes_away_is_reported_with_its_address() -> None:
    broken: queue.SimpleQueue[str] = queue.SimpleQueue()
    receiver = Endpoint("127.0.0.1", lambda _f: None, lambda _peer, why: broken.put(why))
    sender = Endpoint("127.0.0.1", lambda _f: None)
    sender.send(receiver.address, 0, {"x": np.zeros(3)})
    sender.close()
    why = broken.get(timeout=10)
    assert "127.0.0.1" in why and "broke" in why
    receiver.close()


def test_an_address_nobody_listens_on_is_refused_in_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = Endpoint("127.0.0.1", lambda _f: None)
    try:
        with pytest.raises(PlaneError, match=f"cannot connect to 127.0.0.1:{port}"):
            endpoint.send(("127.0.0.1", port), 0, {})
    finally:
        endpoint.close()


def test_a_closed_endpoint_sends_nothing() -> None:
    endpoint = Endpoint("127.0.0.1", lambda _f: None)
    endpoint.close()
    with pytest.raises(PlaneError, match="closed"):
        endpoint.send(endpoint.address, 0, {})


def test_a_sender_never_waits_for_a_peer_that_does_not_read_and_keeps_the_order() -> None:
    """Frames written at once while the socket's buffer takes them, the rest by the connection's thread
    once the peer reads again: every ``send`` returns while the peer reads nothing (a sender that waited
    could close a cycle in which nobody reads), and every frame arrives whole and in order."""
    reading = threading.Event()
    got: queue.SimpleQueue[Frame] = queue.SimpleQueue()

    def slow(frame: Frame) -> None:
        reading.wait(30)
        got.put(frame)

    receiver = Endpoint("127.0.0.1", slow)
    sender = Endpoint("127.0.0.1", lambda _f: None)
    try:
        big = np.arange(8 << 20, dtype=np.uint8)  # three: more than both sockets' buffers take
        small = np.arange(10, dtype=np.int64)
        for seq in range(12):
            sender.send(receiver.address, seq, {"x": big if seq % 4 == 1 else small + seq})
        assert got.empty()
        (link,) = sender._senders.values()
        assert link._behind > 0  # what the buffers did not take waits for the connection's thread
        reading.set()
        frames = [got.get(timeout=30) for _ in range(12)]
        assert [f.meta for f in frames] == list(range(12))
        for f in frames:
            want = big if f.meta % 4 == 1 else small + f.meta
            assert np.array_equal(f.tensors["x"], want)
    finally:
        reading.set()
        sender.close()
        receiver.close()


def test_a_sequence_a_map_and_an_absent_optional_keep_their_type_and_many_tensors_fit_a_frame() -> None:
    """Values that are not arrays (ONNX sequences, maps, an absent optional) travel as they are, not
    stacked into one array; a frame of more pieces than one ``sendmsg`` takes (1,024) is still sent."""
    tensors: dict[str, object] = {
        "seq": [np.zeros(2, np.float32), np.ones(3, np.float32)],
        "map": [{"a": 1.0}],
        "none": None,
        **{f"t{i}": np.full(2, i, np.int32) for i in range(600)},
    }
    out: queue.SimpleQueue[Frame] = queue.SimpleQueue()
    receiver = Endpoint("127.0.0.1", out.put)
    sender = Endpoint("127.0.0.1", lambda _f: None)
    try:
        sender.send(receiver.address, "m", tensors)
        frame = out.get(timeout=10)
    finally:
        sender.close()
        receiver.close()
    seq = frame.tensors["seq"]
    assert isinstance(seq, list) and [a.shape for a in seq] == [(2,), (3,)]
    assert frame.tensors["map"] == [{"a": 1.0}] and frame.tensors["none"] is None
    assert all(np.array_equal(frame.tensors[f"t{i}"], np.full(2, i, np.int32)) for i in range(600))
