"""Unit tests of the rule that makes a decoder's stage copy its rotary tables and masks
(:mod:`onnxpipe.planning.decoder_recompute`): when copies are cheaper, and what they do to the stage costs."""

from __future__ import annotations

import math

import pytest

from onnxpipe.partition.result import Partition
from onnxpipe.planning.decoder_recompute import Copied, InputCopies, PhaseCosts, adjusted


def _part() -> Partition:
    return Partition(
        bounds=(0, 2, 4, 6),
        compute=(1.0, 2.0, 3.0),
        transfer=(0.0, 0.5, 0.5),
        stage_costs=(1.0, 2.5, 3.5),
        bottleneck=3.5,
        lower_bound=2.0,
        cut_bytes_total=10_000,
    )


def test_with_a_bandwidth_copies_are_made_when_faster_than_the_bytes() -> None:
    # 1000 bytes at 1e4 B/s: 0.1 s to send
    assert InputCopies._cheaper(0.05, 1000, 0.0, 0.0, 1e4)
    assert not InputCopies._cheaper(0.1, 1000, 0.0, 0.0, 1e4)  # as dear: send
    assert not InputCopies._cheaper(0.2, 1000, 0.0, math.inf, 1e4)  # the share plays no part then
    assert not InputCopies._cheaper(0.0, 0, 0.0, 1.0, 1e4)  # nothing spared, nothing copied


def test_with_no_bandwidth_copies_take_at_most_their_share_of_the_stage() -> None:
    assert InputCopies._cheaper(0.05, 1000, 0.04, 0.1, math.inf)
    assert not InputCopies._cheaper(0.05, 1000, 0.06, 0.1, math.inf)  # with the earlier copies, too dear
    # a phase's costs: one stage's own node table when given (a devices file), per micro-batch
    phase = PhaseCosts(
        "decode", {"n": 1.0}, {}, (1.0, 1.0), stage_node_seconds=({"n": 2.0}, {"n": 3.0}), scale=2
    )
    assert (phase.seconds(0, "n"), phase.seconds(1, "n"), phase.seconds(1, "other")) == (4.0, 6.0, 0.0)


def test_stage_costs_take_the_copies_and_lose_the_bytes() -> None:
    copied = {1: Copied(("cos",), ("n1", "n2"), (0.25,))}
    part = adjusted(_part(), copied, [0, 1000, 0], 0, 1e4)
    assert part.compute == (1.0, 2.25, 3.0)
    assert part.transfer == pytest.approx((0.0, 0.4, 0.5))
    assert part.stage_costs == pytest.approx((1.0, 2.65, 3.5))
    assert part.bottleneck == pytest.approx(3.5) and part.cut_bytes_total == 9000
    # links the plan treats as free keep their (zero) transfer; the copies still count
    free = adjusted(_part(), copied, [0, 1000, 0], 0, math.inf)
    assert free.transfer == (0.0, 0.5, 0.5) and free.compute[1] == 2.25
    # one bandwidth per stage, transfers overlapping compute (a devices file)
    over = adjusted(_part(), copied, [0, 1000, 0], 0, (math.inf, 1e4, 1e3), overlap=True)
    assert over.stage_costs == pytest.approx((1.0, 2.25, 3.0))
    assert over.bottleneck == pytest.approx(3.0) and over.lower_bound == 2.0
