"""The generation loop and a worker's KV state, on plain arrays and a fake pipeline (no model)."""

from __future__ import annotations

import argparse
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from onnxpipe.cli.arguments import token_ids
from onnxpipe.core.errors import UsageError
from onnxpipe.core.iocontract import Binding, IOContract, Role
from onnxpipe.core.kv import KVPair
from onnxpipe.runtime.generation.feeds import BUILDERS, StepFeeds
from onnxpipe.runtime.generation.result import Generation
from onnxpipe.runtime.generation.scheduler import Batching, Submit, batch_size, next_token, schedule
from onnxpipe.runtime.kvstate import CONTROL, CacheSlot, Control, KVState, PadSide, Row, StepFlags
from onnxpipe.runtime.options import GenerateOptions, LinkOptions, RunOptions

IO = IOContract.of_decoder(
    "input_ids",
    "attention_mask",
    "position_ids",
    "logits",
    (KVPair(0, "past.0.key", "past.0.value", "present.0.key", "present.0.value"),),
)
TYPES = {"input_ids": "int64", "attention_mask": "int64", "position_ids": "int64", CONTROL: "int64"}


def generate(
    submit: Submit, lanes: int, feeds: StepFeeds, options: GenerateOptions, batching: Batching | None = None
) -> Generation:
    """The steps scheduled, made into a generation as a generator makes it (no workers, no text)."""
    return Generation.of(schedule(submit, lanes, feeds, options, batching=batching), (), None)


def test_a_sequence_cache_starts_empty_grows_and_is_dropped() -> None:
    slots = (
        CacheSlot("past.0.key", "present.0.key", "float32", (None, 2, None, 4)),
        CacheSlot("past.3.value", None, "float16", (None, 2, None, 4)),  # read for its shape only
    )
    kv = KVState(slots)
    start = Control.one(7, StepFlags.START, 0)
    feeds = kv.feeds(start)
    assert feeds["past.0.key"].shape == (1, 2, 0, 4) and feeds["past.0.key"].dtype == np.float32
    assert feeds["past.3.value"].shape == (1, 2, 0, 4) and feeds["past.3.value"].dtype == np.float16
    grown = np.ones((1, 2, 5, 4), dtype=np.float32)
    kv.keep(start, {"present.0.key": grown})
    step = Control.one(7, StepFlags.NONE, 5)
    feeds = kv.feeds(step)
    assert feeds["past.0.key"] is grown  # onnxruntime's outputs are fresh: kept as they are
    assert feeds["past.3.value"].shape == (1, 2, 5, 4)  # zeros as long as the sequence's cache
    assert kv.caches == {7: {"past.0.key": grown}}  # only the sequence's own cache, nothing else
    kv.keep(Control.one(7, StepFlags.END, 5), {"present.0.key": grown})
    assert kv.caches == {}
    with pytest.raises(KeyError, match="sequence 7 has no cache here"):
        kv.feeds(step)


def test_a_copying_state_keeps_its_own_arrays_and_drop_forgets() -> None:
    kv = KVState((CacheSlot("p", "q", "float32", (None, None, 3)),), copy=True)
    start = Control.one(1, StepFlags.START, 0)
    assert kv.feeds(start)["p"].shape == (1, 0, 3)
    out = np.zeros((1, 1, 3), dtype=np.float32)
    kv.keep(start, {"q": out})
    out[:] = 9  # the runtime reuses its buffer for the next step
    assert not kv.feeds(Control.one(1, StepFlags.NONE, 1))["p"].any()
    kv.drop(Control.one(1, StepFlags.DROP, 1))
    assert kv.caches == {}


def test_control_round_trips_and_is_checked() -> None:
    c = Control.one(3, StepFlags.START | StepFlags.END, 12)
    assert Control.read(c.tensor()) == c
    both = Control((Row(3, StepFlags.NONE, 12), Row(4, StepFlags.END, 7)), PadSide.RIGHT)
    assert Control.read(both.tensor()) == both and both.length == 12
    with pytest.raises(ValueError, match=r"a header and a row per sequence"):
        Control.read(np.zeros(4, dtype=np.int64))
    with pytest.raises(ValueError, match=r"a header and a row per sequence"):
        Control.read(np.array([[2, 0, 0], [1, 0, 0]], dtype=np.int64))  # says 2 rows, holds 1


