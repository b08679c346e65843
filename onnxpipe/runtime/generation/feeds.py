"""A generation step's feeds, built role by role from the split's IO contract.

Each model input the caller sends has a role in the contract (:class:`~onnxpipe.core.iocontract.Role`);
each role the caller feeds has one builder here (:data:`BUILDERS`), which makes its tensor from the step
(:class:`Step`: each sequence's new tokens and what it has cached).  The cache roles are no caller's: the
worker of each layer's stage feeds them (:mod:`onnxpipe.runtime.kvstate`).  A model input with no role,
or a role with no builder, is refused when the feeds are made, before any worker runs.  A new kind of
input is a new role and a builder of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from onnxpipe.core.errors import UsageError
from onnxpipe.core.iocontract import IOContract, Role
from onnxpipe.runtime.base import Tensors
from onnxpipe.runtime.kvstate import CONTROL, Control, PadSide


@dataclass(frozen=True)
class Step:
    """One step of ``control``'s sequences: ``tokens[i]``, the new tokens of its ``i``-th, after the
    tokens it has cached (a prefill: one sequence, its whole prompt; a decode step: one token each)."""

    tokens: tuple[tuple[int, ...], ...]
    control: Control

    @property
    def cached(self) -> np.ndarray:
        """Each sequence's cached tokens, ``[B]``."""
        return np.array([r.cached for r in self.control.rows])

    @property
    def new(self) -> int:
        """New tokens per sequence (the same for each)."""
        return len(self.tokens[0])


def token_ids(step: Step) -> np.ndarray:
    """The new tokens, ``[B, new]``."""
    return np.asarray(step.tokens)


def attention_mask(step: Step) -> np.ndarray:
    """``[B, length + new]``: ones over each sequence's cached and new tokens, zeros over the padding of
    a shorter sequence's cache, on the side the caches are padded (:class:`PadSide`)."""
    length = step.control.length
    slots = np.arange(length + step.new)[None, :]
    cached = step.cached[:, None]
    if step.control.side == PadSide.LEFT:
        return slots >= length - cached
    return slots < cached + step.new


def positions(step: Step) -> np.ndarray:
    """Each new token's position, ``[B, new]``: after the sequence's own cached tokens."""
    return step.cached[:, None] + np.arange(step.new)[None, :]


BUILDERS: Mapping[Role, Callable[[Step], np.ndarray]] = {
    Role.TOKEN_IDS: token_ids,
    Role.ATTENTION_MASK: attention_mask,
    Role.POSITIONS: positions,
}
"""The builder of each role the caller feeds."""


class StepFeeds:
    """Makes a step's feeds for the model inputs the caller sends (each by its role's builder), in the
    model's dtypes, plus :data:`~onnxpipe.runtime.kvstate.CONTROL`."""

    def __init__(
        self,
        contract: IOContract,
        input_types: Mapping[str, str],
        embedding: Callable[[np.ndarray], np.ndarray] | None = None,
        builders: Mapping[Role, Callable[[Step], np.ndarray]] | None = None,
    ) -> None:
        """``embedding``: the token ids' embeddings (:class:`~.embedding.Embedding`), the builder of
        :attr:`Role.INPUTS_EMBEDS` where the model takes them in place of the ids; ``builders``: those of
        roles only the caller can make (an encoder-decoder's encoder output, :mod:`.seq2seq`)."""
        self.contract = contract
        self.input_types = dict(input_types)
        """The model inputs the caller sends (name: dtype), :data:`~onnxpipe.runtime.kvstate.CONTROL`
        included."""
        roles = {b.tensor: b.role for b in contract.inputs}
        fed = [n for n in input_types if n != CONTROL]
        unknown = [n for n in fed if n not in roles or roles[n].cached]
        if unknown:
            raise UsageError(
                f"model input {unknown[0]!r} has no role in the split's IO contract (token ids, attention "
                "mask, positions, a layer's cache): onnxpipe's generation loop does not know what to feed it"
            )
        builders = {**BUILDERS, **(builders or {})}
        if embedding is not None:
            builders[Role.INPUTS_EMBEDS] = lambda step: embedding(token_ids(step))
        unfed = [n for n in fed if roles[n] not in builders]
        if unfed:
            raise UsageError(
                f"model input {unfed[0]!r} is the model's {roles[unfed[0]].value}: onnxpipe's generation "
                "loop cannot feed that role"
                + (" without its embedding model" if roles[unfed[0]] == Role.INPUTS_EMBEDS else "")
            )
        self.builders = tuple(
            (n, builders[roles[n]], np.dtype(t if t not in ("", "undefined") else "int64"))
            for n, t in input_types.items()
            if n != CONTROL
        )

    def can_pad(self, side: PadSide) -> bool:
        """Whether sequences of different lengths can share a step: the mask says which slots are
        theirs, and each new token's position is given (``RIGHT``: the attention reads it off the
        mask)."""
        has = self.contract.one
        return has(Role.ATTENTION_MASK) is not None and (
            side == PadSide.RIGHT or has(Role.POSITIONS) is not None
        )

    def step(self, tokens: Sequence[Sequence[int]], control: Control) -> Tensors:
        """The feeds of a step of ``control``'s sequences, ``tokens[i]`` the new tokens of its
        ``i``-th (each the same count)."""
        step = Step(tuple(tuple(t) for t in tokens), control)
        out: Tensors = {name: build(step).astype(dtype) for name, build, dtype in self.builders}
        out[CONTROL] = control.tensor()
        return out
