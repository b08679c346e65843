"""The embedding model of a decoder that takes ``inputs_embeds`` (GenAI's ``exclude_embeds`` layout of a
vision-language model's text part): token ids in, the embeddings the split's first stage takes out.

It runs in the driver, as the first step of each generation step (:class:`Embedding`, the builder of the
contract's :attr:`~onnxpipe.core.iocontract.Role.INPUTS_EMBEDS`): one small Gather over the table, for
the step's new tokens only.  Which model: ``--embedding FILE.onnx``, else the one the folder's
``genai_config.json`` names (``model.embedding.filename``: the split's folder, then the source model's).
That is for a split made without its embedding model: one made with it (``split --embedding``, or the
one beside the model named) holds it in a stage and takes the token ids (:mod:`onnxpipe.ir.joined`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from onnxpipe.core.errors import UsageError
from onnxpipe.core.iocontract import IOContract, Role
from onnxpipe.core.model_config import GENAI_CONFIG_NAME
from onnxpipe.core.options import opt
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.ir.joined import embedding_inputs, genai_embedding
from onnxpipe.manifest import Manifest


class Embedding:
    """An embedding model's onnxruntime session: :meth:`__call__` turns token ids ``[B, new]`` into their
    embeddings ``[B, new, hidden]``.  Inputs besides the ids (a vision model's ``image_features``) are
    fed empty: a text-only prompt has no image."""

    def __init__(self, path: Path, ids: str | None = None, embeds: str | None = None) -> None:
        self.session = open_session(
            path, session_options(), fail=lambda e: UsageError(f"{path}: onnxruntime cannot open it ({e})")
        )
        inputs = {i.name: (_elem_type(i.type), tuple(i.shape)) for i in self.session.get_inputs()}
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


def _elem_type(ort_type: str) -> int:
    """The ONNX element type of onnxruntime's ``tensor(float16)``; ``UNDEFINED`` for a sequence, a map."""
    try:
        return int(
            onnx.TensorProto.DataType.Value(ort_type.removeprefix("tensor(").removesuffix(")").upper())
        )
    except ValueError:
        return onnx.TensorProto.UNDEFINED
