"""What a generation made and took: :class:`Generation`, made in one place (:meth:`Generation.of`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from onnxpipe.runtime.generation.scheduler import Run
from onnxpipe.runtime.text import TextCodec


@dataclass(frozen=True)
class Generation:
    """The new tokens of each prompt (in prompt order) and what the generation took."""

    tokens: tuple[tuple[int, ...], ...]
    seconds: float
    """Wall time from the first step submitted to the last result."""
    steps: int
    """Steps run (prefill steps included; a step of several sequences counts once)."""
    first_token_seconds: tuple[float, ...] = ()
    """Per prompt: from the start to its first new token (its prefill's latency under load)."""
    texts: tuple[str, ...] | None = None
    """Per prompt: its new tokens as text, when it was generated with a tokenizer."""
    token_gaps: tuple[float, ...] = ()
    """The time between each sequence's consecutive tokens, every sequence's together (time per token)."""
    batch: int = 1
    """Sequences per step at most."""
    busy_shares: tuple[float, ...] = ()
    """Each worker's share of the wall time spent running its model (a pipeline's; empty elsewhere):
    the stage near 1 is the one the others wait for."""
    rebuilt: int = 0
    """Sequences whose KV caches were built again by a prefill of their tokens so far, after the worker
    that held them was lost (a Ray node that died; the tokens are the same)."""

    @staticmethod
    def of(
        run: Run, busy_seconds: Sequence[float], codec: TextCodec | None, *, lead: float = 0.0
    ) -> Generation:
        """The generation of ``run``: each worker's ``busy_seconds`` as shares of its wall time, and the
        new tokens as text where the prompts came as text (``codec``, their tokenizer).  ``lead``: the
        seconds before the run that its clock counts too (an encoder-decoder's encoding, as the plain
        loop it is compared with counts it: :mod:`.seq2seq`)."""
        seconds = run.seconds + lead
        return Generation(
            tokens=run.tokens,
            seconds=seconds,
            steps=run.steps,
            first_token_seconds=tuple((t[0] if t else 0.0) + lead for t in run.times),
            texts=None if codec is None else tuple(codec.decode(t) for t in run.tokens),
            token_gaps=tuple(b - a for t in run.times for a, b in pairwise(t)),
            batch=run.batch,
            busy_shares=tuple(b / seconds if seconds > 0 else 0.0 for b in busy_seconds),
            rebuilt=run.rebuilt,
        )

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def time_to_first_token(self) -> float | None:
        """The median time from the start to a sequence's first token (its prefill, under load)."""
        return float(np.median(self.first_token_seconds)) if self.first_token_seconds else None

    def time_per_token(self, quantile: float) -> float | None:
        """The ``quantile`` (0.5: the median) of the time between a sequence's tokens; None if no
        sequence made two."""
        return float(np.quantile(self.token_gaps, quantile)) if self.token_gaps else None
