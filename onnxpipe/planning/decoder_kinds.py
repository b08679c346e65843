"""The choices a decoder's split offers (where its ends go, which phases it is balanced for), apart from
:mod:`onnxpipe.planning.decoder` so that the CLI's parsers can offer them without loading the model code."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from onnxpipe.core.errors import UsageError
from onnxpipe.ir.decoder_kinds import DECODE_PAST, PREFILL_TOKENS, Phase, PhaseShape, phase_shape

DEFAULT_MAX_CONTEXT = 4096
"""Tokens of context the KV cache memory is reported (and checked) for when ``--max-context`` is not
given: a common context length of today's small LLMs."""


class Ends(StrEnum):
    """Where a decoder's embedding and LM head go."""

    FREE = "free"
    """Wherever the balance puts them."""
    ATTACHED = "attached"
    """The embedding with the first layer, the LM head with the last."""
    OWN = "own"
    """Each in a stage of its own (the first and the last), as Olive's ``unique_embeds_lm_head_splits``."""


class PhaseChoice(StrEnum):
    """Which phase a decoder's split is balanced for: a prompt, a generation step, or both at once."""

    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"


ENDS_CHOICES: tuple[str, ...] = tuple(e.value for e in Ends)
PHASE_CHOICES: tuple[str, ...] = tuple(p.value for p in PhaseChoice)


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
        if not isinstance(self.ends, Ends):
            if self.ends not in tuple(Ends):
                raise UsageError(f"--ends {self.ends!r}: choose one of {', '.join(e.value for e in Ends)}")
            object.__setattr__(self, "ends", Ends(self.ends))
        if not isinstance(self.phase, PhaseChoice):
            if self.phase not in tuple(PhaseChoice):
                raise UsageError(
                    f"--phase {self.phase!r}: choose one of {', '.join(p.value for p in PhaseChoice)}"
                )
            object.__setattr__(self, "phase", PhaseChoice(self.phase))

    def phases(self) -> tuple[PhaseShape, ...]:
        """The shapes to profile at: one phase, or prefill then decode for ``both``."""
        wanted = (
            (Phase.PREFILL, Phase.DECODE) if self.phase == PhaseChoice.BOTH else (Phase(self.phase.value),)
        )
        return tuple(
            phase_shape(p, prefill_tokens=self.prefill_tokens, decode_past=self.decode_past) for p in wanted
        )

    def check(self) -> None:
        self.phases()  # refuses a bad --prefill-tokens or --decode-past
        if (
            isinstance(self.max_context, bool)
            or not isinstance(self.max_context, int)
            or self.max_context < 1
        ):
            raise UsageError(f"--max-context {self.max_context!r}: give a positive number of tokens")
