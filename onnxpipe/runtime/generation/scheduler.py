"""The steps of a generation: prompts in, new tokens out, the cache kept by workers.

Each sequence runs as a chain of steps: a prefill step with its whole prompt, then one step per new
token.  A step's micro-batch carries what the split's IO contract says the model takes besides its cache
(:mod:`.feeds`: the new token ids, the attention mask, the positions of the new tokens), plus the
control tensor that tells each worker which
caches to read and grow (:mod:`onnxpipe.runtime.kvstate`); the caller never sends or receives the cache.

**Sequences batched, continuously.**  A decode step's cost is mostly reading the weights, the same for
one sequence as for eight: so decode steps carry several sequences (``batch`` of them at most), their
caches padded to the longest (where depends on the attention: :class:`~onnxpipe.runtime.kvstate.PadSide`)
and masked.  The sequences in flight are dealt into groups; each group has one step in the pipeline at
a time (its next tokens depend on that step's logits), and the groups fill the pipeline: while the last
stage decodes group A, the first decodes group B, so ``K`` stages are kept busy by ``K`` groups.  A
sequence that ends leaves its group at once, and a waiting prompt takes its place: its prefill runs as a
step of its own (a prompt's tokens are not padded against other prompts), and it joins the group's next
step.  A group stays in one lane (its caches live in that lane's workers): with replicas (several
lanes), groups are spread over the lanes in turn.

**A lost worker.**  On Ray, a stage's actor whose node died is started again on another node, empty; a
step that lost its sequences' caches with it comes back as :class:`~onnxpipe.core.errors.CacheLost`.
Each of its sequences is then rebuilt: a prefill of its prompt and every token it made so far, through
the whole pipeline (the stages that kept their caches start them again), whose last logits make the
token the lost step would have made.  The tokens are the same as without the loss.

Batched or not, each sequence's tokens are the ones it makes alone, greedy or sampled (seeded per
sequence: :func:`draw`): the unsplit model's, which a split is checked against.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field

import numpy as np

from onnxpipe.core.errors import CacheLost, UsageError
from onnxpipe.runtime.base import Tensors
from onnxpipe.runtime.generation.feeds import StepFeeds
from onnxpipe.runtime.kvstate import Control, PadSide, Row, StepFlags
from onnxpipe.runtime.options import GenerateOptions, Sampling

Submit = Callable[[Tensors, int], "Future[Tensors]"]
"""Queue one step's feeds in a lane; the future's result holds the logits."""
OnToken = Callable[[int, int], None]
"""Told each new token as it is made: (the prompt's index, the token)."""


@dataclass(frozen=True)
class Run:
    """What the steps made: each sequence's new tokens (in prompt order) and when each came (seconds from
    the start), the wall time, the steps run, the sequences a step carried at most, the sequences rebuilt
    after a lost worker.  :class:`~onnxpipe.runtime.generation.result.Generation` is made of it."""

    tokens: tuple[tuple[int, ...], ...]
    times: tuple[tuple[float, ...], ...]
    seconds: float
    steps: int
    batch: int
    rebuilt: int


@dataclass(frozen=True)
class Batching:
    """How steps carry sequences: ``size`` at most per decode step, caches padded on ``side``."""

    size: int = 1
    side: PadSide = PadSide.LEFT


def batch_size(options: GenerateOptions, stages: int, lanes: int) -> int:
    """Sequences per decode step: ``options.batch``, else enough for ``stages`` steps in each lane to
    hold every sequence in flight (the fewest steps that keep every stage busy, each as full as can be)."""
    if options.batch is not None:
        return options.batch
    in_flight = options.in_flight or len(options.prompt_ids)
    return max(1, math.ceil(in_flight / (stages * lanes)))


@dataclass
class _Sequence:
    index: int
    ident: int
    prompt: tuple[int, ...]
    rng: np.random.Generator | None = None
    new: list[int] = field(default_factory=list)
    cached: int = 0
    times: list[float] = field(default_factory=list)
    """When each new token came, from the start."""


@dataclass
class _Group:
    """Sequences that step together, in one lane: at most one step of theirs in the pipeline."""

    lane: int
    members: list[_Sequence] = field(default_factory=list)
    ready: list[_Sequence] = field(default_factory=list)
    """Members whose last step came back (their prefill, or the group's step)."""
    busy: bool = False


# --------------------------------------------------------------------------------------------------
# the next token
#
# Greedy (the highest logit) is the default: it reproduces the unsplit model's tokens exactly, which is
# what a split is checked against.  Sampling is what a deployment serves, with the knobs ONNX Runtime
# GenAI's ``search`` options and Hugging Face's ``generate`` name (``do_sample``, ``temperature``,
# ``top_k``, ``top_p``).  It is seeded per sequence: prompt ``i`` draws from its own generator made of
# ``(seed, i)``, so its tokens depend neither on which sequences share the pipeline nor on the order their
# steps come back in.  The same seed through the split and through the unsplit model therefore gives the
# same tokens wherever their logits agree, and ``--compare`` checks a sampled run as it checks a greedy
# one.  The knobs are :class:`~onnxpipe.runtime.options.Sampling`; here, plain numpy on one row of
# logits; the filtering follows the usual order: temperature, then top-k, then top-p (the smallest set of
# the most likely tokens whose probabilities reach ``top_p``).


def generator(sampling: Sampling, sequence: int) -> np.random.Generator:
    """The generator of prompt ``sequence`` (its place among the prompts)."""
    return np.random.default_rng([sampling.seed, sequence])


def probabilities(sampling: Sampling, logits: np.ndarray) -> np.ndarray:
    """The distribution a token is drawn from, over the whole vocabulary (zeros where filtered)."""
    z = np.asarray(logits, dtype=np.float64)
    with np.errstate(over="ignore"):  # at most 0: a tiny temperature sends the rest to -inf, no nan
        z = (z - np.max(z)) / sampling.temperature
    if sampling.top_k and sampling.top_k < z.size:
        kth = np.partition(z, z.size - sampling.top_k)[z.size - sampling.top_k]
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z)
    p /= p.sum()
    if sampling.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        reach = np.cumsum(p[order])
        keep = int(np.searchsorted(reach, sampling.top_p)) + 1  # the smallest set reaching top_p
        mask = np.zeros_like(p, dtype=bool)
        mask[order[:keep]] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return p


