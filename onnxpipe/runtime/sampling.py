"""Choosing the next token from a step's logits: greedy, or sampled with a temperature, top-k and top-p.

Greedy (the highest logit) is the default: it reproduces the unsplit model's tokens exactly, which is
what a split is checked against.  Sampling is what a deployment serves, with the knobs ONNX Runtime
GenAI's ``search`` options and Hugging Face's ``generate`` name (``do_sample``, ``temperature``,
``top_k``, ``top_p``).  It is seeded per sequence: prompt ``i`` draws from its own generator made of
``(seed, i)``, so its tokens depend neither on which sequences share the pipeline nor on the order their
steps come back in.  The same seed through the split and through the unsplit model therefore gives the
same tokens wherever their logits agree, and ``--compare`` checks a sampled run as it checks a greedy
one.

Plain numpy on one row of logits; the filtering follows the usual order: temperature, then top-k, then
top-p (the smallest set of the most likely tokens whose probabilities reach ``top_p``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnxpipe.core.errors import UsageError


@dataclass(frozen=True)
class Sampling:
    """Sample the next token: logits over ``temperature``, only the ``top_k`` most likely (0: all),
    then only the most likely tokens whose probabilities add up to ``top_p`` (1.0: all), drawn with the
    sequence's generator from ``seed``."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.temperature > 0 and np.isfinite(self.temperature)):
            raise UsageError(f"temperature {self.temperature}: give a number above 0")
        if self.top_k < 0:
            raise UsageError(f"top_k {self.top_k}: give 0 (all tokens) or more")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"top_p {self.top_p}: give a number above 0 and at most 1")
        if self.seed < 0:
            raise UsageError(f"seed {self.seed}: give 0 or more")

    def generator(self, sequence: int) -> np.random.Generator:
        """The generator of prompt ``sequence`` (its place among the prompts)."""
        return np.random.default_rng([self.seed, sequence])

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """The distribution a token is drawn from, over the whole vocabulary (zeros where filtered)."""
        z = np.asarray(logits, dtype=np.float64)
        with np.errstate(over="ignore"):  # at most 0: a tiny temperature sends the rest to -inf, no nan
            z = (z - np.max(z)) / self.temperature
        if self.top_k and self.top_k < z.size:
            kth = np.partition(z, z.size - self.top_k)[z.size - self.top_k]
            z = np.where(z >= kth, z, -np.inf)
        p = np.exp(z)
        p /= p.sum()
        if self.top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            reach = np.cumsum(p[order])
            keep = int(np.searchsorted(reach, self.top_p)) + 1  # the smallest set reaching top_p
            mask = np.zeros_like(p, dtype=bool)
            mask[order[:keep]] = True
            p = np.where(mask, p, 0.0)
            p /= p.sum()
        return p

    def draw(self, logits: np.ndarray, rng: np.random.Generator) -> int:
        """One token from ``logits`` (one row over the vocabulary), with ``rng``."""
        cumulative = np.cumsum(self.probabilities(logits))
        at = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
        return min(at, cumulative.size - 1)


def last_logits(logits: np.ndarray) -> np.ndarray:
    """The logits at the last position of the one sequence in the batch (``[batch, seq, vocab]`` or
    ``[batch, vocab]``)."""
    row: np.ndarray = logits[0, -1] if logits.ndim == 3 else logits[0]
    return row
