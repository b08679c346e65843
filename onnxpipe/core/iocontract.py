"""A split's IO contract: what each model input and output of a generating model *is* to the loop that
drives it (token ids, attention mask, positions, a layer's past or present cache, the logits).

Written in the manifest by the planner (``plan.decoder.io``) and read back, so that a generation loop
needs neither the graph nor onnx to know what to feed: it asks the contract for the tensors of each role
and builds each from a feed builder of that role (:mod:`onnxpipe.runtime.generation.feeds`).  A new kind
of input (an ``inputs_embeds`` decoder's embeddings, an encoder's output, a cross-attention cache) is a new
:class:`Role` and a builder of it, not a new branch in the loop.

Kept on the ground floor, beside :mod:`onnxpipe.core.kv`, because both the planner that makes it and the
manifest that records it name it (the manifest sits below the planner today).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from onnxpipe.core.kv import KVPair


class Role(StrEnum):
    """What a model input or output is to a generation loop (the string is the manifest's spelling)."""

    TOKEN_IDS = "token_ids"
    """The new tokens' ids, ``[batch, new tokens]``."""
    INPUTS_EMBEDS = "inputs_embeds"
    """The new tokens' embeddings, ``[batch, new tokens, hidden]``, in place of their ids: a text decoder
    whose embedding model runs apart (GenAI's ``exclude_embeds`` layout of a vision-language model)."""
    ATTENTION_MASK = "attention_mask"
    """Ones over the cached and the new tokens, ``[batch, cached + new]``; zeros over padding."""
    POSITIONS = "positions"
    """Each new token's position, ``[batch, new tokens]``."""
    PAST_KEY = "past_key"
    """A layer's cached keys (or its keys and values in one tensor): fed by the worker that keeps it."""
    PAST_VALUE = "past_value"
    """A layer's cached values."""
    LOGITS = "logits"
    """The scores of the next token, ``[batch, new tokens, vocabulary]``."""
    PRESENT_KEY = "present_key"
    """A layer's keys grown by the new tokens: the next step's past key."""
    PRESENT_VALUE = "present_value"
    """A layer's values grown by the new tokens: the next step's past value."""
    ENCODER_OUTPUT = "encoder_output"
    """An encoder-decoder's encoder output, ``[batch, frames, hidden]``: fed at a sequence's first step,
    empty (no frames) at every later one (:mod:`onnxpipe.ir.seq2seq`)."""
    ENCODER_MASK = "encoder_mask"
    """An encoder-decoder's encoder attention mask, ``[batch, frames]`` (T5's and Marian's
    ``encoder_attention_mask``): ones over the encoder's frames, zeros over padding, at every step."""
    CROSS_PAST_KEY = "cross_past_key"
    """A layer's cross-attention keys, made from the encoder's output at the first step, then kept."""
    CROSS_PAST_VALUE = "cross_past_value"
    CROSS_PRESENT_KEY = "cross_present_key"
    CROSS_PRESENT_VALUE = "cross_present_value"

    @property
    def cached(self) -> bool:
        """Whether the tensor is a cache, kept by the worker of its layer's stage (it crosses no link)."""
        return self in _SELF_ROLE

    @property
    def self_role(self) -> Role:
        """The self-attention cache role a cross-attention cache role stands beside (itself otherwise)."""
        return _SELF_ROLE.get(self, self)


_SELF_ROLE = {
    **{r: r for r in (Role.PAST_KEY, Role.PAST_VALUE, Role.PRESENT_KEY, Role.PRESENT_VALUE)},
    Role.CROSS_PAST_KEY: Role.PAST_KEY,
    Role.CROSS_PAST_VALUE: Role.PAST_VALUE,
    Role.CROSS_PRESENT_KEY: Role.PRESENT_KEY,
    Role.CROSS_PRESENT_VALUE: Role.PRESENT_VALUE,
}
_CROSS_ROLE = {v: k for k, v in _SELF_ROLE.items() if k != v}


@dataclass(frozen=True)
class Binding:
    """One model input or output and its role; ``layer`` for a cache tensor (which layer's it is)."""

    tensor: str
    role: Role
    layer: int | None = None


@dataclass(frozen=True)
class IOContract:
    """Every model input and output a generation loop feeds or reads, each with its role.

    A model input with no binding is one the loop does not know how to feed: a generator refuses the
    split, naming it, before any worker starts."""

    inputs: tuple[Binding, ...]
    outputs: tuple[Binding, ...]

    @staticmethod
    def of_decoder(
        ids: str,
        mask: str | None,
        positions: str | None,
        logits: str | None,
        kv: tuple[KVPair, ...],
        tokens: Role = Role.TOKEN_IDS,
        encoder_output: str | None = None,
        encoder_mask: str | None = None,
    ) -> IOContract:
        """The contract of a decoder with a KV cache: its token (``tokens``: their ids or embeddings), mask
        and position inputs, its logits and each layer's cache pairs (as
        :func:`onnxpipe.ir.decoder.find_decoder` names them); an encoder-decoder's ``encoder_output``
        input, its ``encoder_mask`` one where it takes the encoder's mask, and cross-attention pairs too."""
        inputs = [Binding(ids, tokens)]
        named = (
            (mask, Role.ATTENTION_MASK),
            (positions, Role.POSITIONS),
            (encoder_output, Role.ENCODER_OUTPUT),
            (encoder_mask, Role.ENCODER_MASK),
        )
        inputs += [Binding(t, r) for t, r in named if t]
        outputs = [Binding(logits, Role.LOGITS)] if logits is not None else []
        for p in kv:
            roles = _CROSS_ROLE if p.cross else _SELF_ROLE
            inputs.append(Binding(p.past_key, roles[Role.PAST_KEY], p.layer))
            outputs.append(Binding(p.present_key, roles[Role.PRESENT_KEY], p.layer))
            if p.past_value is not None and p.present_value is not None:
                inputs.append(Binding(p.past_value, roles[Role.PAST_VALUE], p.layer))
                outputs.append(Binding(p.present_value, roles[Role.PRESENT_VALUE], p.layer))
        return IOContract(tuple(inputs), tuple(outputs))

    def named(self, role: Role) -> tuple[str, ...]:
        """The tensors of ``role``, inputs then outputs, in the contract's order."""
        return tuple(b.tensor for b in (*self.inputs, *self.outputs) if b.role == role)

    def one(self, role: Role) -> str | None:
        """The tensor of ``role``, where the model has one (``None`` where it has none)."""
        found = self.named(role)
        return found[0] if found else None

    @property
    def logits(self) -> str | None:
        return self.one(Role.LOGITS)

    @property
    def kv(self) -> tuple[KVPair, ...]:
        """Each layer's cache tensors, by layer, the self-attention pairs before the cross-attention ones."""
        by_layer: dict[tuple[bool, int], dict[Role, str]] = {}
        for b in (*self.inputs, *self.outputs):
            if b.role.cached and b.layer is not None:
                by_layer.setdefault((b.role != b.role.self_role, b.layer), {})[b.role.self_role] = b.tensor
        return tuple(
            KVPair(
                layer=layer,
                past_key=t[Role.PAST_KEY],
                past_value=t.get(Role.PAST_VALUE),
                present_key=t[Role.PRESENT_KEY],
                present_value=t.get(Role.PRESENT_VALUE),
                cross=cross,
            )
            for (cross, layer), t in sorted(by_layer.items())
        )

    def past_to_present(self) -> dict[str, str]:
        """Each past input's present output (the next step's past)."""
        return {p: q for r in self.kv for p, q in zip(r.pasts, r.presents, strict=True)}

    @property
    def tokens(self) -> str | None:
        """The input the new tokens are fed through: their ids, else their embeddings."""
        return self.one(Role.TOKEN_IDS) or self.one(Role.INPUTS_EMBEDS)

    def problem(self) -> str | None:
        """Why the contract cannot drive a generation (no token ids or embeddings, no cache, a past
        without its present), else ``None``."""
        if self.tokens is None:
            return "no input is the token ids or their embeddings"
        layers: dict[tuple[int, bool], set[Role]] = {}
        for b in (*self.inputs, *self.outputs):
            if b.role.cached:
                if b.layer is None:
                    return f"cache tensor {b.tensor!r} names no layer"
                layers.setdefault((b.layer, b.role != b.role.self_role), set()).add(b.role.self_role)
        if not layers:
            return "no input is a layer's cache"
        for (layer, _), roles in sorted(layers.items()):
            values = {Role.PAST_VALUE, Role.PRESENT_VALUE} & roles
            if not {Role.PAST_KEY, Role.PRESENT_KEY} <= roles or len(values) == 1:
                return f"layer {layer}'s cache has a past without its present (or the other way)"
        return None