def draw(sampling: Sampling, logits: np.ndarray, rng: np.random.Generator) -> int:
    """One token from ``logits`` (one row over the vocabulary), with ``rng``."""
    cumulative = np.cumsum(probabilities(sampling, logits))
    at = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(at, cumulative.size - 1)


def next_token(
    logits: np.ndarray, sampling: Sampling | None = None, rng: np.random.Generator | None = None
) -> int:
    """The next token from the logits at the last position (``[batch, seq, vocab]`` or
    ``[batch, vocab]``) of the one sequence in the batch: the highest, or drawn as ``sampling`` says
    with the sequence's ``rng``."""
    last = logits[0, -1] if logits.ndim == 3 else logits[0]
    if sampling is None:
        return int(np.argmax(last))
    if rng is None:  # a fresh generator per call would draw the same number every step
        raise ValueError("sampling draws with the sequence's own generator: pass rng=generator(sampling, i)")
    return draw(sampling, last, rng)


class _Scheduler:
    """The continuous batching of :func:`generate`: admits prompts into groups, sends each group's step
    when its last one came back, and reads the tokens off the logits."""

    def __init__(
        self,
        submit: Submit,
        feeds: StepFeeds,
        options: GenerateOptions,
        groups: list[_Group],
        batching: Batching,
        limit: int,
    ) -> None:
        self.submit = submit
        self.feeds = feeds
        self.options = options
        self.groups = groups
        self.batching = batching
        self.limit = limit
        """Sequences in flight at most."""
        self.logits = str(feeds.contract.logits)
        self.stops = frozenset(options.eos_token_ids or ())
        self.sampling = options.sampling
        self.running: dict[Future[Tensors], tuple[list[_Sequence], _Group, bool]] = {}
        self.drops: list[Future[Tensors]] = []
        self.steps = 0
        self.rebuilt = 0
        """Sequences whose caches were built again by a prefill (their worker was lost)."""
        self.start = time.perf_counter()

    def _flags(self, s: _Sequence, first: bool) -> StepFlags:
        flags = StepFlags.START if first else StepFlags.NONE
        if len(s.new) + 1 >= self.options.max_new_tokens:
            flags |= StepFlags.END  # the token this step makes is the last: its cache goes with it
        return flags

    def admit(self, waiting: deque[_Sequence]) -> None:
        """Waiting prompts into the emptiest groups with room; each prefill a step of its own."""
        while waiting and sum(len(g.members) for g in self.groups) < self.limit:
            group = min(self.groups, key=lambda g: len(g.members))
            if len(group.members) >= self.batching.size:
                return
            s = waiting.popleft()
            group.members.append(s)
            self._prefill(s, s.prompt, group)

    def step_groups(self) -> None:
        """A step for each idle group with members ready: one new token each."""
        for group in self.groups:
            if group.busy or not group.ready:
                continue
            members, group.ready = group.ready, []
            rows = tuple(Row(s.ident, self._flags(s, False), s.cached) for s in members)
            control = Control(rows, self.batching.side)
            feeds = self.feeds.step([[s.new[-1]] for s in members], control)
            group.busy = True
            self._send(feeds, members, group, decode=True)
            for s in members:
                s.cached += 1

    def _send(self, feeds: Tensors, members: list[_Sequence], group: _Group, *, decode: bool) -> None:
        self.running[self.submit(feeds, group.lane)] = (members, group, decode)
        self.steps += 1

    def collect(self, on_token: OnToken | None) -> None:
        """Wait for a step to come back; its sequences' tokens, each sequence done or ready again."""
        done, _ = wait(list(self.running), return_when=FIRST_COMPLETED)
        now = time.perf_counter() - self.start
        for fut in done:
            members, group, decode = self.running.pop(fut)
            if decode:
                group.busy = False
            if isinstance(fut.exception(), CacheLost):
                self.rebuild(members, group)
                continue
            logits = fut.result()[self.logits]
            for i, s in enumerate(members):
                token = next_token(logits[i : i + 1], self.sampling, s.rng)
                s.new.append(token)
                s.times.append(now)
                if on_token is not None:
                    on_token(s.index, token)
                self._after(s, token, group)

    def rebuild(self, members: list[_Sequence], group: _Group) -> None:
        """A step that lost its sequences' caches with a worker (a Ray node died): each sequence's cache
        built again by a prefill of its prompt and its tokens so far, through every stage (a stage that
        kept its cache starts it again), whose logits make the token the lost step would have made."""
        for s in members:
            self._prefill(s, (*s.prompt, *s.new), group)
            self.rebuilt += 1

    def _prefill(self, s: _Sequence, tokens: tuple[int, ...], group: _Group) -> None:
        """A step of its own for ``s``, starting its cache with ``tokens``."""
        control = Control.one(s.ident, self._flags(s, True), 0)
        self._send(self.feeds.step([tokens], control), [s], group, decode=False)
        s.cached = len(tokens)

    def _after(self, s: _Sequence, token: int, group: _Group) -> None:
        if len(s.new) >= self.options.max_new_tokens:
            group.members.remove(s)  # its last step dropped its caches
        elif token in self.stops:
            group.members.remove(s)
            drop = Control.one(s.ident, StepFlags.DROP, s.cached)
            self.drops.append(self.submit(self.feeds.step([[token]], drop), group.lane))
        else:
            group.ready.append(s)

    def finish(self, seqs: list[_Sequence]) -> Run:
        seconds = time.perf_counter() - self.start
        for fut in self.drops:
            if not isinstance(fut.exception(), CacheLost):  # a cache lost is a cache dropped
                fut.result()
        return Run(
            tokens=tuple(tuple(s.new) for s in seqs),
            times=tuple(tuple(s.times) for s in seqs),
            seconds=seconds,
            steps=self.steps,
            batch=self.batching.size,
            rebuilt=self.rebuilt,
        )