def test_step_feeds_grow_the_mask_and_positions() -> None:
    f = StepFeeds(IO, TYPES).step([[5, 6]], Control.one(0, StepFlags.NONE, 3))
    assert f["input_ids"].tolist() == [[5, 6]]
    assert f["attention_mask"].tolist() == [[1, 1, 1, 1, 1]]
    assert f["position_ids"].tolist() == [[3, 4]]
    assert f[CONTROL].tolist() == [[1, 0, 0], [0, 0, 3]]
    with pytest.raises(
        UsageError, match="model input 'token_type_ids' has no role in the split's IO contract"
    ):
        StepFeeds(IO, {**TYPES, "token_type_ids": "int64"})


def test_feeds_are_built_by_the_role_each_input_has_in_the_contract() -> None:
    """Whatever a model names its inputs, each is fed by its role's builder, in the model's dtype; an
    input bound to a role no builder makes is refused before any step."""
    kv = (KVPair(0, "cache_k", None, "cache_k_out", None),)
    contract = IOContract.of_decoder("tokens", "visible", "where", "scores", kv)
    assert [(b.tensor, b.role) for b in contract.inputs[:3]] == [
        ("tokens", Role.TOKEN_IDS),
        ("visible", Role.ATTENTION_MASK),
        ("where", Role.POSITIONS),
    ]
    types = {"where": "int32", "tokens": "int64", "visible": "float32", CONTROL: "int64"}
    step = StepFeeds(contract, types).step([[7, 8]], Control.one(0, StepFlags.NONE, 2))
    assert step["tokens"].tolist() == [[7, 8]] and step["tokens"].dtype == np.int64
    assert step["visible"].tolist() == [[1.0, 1.0, 1.0, 1.0]] and step["visible"].dtype == np.float32
    assert step["where"].tolist() == [[2, 3]] and step["where"].dtype == np.int32
    assert set(step) == {"tokens", "visible", "where", CONTROL}
    # each role the caller feeds has a builder; the cache roles are the workers'
    fed = {b.role for b in contract.inputs if not b.role.cached}
    assert fed <= set(BUILDERS) and not any(r.cached for r in BUILDERS)
    odd = IOContract((*contract.inputs, Binding("extra", Role.LOGITS)), contract.outputs)
    with pytest.raises(
        UsageError, match=r"model input 'extra' is the model's logits: .* cannot feed that role"
    ):
        StepFeeds(odd, {**types, "extra": "float32"})
    with pytest.raises(UsageError, match="model input 'cache_k' has no role"):  # the cache is no caller's
        StepFeeds(contract, {**types, "cache_k": "float32"})


def test_the_contract_pairs_each_layers_cache_and_says_what_it_lacks() -> None:
    assert IO.kv == (KVPair(0, "past.0.key", "past.0.value", "present.0.key", "present.0.value"),)
    assert IO.past_to_present() == {"past.0.key": "present.0.key", "past.0.value": "present.0.value"}
    assert IO.logits == "logits" and IO.problem() is None
    no_positions = IOContract.of_decoder("input_ids", None, None, None, IO.kv)
    assert no_positions.one(Role.POSITIONS) is None and no_positions.logits is None
    torn = IOContract(IO.inputs, tuple(b for b in IO.outputs if b.role != Role.PRESENT_VALUE))
    assert torn.problem() == "layer 0's cache has a past without its present (or the other way)"
    assert IOContract(IO.inputs[:3], ()).problem() == "no input is a layer's cache"
    assert IOContract(IO.inputs[1:], IO.outputs).problem() == "no input is the token ids or their embeddings"
    embeds = IOContract.of_decoder("inputs_embeds", None, None, "logits", IO.kv, Role.INPUTS_EMBEDS)
    assert (
        embeds.problem() is None and embeds.tokens == "inputs_embeds" and embeds.one(Role.TOKEN_IDS) is None
    )


