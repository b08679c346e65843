"""The next-token sampler (:func:`onnxpipe.runtime.generation.scheduler.draw`): temperature, top-k and
top-p filter as documented, draws follow the distribution, generators are per sequence and repeatable,
bad knobs are refused."""

from __future__ import annotations

import numpy as np
import pytest

from onnxpipe.core.errors import UsageError
from onnxpipe.runtime.generation.scheduler import draw, generator, next_token, probabilities
from onnxpipe.runtime.options import Sampling

LOGITS = np.array([2.0, 1.0, 0.5, 3.0, -1.0, 0.0], dtype=np.float32)


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def test_plain_sampling_is_the_softmax() -> None:
    assert np.allclose(probabilities(Sampling(), LOGITS), softmax(LOGITS.astype(np.float64)))


def test_temperature_divides_the_logits() -> None:
    assert np.allclose(
        probabilities(Sampling(temperature=0.5), LOGITS), softmax(2.0 * LOGITS.astype(np.float64))
    )


def test_top_k_keeps_the_k_most_likely() -> None:
    p = probabilities(Sampling(top_k=2), LOGITS)
    assert set(np.flatnonzero(p)) == {3, 0}
    assert p.sum() == pytest.approx(1.0)
    assert p[3] / p[0] == pytest.approx(np.exp(1.0))


def test_top_p_keeps_the_smallest_set_that_reaches_it() -> None:
    full = softmax(LOGITS.astype(np.float64))
    order = np.argsort(-full)
    for top_p in (0.3, 0.6, 0.9, 0.99):
        p = probabilities(Sampling(top_p=top_p), LOGITS)
        kept = np.flatnonzero(p)
        need = int(np.searchsorted(np.cumsum(full[order]), top_p)) + 1
        assert set(kept) == set(order[:need])
        assert full[kept].sum() >= top_p and full[order[: need - 1]].sum() < top_p


def test_draws_follow_the_distribution() -> None:
    s = Sampling(temperature=1.5, top_k=4, top_p=0.9, seed=1)
    rng = generator(s, 0)
    draws = np.bincount([draw(s, LOGITS, rng) for _ in range(20000)], minlength=LOGITS.size) / 20000
    assert np.allclose(draws, probabilities(s, LOGITS), atol=0.015)
    assert draws[np.flatnonzero(probabilities(s, LOGITS) == 0)].sum() == 0  # never a filtered token


@pytest.mark.parametrize("sampling", [Sampling(top_k=1, seed=3), Sampling(top_p=1e-6, seed=3)])
def test_keeping_one_token_is_greedy(sampling: Sampling) -> None:
    rng = generator(sampling, 0)
    for row in np.random.default_rng(0).normal(size=(50, 32)):
        assert draw(sampling, row, rng) == int(np.argmax(row))


def test_each_sequence_has_its_own_repeatable_generator() -> None:
    s = Sampling(seed=5)
    a = [draw(s, LOGITS, r) for r in (generator(s, 0),) for _ in range(30)]
    b = [draw(s, LOGITS, r) for r in (generator(s, 0),) for _ in range(30)]
    c = [draw(s, LOGITS, r) for r in (generator(s, 1),) for _ in range(30)]
    d = [draw(s, LOGITS, r) for r in (generator(Sampling(seed=6), 0),) for _ in range(30)]
    assert a == b and a != c and a != d


def test_next_token_reads_the_last_position() -> None:
    logits = np.zeros((1, 3, 6), dtype=np.float32)
    logits[0, -1] = LOGITS
    logits[0, 0, 4] = 9.0  # an earlier position's highest: not this step's token
    assert next_token(logits) == 3
    assert next_token(logits[:, -1]) == 3
    assert next_token(logits, Sampling(top_k=1), generator(Sampling(top_k=1), 0)) == 3
    with pytest.raises(ValueError, match="own generator"):
        next_token(logits, Sampling())  # a fresh generator each step would repeat one draw


def test_a_tiny_temperature_is_greedy_not_nan() -> None:
    p = probabilities(Sampling(temperature=1e-310), LOGITS)
    assert np.all(np.isfinite(p)) and p[3] == 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": 0.0}, "`temperature=0.0`"),
        ({"temperature": float("nan")}, "`temperature=nan`"),
        ({"top_k": -1}, "`top_k=-1`"),
        ({"top_p": 0.0}, "`top_p=0.0`"),
        ({"top_p": 1.5}, "`top_p=1.5`"),
        ({"seed": -2}, "`seed=-2`"),
    ],
)
def test_bad_knobs_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        Sampling(**kwargs)  # type: ignore[arg-type]
