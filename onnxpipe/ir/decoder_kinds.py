"""A decoder's two phases and their default sizes, apart from :mod:`onnxpipe.ir.decoder_dims` so that the
CLI's parsers can offer them without loading the model code (``onnxpipe --help`` stays fast)."""

from __future__ import annotations

from dataclasses import dataclass

from onnxpipe.core.choices import Phase
from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt

DECODE_PAST = 255
"""Cached tokens at the decode shape (a context of 256 with the new token): long enough for attention
over the cache to weigh as it does in real generation, short enough to profile quickly."""

PREFILL_TOKENS = 64
"""Prompt tokens at the prefill shape."""


@dataclass(frozen=True)
class PhaseShape:
    """One phase's sizes: ``sequence`` new tokens after ``past`` cached ones."""

    phase: Phase
    sequence: int
    past: int

    def describe(self) -> str:
        return f"{self.phase.value} ({self.sequence} new token(s) after {self.past} cached)"


def phase_shape(
    phase: Phase, *, prefill_tokens: int = PREFILL_TOKENS, decode_past: int = DECODE_PAST
) -> PhaseShape:
    """The sizes of ``phase`` (checked: a prefill of at least one token, a non-negative past)."""
    if prefill_tokens < 1:
        raise UsageError(f"{opt('prefill_tokens', prefill_tokens)}: give 1 or more")
    if decode_past < 0:
        raise UsageError(f"{opt('decode_past', decode_past)}: give 0 or more")
    if phase == Phase.PREFILL:
        return PhaseShape(phase, prefill_tokens, 0)
    return PhaseShape(phase, 1, decode_past)
