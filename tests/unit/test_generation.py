"""The generation loop and a worker's KV state, on plain arrays and a fake pipeline (no model)."""

from __future__ import annotations

import argparse
from concurrent.futures import Future

import numpy as np
import pytest

from onnxpipe.cli.argtypes import token_ids
from onnxpipe.core.errors import UsageError
from onnxpipe.manifest import DecoderIORecord, KVPair
from onnxpipe.runtime.generate import StepFeeds, generate, next_token
from onnxpipe.runtime.kvstate import CONTROL, CacheSlot, Control, KVState, StepFlags
from onnxpipe.runtime.options import GenerateOptions

IO = DecoderIORecord(
    "input_ids",
    "attention_mask",
    "position_ids",
    "logits",
    (KVPair(0, "past.0.key", "past.0.value", "present.0.key", "present.0.value"),),
)
TYPES = {"input_ids": "int64", "attention_mask": "int64", "position_ids": "int64", CONTROL: "int64"}


def test_a_sequence_cache_starts_empty_grows_and_is_dropped() -> None:
    slots = (
        CacheSlot("past.0.key", "present.0.key", "float32", (None, 2, None, 4)),
        CacheSlot("past.3.value", None, "float16", (None, 2, None, 4)),  # read for its shape only
    )
    kv = KVState(slots)
    start = Control(7, StepFlags.START, 0, 1)
    feeds = kv.feeds(start)
    assert feeds["past.0.key"].shape == (1, 2, 0, 4) and feeds["past.0.key"].dtype == np.float32
    assert feeds["past.3.value"].shape == (1, 2, 0, 4) and feeds["past.3.value"].dtype == np.float16
    grown = np.ones((1, 2, 5, 4), dtype=np.float32)
    kv.keep(start, {"present.0.key": grown})
    step = Control(7, StepFlags.NONE, 5, 1)
    feeds = kv.feeds(step)
    assert feeds["past.0.key"] is grown  # onnxruntime's outputs are fresh: kept as they are
    assert feeds["past.3.value"].shape == (1, 2, 5, 4)  # zeros as long as the sequence's cache
    assert kv.cached_bytes() == grown.nbytes
    kv.keep(Control(7, StepFlags.END, 5, 1), {"present.0.key": grown})
    assert kv.caches == {}
    with pytest.raises(KeyError, match="sequence 7 has no cache here"):
        kv.feeds(step)


def test_a_copying_state_keeps_its_own_arrays_and_drop_forgets() -> None:
    kv = KVState((CacheSlot("p", "q", "float32", (None, None, 3)),), copy=True)
    start = Control(1, StepFlags.START, 0, 2)
    assert kv.feeds(start)["p"].shape == (2, 0, 3)
    out = np.zeros((2, 1, 3), dtype=np.float32)
    kv.keep(start, {"q": out})
    out[:] = 9  # the runtime reuses its buffer for the next step
    assert not kv.feeds(Control(1, StepFlags.NONE, 1, 2))["p"].any()
    kv.drop(Control(1, StepFlags.DROP, 1, 2))
    assert kv.caches == {}


def test_control_round_trips_and_is_checked() -> None:
    c = Control(3, StepFlags.START | StepFlags.END, 12, 1)
    assert Control.read(c.tensor()) == c
    with pytest.raises(ValueError, match="4 integers"):
        Control.read(np.zeros(3, dtype=np.int64))


def test_step_feeds_grow_the_mask_and_positions() -> None:
    f = StepFeeds(IO, TYPES).feeds([5, 6], 3, Control(0, StepFlags.NONE, 3, 1))
    assert f["input_ids"].tolist() == [[5, 6]]
    assert f["attention_mask"].tolist() == [[1, 1, 1, 1, 1]]
    assert f["position_ids"].tolist() == [[3, 4]]
    assert f[CONTROL].tolist() == [0, 0, 3, 1]
    with pytest.raises(UsageError, match="model input 'token_type_ids' is none of"):
        StepFeeds(IO, {**TYPES, "token_type_ids": "int64"})


