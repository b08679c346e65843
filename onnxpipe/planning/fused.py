"""Fused groups: kept whole by the cuts while that costs little, cut through when it costs much."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from onnxpipe.core.errors import PartitionError


class _Solution(Protocol):
    @property
    def bottleneck(self) -> float: ...

    @property
    def lower_bound(self) -> float:
        """A bound no partition beats, with or without the fused groups (it never looks at cuts)."""
        ...


_Solved = TypeVar("_Solved", bound=_Solution)
_Any = TypeVar("_Any")

FUSED_GROUP_SLACK = 0.05
"""Fused groups are kept whole only while that makes the slowest stage at most 5% slower than the best
split that may cut through them.  Cutting a group costs the fusion of a few nodes at one boundary (a
Conv's fused activation or residual sum run apart, measured and corrected by ``--calibrate``), while a
group that holds much of the model leaves no balanced cut at all: when value matching failed on an AVX2
machine, all of ResNet-50's Convs formed one group and its 2-stage split was no faster than one session
(the ``pipeline`` benchmark's result at commit 2844a3d)."""


def keeping_fused_groups(
    solve: Callable[[Sequence[bool] | None], _Solved],
    allowed: Sequence[bool],
    notes: list[str],
    cuttable: Sequence[bool] | None = None,
) -> _Solved:
    """``solve(allowed)``, unless cutting through the fused groups the profiler reported gives a
    slowest stage more than :data:`FUSED_GROUP_SLACK` faster, or they leave too few cut positions:
    then :func:`anywhere_cuttable` with a note (given once, however often the caller asks).

    ``cuttable``: where a stage may start at all (:attr:`onnxpipe.planning.sequences.Sequences.cuttable`,
    which ``allowed`` already respects); None: anywhere."""
    if all(allowed):
        return solve(allowed)
    if cuttable is not None and list(allowed) == list(cuttable):  # no fused group limits the cuts
        return anywhere_cuttable(solve, cuttable)
    try:
        kept = solve(allowed)
    except PartitionError:
        _note_once(notes, "fused groups had to be cut to make this many stages")
        return anywhere_cuttable(solve, cuttable)
    if kept.bottleneck <= (1 + FUSED_GROUP_SLACK) * kept.lower_bound:
        return kept  # no split beats the bound, so none beats this one by more than the slack
    free = anywhere_cuttable(solve, cuttable)
    if kept.bottleneck <= (1 + FUSED_GROUP_SLACK) * free.bottleneck:
        return kept
    _note_once(
        notes,
        f"fused groups were cut: keeping them whole would have made the slowest stage "
        f"{kept.bottleneck / free.bottleneck:.2f}x as slow (a group may hold much of the model when the "
        "profiler could not tell onnxruntime's fused nodes apart; see the profile's notes)",
    )
    return free


def anywhere_cuttable(
    solve: Callable[[Sequence[bool] | None], _Any], cuttable: Sequence[bool] | None
) -> _Any:
    """``solve(cuttable)``; ``solve(None)`` when that leaves too few cut positions for the stage count
    (a model of few nodes split into many stages: a stage may then hold only values its readers make
    again, and :func:`~onnxpipe.planning.stages.assign_stages` has it send them)."""
    if cuttable is None or all(cuttable):
        return solve(None)
    try:
        return solve(cuttable)
    except PartitionError:
        return solve(None)


def _note_once(notes: list[str], note: str) -> None:
    if note not in notes:
        notes.append(note)
