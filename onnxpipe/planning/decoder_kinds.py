"""How a decoder LLM's split is asked for (:class:`DecoderOptions`), apart from
:mod:`onnxpipe.planning.decoder` so that options objects are made without loading the model code."""

from __future__ import annotations

from dataclasses import dataclass

from onnxpipe.core.choices import Ends, PhaseChoice, choice
from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt
from onnxpipe.ir.decoder_kinds import DECODE_PAST, PREFILL_TOKENS, PhaseShape, phase_shape

DEFAULT_MAX_CONTEXT = 4096
"""Tokens of context the KV cache memory is reported (and checked) for when ``--max-context`` is not
given: a common context length of today's small LLMs."""


@dataclass(frozen=True)
class DecoderOptions:
    """How a decoder is split: cuts between layers only (``layer_cuts``), where its ends go, and the
    context its KV cache memory is counted at."""

    layer_cuts: bool = True
    ends: Ends = Ends.FREE
    max_context: int = DEFAULT_MAX_CONTEXT
    phase: PhaseChoice = PhaseChoice.BOTH
    """The phase(s) the split is balanced for; ``both`` profiles the model at two shapes."""
    prefill_tokens: int = PREFILL_TOKENS
    decode_past: int = DECODE_PAST
    copy_inputs: bool = True
    """Whether a stage makes the rotary tables and masks of the model inputs instead of receiving them,
    where the plan's rule finds that cheaper (:mod:`onnxpipe.planning.decoder_recompute`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ends", choice(Ends, self.ends, "ends"))
        object.__setattr__(self, "phase", choice(PhaseChoice, self.phase, "phase"))
        self._check()

    def phases(self) -> tuple[PhaseShape, ...]:
        """The shapes to profile at: one phase, or prefill then decode for ``both``."""
        return tuple(
            phase_shape(p, prefill_tokens=self.prefill_tokens, decode_past=self.decode_past)
            for p in self.phase.phases
        )

    def _check(self) -> None:
        self.phases()  # refuses a bad prefill_tokens or decode_past
        if (
            isinstance(self.max_context, bool)
            or not isinstance(self.max_context, int)
            or self.max_context < 1
        ):
            raise UsageError(f"{opt('max_context', self.max_context)}: give a positive number of tokens")
