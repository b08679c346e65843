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
from pathlib import Path

import numpy as np
from onnx import helper

from onnxpipe.core.errors import UsageError
from onnxpipe.core.iocontract import IOContract, Role
from onnxpipe.core.model_config import GENAI_CONFIG_NAME
from onnxpipe.core.options import opt
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.export.boundary import from_ort
from onnxpipe.ir.joined import embedding_inputs, genai_embedding
from onnxpipe.manifest import Manifest
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


Builder = Callable[[Step], np.ndarray]
"""A step's feed of one role (:data:`BUILDERS`)."""


def token_ids(step: Step) -> np.ndarray:
    """The new tokens, ``[B, new]``."""
    return np.asarray(step.tokens)


def attention_mask(step: Step) -> np.ndarray:
    """``[B, length + new]``: ones over each sequence's cached and new tokens, zeros over the padding of
    a shorter sequence's cache, on the side the caches are padded (:meth:`PadSide.span`)."""
    control = step.control
    mask = np.zeros((len(control.rows), control.length + step.new), dtype=bool)
    for i, r in enumerate(control.rows):
        mask[i, control.side.span(control.length, r.cached, step.new)] = True
    return mask


def positions(step: Step) -> np.ndarray:
    """Each new token's position, ``[B, new]``: after the sequence's own cached tokens."""
    return step.cached[:, None] + np.arange(step.new)[None, :]


BUILDERS: Mapping[Role, Builder] = {
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
        builders: Mapping[Role, Builder] | None = None,
    ) -> None:
        """``embedding``: the token ids' embeddings (:class:`Embedding`), the builder of
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


# --------------------------------------------------------------------------------------------------
# the embedding model
#
# The embedding model of a decoder that takes ``inputs_embeds`` (GenAI's ``exclude_embeds`` layout of a
# vision-language model's text part): token ids in, the embeddings the split's first stage takes out.  It
# runs in the driver, as the first step of each generation step (:class:`Embedding`, the builder of the
# contract's :attr:`~onnxpipe.core.iocontract.Role.INPUTS_EMBEDS`): one small Gather over the table, for
# the step's new tokens only.  Which model: ``--embedding FILE.onnx``, else the one the folder's
# ``genai_config.json`` names (``model.embedding.filename``: the split's folder, then the source model's).
# That is for a split made without its embedding model: one made with it (``split --embedding``, or the
# one beside the model named) holds it in a stage and takes the token ids (:mod:`onnxpipe.ir.joined`).


class Embedding:
    """An embedding model's onnxruntime session: :meth:`__call__` turns token ids ``[B, new]`` into their
    embeddings ``[B, new, hidden]``.  Inputs besides the ids (a vision model's ``image_features``) are
    fed empty: a text-only prompt has no image."""

    def __init__(self, path: Path, ids: str | None = None, embeds: str | None = None) -> None:
        self.session = open_session(
            path, session_options(), fail=lambda e: UsageError(f"{path}: onnxruntime cannot open it ({e})")
        )
        infos = {i.name: from_ort(i.name, i.type, i.shape) for i in self.session.get_inputs()}
        # a sequence or a map (no tensor: None) has no element type; refused as neither ids nor floats
        inputs = {n: (t.elem_type, t.shape) if t is not None else (0, None) for n, t in infos.items()}
        self.ids, self.empty = embedding_inputs(path, inputs, ids)
        outputs = [o.name for o in self.session.get_outputs()]
        self.embeds = embeds or (
            "inputs_embeds" if "inputs_embeds" in outputs or len(outputs) > 1 else outputs[0]
        )
        if self.embeds not in outputs:
            raise UsageError(
                f"{path}: an embedding model takes the token ids and returns inputs_embeds; its outputs are "
                f"{', '.join(outputs)}"
            )
        self.ids_type = helper.tensor_dtype_to_np_dtype(inputs[self.ids][0])

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        feeds = {self.ids: ids.astype(self.ids_type), **self.empty}
        return np.asarray(self.session.run([self.embeds], feeds)[0])


def split_embedding(
    folder: Path, manifest: Manifest, contract: IOContract, given: Path | None
) -> Embedding | None:
    """The embedding model of the split in ``folder`` where its contract takes ``inputs_embeds``
    (``given``, else the one a ``genai_config.json`` names), else ``None``; a :class:`UsageError` saying
    what to give where it needs one and none is found, or where one is given to a token-id decoder."""
    embeds = contract.one(Role.INPUTS_EMBEDS)
    if embeds is None:
        if given is not None:
            raise UsageError(
                f"{opt('embedding', given)}: the split in {folder} takes token ids, not inputs_embeds; "
                "leave it out"
            )
        return None
    if given is not None:
        if not given.is_file():
            raise UsageError(f"{given}: no such embedding model file")
        return Embedding(given)
    looked = [folder / GENAI_CONFIG_NAME]
    if manifest.source.path is not None:
        looked.append((folder / manifest.source.path).resolve().parent / GENAI_CONFIG_NAME)
    for config in looked:
        named = genai_embedding(config)
        if named is not None:
            return Embedding(named.file, named.ids, named.embeds)
    raise UsageError(
        f"{folder}: the model takes {embeds!r}, made from the token ids by its embedding model; give it with "
        f"{opt('embedding', 'FILE.onnx')} (token ids in, inputs_embeds out) or a {GENAI_CONFIG_NAME} "
        f"naming it (model.embedding.filename); looked in {', '.join(str(p) for p in looked)}"
    )