def test_next_token_takes_the_last_position() -> None:
    logits = np.zeros((1, 3, 5), dtype=np.float32)
    logits[0, 0, 1] = logits[0, 2, 4] = 1.0
    assert next_token(logits) == 4
    assert next_token(logits[:, -1]) == 4


class FakePipe:
    """A pipeline whose "model" answers token ``(last id + 1) % 10`` for each sequence of a step; it
    records every step submitted as (lane, control, ids of each row)."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, Control, list[list[int]]]] = []

    def submit(self, feeds: dict[str, np.ndarray], lane: int) -> Future[dict[str, np.ndarray]]:
        control = Control.read(feeds[CONTROL])
        ids = feeds["input_ids"].tolist()
        self.steps.append((lane, control, ids))
        fut: Future[dict[str, np.ndarray]] = Future()
        logits = np.zeros((len(ids), len(ids[0]), 10), dtype=np.float32)
        for i, row in enumerate(ids):
            logits[i, -1, (row[-1] + 1) % 10] = 1.0
        fut.set_result({"logits": logits})
        return fut

    def rows(self) -> list[tuple[int, Row, list[int]]]:
        """Every sequence's part of every step: (lane, its row, its ids)."""
        return [(lane, r, ids[i]) for lane, c, ids in self.steps for i, r in enumerate(c.rows)]


def test_the_loop_runs_prefill_then_one_token_per_step_and_ends_each_cache() -> None:
    pipe = FakePipe()
    g = generate(pipe.submit, 2, StepFeeds(IO, TYPES), GenerateOptions(((1, 2, 3), (8,)), max_new_tokens=3))
    assert g.tokens == ((4, 5, 6), (9, 0, 1))
    assert g.steps == 6 and g.new_tokens == 6 and g.batch == 1
    by_seq: dict[int, list[tuple[int, Row, list[int]]]] = {}
    for lane, row, ids in pipe.rows():
        by_seq.setdefault(row.sequence, []).append((lane, row, ids))
    first = by_seq[0]
    assert [r.flags for _, r, _ in first] == [StepFlags.START, StepFlags.NONE, StepFlags.END]
    assert [r.cached for _, r, _ in first] == [0, 3, 4]
    assert [ids for _, _, ids in first] == [[1, 2, 3], [4], [5]]
    assert {lane for lane, _, _ in first} == {0} and {lane for lane, _, _ in by_seq[1]} == {1}
    assert len(g.token_gaps) == 4 and g.time_per_token(0.5) is not None
    one = generate(pipe.submit, 1, StepFeeds(IO, TYPES), GenerateOptions(((1,),), max_new_tokens=1))
    assert one.tokens == ((2,),) and pipe.steps[-1][1].rows[0].flags == StepFlags.START | StepFlags.END
    assert one.token_gaps == () and one.time_per_token(0.9) is None


def test_an_end_token_stops_the_sequence_and_drops_its_cache() -> None:
    pipe = FakePipe()
    g = generate(
        pipe.submit,
        1,
        StepFeeds(IO, TYPES),
        GenerateOptions(((1,), (5,)), max_new_tokens=5, eos_token_ids=(3,)),
    )
    assert g.tokens == ((2, 3), (6, 7, 8, 9, 0))
    drops = [r for _, r, _ in pipe.rows() if r.flags & StepFlags.DROP]
    assert [r.sequence for r in drops] == [0]


PROMPTS = ((1, 2, 3), (8,), (4, 4), (0,), (6, 5, 4, 3), (2,))