def schedule(
    submit: Submit,
    lanes: int,
    step_feeds: StepFeeds,
    options: GenerateOptions,
    *,
    first_ident: int = 0,
    on_token: OnToken | None = None,
    batching: Batching | None = None,
) -> Run:
    """New tokens for each of ``options.prompt_ids`` through a pipeline's ``submit``, in groups spread
    over ``lanes``, each decode step carrying up to ``batching.size`` sequences (default: one);
    ``first_ident``: the first sequence id (ids must not repeat while caches are held); ``on_token`` is
    told each token as it comes.  ``options.eos_token_ids`` are the ids to stop at, as given (the
    model's are found by :func:`onnxpipe.runtime.generation.generator.settle`)."""
    sampling = options.sampling  # a sequence per prompt, each with its own draws when sampling
    seqs = [
        _Sequence(i, first_ident + i, p, rng=None if sampling is None else generator(sampling, i))
        for i, p in enumerate(options.prompt_ids)
    ]
    batching = batching or Batching()
    if batching.size > 1 and not step_feeds.can_pad(batching.side):
        raise UsageError(
            "this decoder takes no attention mask or no positions: sequences of different lengths cannot "
            "share a step; generate with batch=1"
        )
    in_flight = min(options.in_flight or len(seqs), len(seqs))
    count = max(lanes, math.ceil(in_flight / batching.size))
    groups = [_Group(lane=g % lanes) for g in range(count)]
    # no group holds more than its share of what is in flight
    size = max(1, min(batching.size, math.ceil(in_flight / count)))
    scheduler = _Scheduler(submit, step_feeds, options, groups, Batching(size, batching.side), in_flight)
    waiting = deque(seqs)
    while True:
        scheduler.admit(waiting)
        scheduler.step_groups()
        if not scheduler.running:
            break  # nothing waits, nothing is ready, nothing runs
        scheduler.collect(on_token)
    return scheduler.finish(seqs)