def test_next_token_takes_the_last_position() -> None:
    logits = np.zeros((1, 3, 5), dtype=np.float32)
    logits[0, 0, 1] = logits[0, 2, 4] = 1.0
    assert next_token(logits) == 4
    assert next_token(logits[:, -1]) == 4


class FakePipe:
    """A pipeline whose "model" answers token ``(last id + 1) % 10``; it records every step submitted."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, Control, list[int]]] = []
        self.in_flight = 0
        self.most = 0
        self.pending: list[tuple[Future[dict[str, np.ndarray]], int]] = []

    def submit(self, feeds: dict[str, np.ndarray], lane: int) -> Future[dict[str, np.ndarray]]:
        control = Control.read(feeds[CONTROL])
        ids = feeds["input_ids"][0].tolist()
        self.steps.append((lane, control, ids))
        fut: Future[dict[str, np.ndarray]] = Future()
        logits = np.zeros((1, len(ids), 10), dtype=np.float32)
        logits[0, -1, (ids[-1] + 1) % 10] = 1.0
        fut.set_result({"logits": logits})
        return fut


def test_the_loop_runs_prefill_then_one_token_per_step_and_ends_each_cache() -> None:
    pipe = FakePipe()
    g = generate(pipe.submit, 2, StepFeeds(IO, TYPES), GenerateOptions(((1, 2, 3), (8,)), max_new_tokens=3))
    assert g.tokens == ((4, 5, 6), (9, 0, 1))
    assert g.steps == 6 and g.new_tokens == 6
    by_seq: dict[int, list[tuple[int, Control, list[int]]]] = {}
    for lane, control, ids in pipe.steps:
        by_seq.setdefault(control.sequence, []).append((lane, control, ids))
    first = by_seq[0]
    assert [c.flags for _, c, _ in first] == [StepFlags.START, StepFlags.NONE, StepFlags.END]
    assert [c.cached for _, c, _ in first] == [0, 3, 4]
    assert [ids for _, _, ids in first] == [[1, 2, 3], [4], [5]]
    assert {lane for lane, _, _ in first} == {0} and {lane for lane, _, _ in by_seq[1]} == {1}
    one = generate(pipe.submit, 1, StepFeeds(IO, TYPES), GenerateOptions(((1,),), max_new_tokens=1))
    assert one.tokens == ((2,),) and pipe.steps[-1][1].flags == StepFlags.START | StepFlags.END


def test_an_end_token_stops_the_sequence_and_drops_its_cache() -> None:
    pipe = FakePipe()
    g = generate(
        pipe.submit,
        1,
        StepFeeds(IO, TYPES),
        GenerateOptions(((1,), (5,)), max_new_tokens=5, eos_token_ids=(3,)),
    )
    assert g.tokens == ((2, 3), (6, 7, 8, 9, 0))
    drops = [c for _, c, _ in pipe.steps if c.flags & StepFlags.DROP]
    assert [c.sequence for c in drops] == [0]


def test_bad_requests_are_refused() -> None:
    pipe = FakePipe()
    feeds = StepFeeds(IO, TYPES)
    with pytest.raises(UsageError, match="at least one prompt"):
        generate(pipe.submit, 1, feeds, GenerateOptions())
    with pytest.raises(UsageError, match="prompt 0 makes no token"):
        generate(pipe.submit, 1, feeds, GenerateOptions(((),)))
    with pytest.raises(UsageError, match="`in_flight=0`"):
        GenerateOptions(((1,),), in_flight=0).check()


def test_token_ids_argument() -> None:
    assert token_ids("1,2, 3") == (1, 2, 3)
    assert token_ids("4 5") == (4, 5)
    for text, message in (
        ("", "at least one"),
        ("1,a", "'a' is not a token id"),
        ("-1", "ids are 0 or more"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            token_ids(text)