@pytest.mark.parametrize("side", list(PadSide))
def test_steps_carry_several_sequences_that_join_as_others_leave(side: PadSide) -> None:
    """Continuous batching: at most ``batch`` sequences a step and ``in_flight`` at once; an ended
    sequence's place goes to a waiting prompt (its prefill a step of its own); the tokens are those of a
    step per sequence."""
    options = GenerateOptions(PROMPTS, max_new_tokens=6, eos_token_ids=(7,), in_flight=4)
    alone = generate(FakePipe().submit, 1, StepFeeds(IO, TYPES), options)
    pipe = FakePipe()
    g = generate(pipe.submit, 1, StepFeeds(IO, TYPES), options, Batching(2, side))
    assert g.tokens == alone.tokens and g.batch == 2
    assert max(len(c.rows) for _, c, _ in pipe.steps) == 2
    assert all(c.side == side for _, c, _ in pipe.steps if len(c.rows) > 1)
    assert all(len(row) == 1 for _, c, ids in pipe.steps if len(c.rows) > 1 for row in ids)  # no prefill
    live: set[int] = set()
    most = 0
    for _, row, _ in pipe.rows():
        if row.flags & StepFlags.START:
            live.add(row.sequence)
        most = max(most, len(live))
        if row.flags & (StepFlags.END | StepFlags.DROP):
            live.discard(row.sequence)
    assert most == 4 and not live
    starts = [r.sequence for _, r, _ in pipe.rows() if r.flags & StepFlags.START]
    assert starts == list(range(len(PROMPTS)))
    assert g.steps < alone.steps


def test_embeddings_are_made_from_the_new_tokens_by_the_embedding_model() -> None:
    """A decoder taking ``inputs_embeds`` is fed the embedding model's output for the step's new tokens;
    without an embedding model the split is refused before any step, saying what it lacks."""
    contract = IOContract.of_decoder(
        "inputs_embeds", "attention_mask", None, "logits", IO.kv, Role.INPUTS_EMBEDS
    )
    types = {"inputs_embeds": "float32", "attention_mask": "int64", CONTROL: "int64"}
    table = np.arange(40, dtype=np.float64).reshape(10, 4)
    step = StepFeeds(contract, types, lambda ids: table[ids]).step(
        [[7, 2]], Control.one(0, StepFlags.NONE, 1)
    )
    assert step["inputs_embeds"].shape == (1, 2, 4) and step["inputs_embeds"].dtype == np.float32
    assert step["inputs_embeds"].tolist() == [table[[7, 2]].tolist()] and "input_ids" not in step
    with pytest.raises(
        UsageError,
        match="inputs_embeds: onnxpipe's generation loop cannot feed that role without its embedding model",
    ):
        StepFeeds(contract, types)


def test_a_model_that_cannot_pad_refuses_a_batch() -> None:
    no_positions = IOContract.of_decoder("input_ids", "attention_mask", None, "logits", IO.kv)
    types = {k: v for k, v in TYPES.items() if k != "position_ids"}
    feeds = StepFeeds(no_positions, types)
    assert feeds.can_pad(PadSide.RIGHT) and not feeds.can_pad(PadSide.LEFT)
    with pytest.raises(UsageError, match="sequences of different lengths cannot share a step"):
        generate(FakePipe().submit, 1, feeds, GenerateOptions(PROMPTS), Batching(2))


