"""Choosing the next token from a step's logits: greedy, or sampled with a temperature, top-k and top-p.

Greedy (the highest logit) is the default: it reproduces the unsplit model's tokens exactly, which is
what a split is checked against.  Sampling is what a deployment serves, with the knobs ONNX Runtime
GenAI's ``search`` options and Hugging Face's ``generate`` name (``do_sample``, ``temperature``,
``top_k``, ``top_p``).  It is seeded per sequence: prompt ``i`` draws from its own generator made of
``(seed, i)``, so its tokens depend neither on which sequences share the pipeline nor on the order their
steps come back in.  The same seed through the split and through the unsplit model therefore gives the
same tokens wherever their logits agree, and ``--compare`` checks a sampled run as it checks a greedy
one.

The knobs are :class:`~onnxpipe.runtime.options.Sampling`; here, plain numpy on one row of logits; the
filtering follows the usual order: temperature, then top-k, then top-p (the smallest set of the most
likely tokens whose probabilities reach ``top_p``).
"""

from __future__ import annotations

import numpy as np

from onnxpipe.runtime.options import Sampling


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
