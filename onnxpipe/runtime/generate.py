"""Greedy generation through a decoder's pipeline: prompts in, new tokens out, the cache kept by workers.

Each sequence runs as a chain of steps: a prefill step with its whole prompt, then one step per new
token.  A step's micro-batch carries the new token ids, the attention mask (ones over the cached and the
new tokens) and the positions of the new tokens, plus the control tensor that tells each worker which
cache to read and grow (:mod:`onnxpipe.runtime.kvstate`); the caller never sends or receives the cache.

Several sequences are in flight at once, each with one step in the pipeline at a time (its next token
depends on the step's logits): while the last stage decodes sequence A, the first decodes sequence B, so
``K`` stages are kept busy by ``K`` or more sequences.  A sequence stays in one lane (its cache lives in
that lane's workers): with replicas (several lanes), sequences are spread over the lanes in turn.

Greedy by default: it is what reproduces the unsplit model's tokens exactly, which is what a split must be
checked against.  Sampling (temperature, top-k, top-p) is seeded per sequence
(:mod:`onnxpipe.runtime.sampling`), so a sampled run through the split and through the unsplit model
give the same tokens too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field

import numpy as np

from onnxpipe.core.errors import UsageError
from onnxpipe.manifest import DecoderIORecord
from onnxpipe.runtime.kvstate import CONTROL, Control, StepFlags
from onnxpipe.runtime.options import GenerateOptions, Sampling
from onnxpipe.runtime.sampling import draw, generator, last_logits

Tensors = dict[str, np.ndarray]
Submit = Callable[[Tensors, int], "Future[Tensors]"]
"""Queue one step's feeds in a lane; the future's result holds the logits."""
OnToken = Callable[[int, int], None]
"""Told each new token as it is made: (the prompt's index, the token)."""


@dataclass(frozen=True)
class Generation:
    """The new tokens of each prompt (in prompt order) and what the generation took."""

    tokens: tuple[tuple[int, ...], ...]
    seconds: float
    """Wall time from the first step submitted to the last result."""
    steps: int
    """Steps run (prefill steps included)."""
    first_token_seconds: tuple[float, ...] = ()
    """Per prompt: from the start to its first new token (its prefill's latency under load)."""
    texts: tuple[str, ...] | None = None
    """Per prompt: its new tokens as text, when it was generated with a tokenizer."""

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Sequence:
    index: int
    ident: int
    lane: int
    prompt: tuple[int, ...]
    new: list[int] = field(default_factory=list)
    cached: int = 0
    done: bool = False
    first_token_at: float | None = None
    rng: np.random.Generator | None = None

    @property
    def tokens(self) -> list[int]:
        return [*self.prompt, *self.new]


class StepFeeds:
    """Makes a step's feeds for a decoder's inputs (token ids, mask, positions), in the model's dtypes."""

    def __init__(self, io: DecoderIORecord, input_types: Mapping[str, str]) -> None:
        self.io = io
        pasts = {t for r in io.kv for t in r.pasts}
        known = {io.ids_input, io.mask_input, io.positions_input, CONTROL} | pasts
        other = [n for n in input_types if n not in known]
        if other:
            raise UsageError(
                f"model input {other[0]!r} is none of the token ids, the attention mask, the positions or "
                "the cache: onnxpipe's generation loop does not know what to feed it"
            )
        self.types = {
            n: np.dtype(t if t not in ("", "undefined") else "int64") for n, t in input_types.items()
        }

    def feeds(self, new: Sequence[int], cached: int, control: Control) -> Tensors:
        """``new`` tokens after ``cached`` ones: ids ``[1, n]``, mask ``[1, cached + n]``, positions."""
        n = len(new)
        io = self.io
        out: Tensors = {io.ids_input: np.asarray([new], dtype=self.types[io.ids_input])}
        if io.mask_input is not None:
            out[io.mask_input] = np.ones((1, cached + n), dtype=self.types[io.mask_input])
        if io.positions_input is not None:
            positions = np.arange(cached, cached + n)[None, :]
            out[io.positions_input] = positions.astype(self.types[io.positions_input])
        out[CONTROL] = control.tensor()
        return out


def next_token(
    logits: np.ndarray, sampling: Sampling | None = None, rng: np.random.Generator | None = None
) -> int:
    """The next token from the logits at the last position (``[batch, seq, vocab]`` or
    ``[batch, vocab]``) of the one sequence in the batch: the highest, or drawn as ``sampling`` says
    with the sequence's ``rng``."""
    last = last_logits(logits)
    if sampling is None:
        return int(np.argmax(last))
    if rng is None:  # a fresh generator per call would draw the same number every step
        raise ValueError("sampling draws with the sequence's own generator: pass rng=generator(sampling, i)")
    return draw(sampling, last, rng)


def _sequences(options: GenerateOptions, lanes: int, first_ident: int) -> list[_Sequence]:
    """A sequence per prompt, spread over the lanes in turn, each with its own draws when sampling."""
    options.check()
    for i, p in enumerate(options.prompt_ids):
        if len(p) == 0:
            raise UsageError(f"prompt {i} makes no token: give some text, or at least one token id")
    sampling = options.sampling
    return [
        _Sequence(i, first_ident + i, i % lanes, p, rng=None if sampling is None else generator(sampling, i))
        for i, p in enumerate(options.prompt_ids)
    ]


def generate(
    submit: Submit,
    lanes: int,
    step_feeds: StepFeeds,
    options: GenerateOptions,
    *,
    first_ident: int = 0,
    on_token: OnToken | None = None,
) -> Generation:
    """New tokens for each of ``options.prompt_ids`` through a pipeline's ``submit``, sequences spread
    over ``lanes``; ``first_ident``: the first sequence id (ids must not repeat while caches are held);
    ``on_token`` is told each token as it comes.  ``options.eos_token_ids`` are the ids to stop at, as
    given (the model's are found by :func:`onnxpipe.runtime.prompting.settle`)."""
    logits_name = step_feeds.io.logits_output
    assert logits_name is not None
    sampling = options.sampling
    stops = frozenset(options.eos_token_ids or ())
    seqs = _sequences(options, lanes, first_ident)
    limit = options.in_flight or len(seqs)
    waiting = list(reversed(seqs))
    running: dict[Future[Tensors], _Sequence] = {}
    drops: list[Future[Tensors]] = []
    steps = 0
    start = time.perf_counter()

    def step(s: _Sequence) -> None:
        nonlocal steps
        first = not s.new
        new = list(s.prompt) if first else [s.new[-1]]
        flags = StepFlags.START if first else StepFlags.NONE
        if len(s.new) + 1 >= options.max_new_tokens:
            flags |= StepFlags.END  # the token this step makes is the last: its cache goes with it
        control = Control(s.ident, flags, s.cached, 1)
        running[submit(step_feeds.feeds(new, s.cached, control), s.lane)] = s
        s.cached += len(new)
        steps += 1

    while waiting or running:
        while waiting and len(running) < limit:
            step(waiting.pop())
        done, _ = wait(list(running), return_when=FIRST_COMPLETED)
        for fut in done:
            s = running.pop(fut)
            token = next_token(fut.result()[logits_name], sampling, s.rng)
            s.new.append(token)
            if on_token is not None:
                on_token(s.index, token)
            if s.first_token_at is None:
                s.first_token_at = time.perf_counter() - start
            if len(s.new) >= options.max_new_tokens:
                s.done = True
            elif token in stops:
                s.done = True
                drop = Control(s.ident, StepFlags.DROP, s.cached, 1)
                drops.append(submit(step_feeds.feeds([token], s.cached, drop), s.lane))
            else:
                step(s)
    seconds = time.perf_counter() - start
    for fut in drops:
        fut.result()
    return Generation(
        tokens=tuple(tuple(s.new) for s in seqs),
        seconds=seconds,
        steps=steps,
        first_token_seconds=tuple(s.first_token_at or 0.0 for s in seqs),
    )