def test_batched_feeds_pad_the_mask_on_the_side_of_the_cache() -> None:
    rows = (Row(0, StepFlags.NONE, 3), Row(1, StepFlags.NONE, 1))
    feeds = StepFeeds(IO, TYPES)
    left = feeds.step([[5], [6]], Control(rows, PadSide.LEFT))
    assert left["input_ids"].tolist() == [[5], [6]]
    assert left["position_ids"].tolist() == [[3], [1]]
    assert left["attention_mask"].tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
    right = feeds.step([[5], [6]], Control(rows, PadSide.RIGHT))
    assert right["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]


@pytest.mark.parametrize("side", list(PadSide))
def test_a_step_of_several_stacks_padded_caches_and_splits_the_presents(side: PadSide) -> None:
    slots = (
        CacheSlot("p", "q", "float32", (None, 2, None, 3)),
        CacheSlot("shape_only", None, "float32", (None, 2, None, 3)),
    )
    kv = KVState(slots)
    a = np.full((1, 2, 3, 3), 1.0, dtype=np.float32)
    b = np.full((1, 2, 1, 3), 2.0, dtype=np.float32)
    kv.caches = {0: {"p": a}, 1: {"p": b}}
    step = Control((Row(0, StepFlags.NONE, 3), Row(1, StepFlags.NONE, 1)), side)
    fed = kv.feeds(step)
    assert fed["p"].shape == (2, 2, 3, 3) and fed["shape_only"].shape == (2, 2, 3, 3)
    padded = fed["p"][1, 0, :, 0].tolist()
    assert padded == ([0.0, 0.0, 2.0] if side == PadSide.LEFT else [2.0, 0.0, 0.0])
    # the model's present: the past with the new token's entry (9) where the attention writes it
    present = np.concatenate([fed["p"], np.full((2, 2, 1, 3), 9.0, dtype=np.float32)], axis=2)
    if side == PadSide.RIGHT:  # GroupQueryAttention writes each sequence's token after its own length
        present[1, :, 1] = 9.0
    kv.keep(step, {"q": present})
    assert kv.caches[0]["p"][0, 0, :, 0].tolist() == [1.0, 1.0, 1.0, 9.0]
    assert kv.caches[1]["p"][0, 0, :, 0].tolist() == [2.0, 9.0]
    kv.keep(Control((Row(0, StepFlags.END, 4), Row(1, StepFlags.NONE, 2)), side), {"q": present})
    assert set(kv.caches) == {1}


def test_the_default_batch_gives_each_stage_a_step() -> None:
    eight = GenerateOptions(tuple((i,) for i in range(8)))
    assert batch_size(eight, stages=2, lanes=1) == 4
    assert batch_size(eight, stages=3, lanes=1) == 3
    assert batch_size(eight, stages=2, lanes=2) == 2
    assert batch_size(GenerateOptions(eight.prompt_ids, in_flight=2), stages=4, lanes=1) == 1
    assert batch_size(GenerateOptions(eight.prompt_ids, batch=5), stages=2, lanes=1) == 5


def test_bad_requests_are_refused() -> None:
    pipe = FakePipe()
    feeds = StepFeeds(IO, TYPES)
    with pytest.raises(UsageError, match="at least one prompt"):
        generate(pipe.submit, 1, feeds, GenerateOptions())
    with pytest.raises(UsageError, match="prompt 0 holds no token id: give at least one"):
        generate(pipe.submit, 1, feeds, GenerateOptions(((),)))
    with pytest.raises(UsageError, match="`in_flight=0`"):
        GenerateOptions(((1,),), in_flight=0)
    with pytest.raises(UsageError, match="`batch=0`"):
        GenerateOptions(((1,),), batch=0)


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


def test_options_take_their_paths_as_strings() -> None:
    run = RunOptions(model="m.onnx", report="r.json", backend="ray", ray_resources="res.json")
    assert (run.model, run.report, run.ray_resources) == (Path("m.onnx"), Path("r.json"), Path("res.json"))
    per_stage = GenerateOptions(
        prompt_ids=((1,),), backend="ray", ray_resources=[{"num_cpus": 1}], tokenizer="tok"
    )
    assert per_stage.ray_resources == [{"num_cpus": 1}] and per_stage.tokenizer == Path("tok")
    assert LinkOptions(split="out", out=None).split == Path("out")


def test_every_ray_option_is_refused_without_the_ray_backend() -> None:
    """Each ``ray_`` option set off its default is another backend's: refused by name for local workers,
    taken for Ray (the defaults pass either way)."""
    given = {
        "ray_address": "auto",
        "ray_resources": "res.json",
        "ray_files": "shared",
        "ray_restarts": 2,
        "ray_restart_timeout": 5.0,
    }
    for name, value in given.items():
        with pytest.raises(UsageError, match=rf"`{name}`.* is for `backend=ray`"):
            RunOptions(**{name: value})  # type: ignore[arg-type]
        assert getattr(RunOptions(backend="ray", **{name: value}), name) is not None  # type: ignore[arg-type]
    assert RunOptions().ray_restarts == RunOptions(backend="ray").ray_restarts
