"""What the graph tells GenAI: the managed tensors' names (the cache's as ``%d`` templates of the layer) and
the dims GenAI sizes its buffers with, read off a decoder's graph alone; and the refusal of a
``--genai-config FILE`` (read by :func:`onnxpipe.core.model_config.read_source_config`) that describes
another model than the graph."""

from __future__ import annotations

import re
from collections.abc import Sequence

from onnxpipe.core.errors import UsageError
from onnxpipe.core.iocontract import Role
from onnxpipe.core.kv import KVPair
from onnxpipe.core.model_config import SourceConfig
from onnxpipe.core.options import opt
from onnxpipe.export.genai.config import TensorNames, Unsupported
from onnxpipe.ir.decoder import DecoderInfo, logits_output
from onnxpipe.ir.decoder_dims import DecoderDims, decoder_dims
from onnxpipe.ir.model import ModelView


def tensor_names(
    ids: str, mask: str | None, positions: str | None, logits: str | None, kv: Sequence[KVPair]
) -> TensorNames | Unsupported:
    """The managed tensors' names, the cache's as ``%d`` templates; :class:`Unsupported` when GenAI's
    naming cannot express them (key and value in one tensor, names that follow no template)."""
    if logits is None:
        return Unsupported("no logits output was found")
    if not kv or any(p.past_value is None or p.present_value is None for p in kv):
        return Unsupported("key and value share one cache tensor per layer; GenAI needs them apart")
    if [p.layer for p in kv] != list(range(len(kv))):
        return Unsupported(
            "its cross-attention cache (an encoder-decoder's) has no place in GenAI's decoder config"
            if any(p.cross for p in kv)
            else "the cache's layers are not numbered 0 to N-1"
        )
    templates: list[str] = []
    for role in ("past_key", "past_value", "present_key", "present_value"):
        template = layer_template([getattr(p, role) for p in kv])
        if template is None:
            first = getattr(kv[0], role)
            return Unsupported(f"the cache names ({first}, ...) follow no single %d pattern of the layer")
        templates.append(template)
    pk, pv, qk, qv = templates
    return TensorNames(ids, mask, positions, pk, pv, logits, qk, qv)


_NUMBER = re.compile(r"(?<!\d)0(?!\d)")


def layer_template(names: Sequence[str]) -> str | None:
    """The ``%d`` template that gives ``names[i]`` for layer ``i`` (``past_key_values.%d.key``), or None.

    Layer 0's name is tried with each standalone ``0`` in turn as the placeholder; a name holding ``%``
    has none (GenAI would read it as a format)."""
    if not names or any("%" in n for n in names):
        return None
    for m in _NUMBER.finditer(names[0]):
        template = names[0][: m.start()] + "%d" + names[0][m.end() :]
        if all(template % i == n for i, n in enumerate(names)):
            return template
    return None


def model_facts(view: ModelView, dec: DecoderInfo) -> tuple[TensorNames, DecoderDims] | Unsupported:
    """The names and dims GenAI needs, from the graph alone (used before profiling to refuse a
    ``--genai-config`` early, and at export).

    The dims are :func:`onnxpipe.ir.decoder_dims.decoder_dims`'s (the cache's heads and head size from the
    past tensors or the attention node that reads them, the vocabulary from the logits or the embedding
    table, the hidden size from the embedding table, the positions from the position or rotary table);
    GenAI sizes its buffers with them, so a graph whose vocabulary neither tells is :class:`Unsupported`.
    """
    if dec.tokens == Role.INPUTS_EMBEDS:
        return Unsupported(
            f"the model takes {dec.ids_input!r}: GenAI feeds it from an embedding model, "
            "which a split's genai_config.json does not name yet"
        )
    logits = logits_output(view, set(dec.present_outputs))
    names = tensor_names(dec.ids_input, dec.mask_input, dec.positions_input, logits, dec.kv)
    if isinstance(names, Unsupported):
        return names
    dims = decoder_dims(view, dec)
    if dims.vocab_size is None:
        return Unsupported(
            f"the vocabulary size is neither the logits' ({names.logits}) last dim nor an embedding's"
        )
    managed = {dec.ids_input, dec.mask_input, dec.positions_input, *dec.past_inputs}
    extra = [t for t in view.inputs if t not in managed]
    if extra:
        return Unsupported(f"the model takes {extra[0]!r}, which GenAI does not feed")
    return names, dims


def check_source_fits(source: SourceConfig, dims: DecoderDims) -> None:
    """Refuse a ``--genai-config`` whose dims contradict the graph's: it describes another model, and GenAI
    would size its buffers wrongly; or whose token ids lie outside the vocabulary (:class:`UsageError`
    naming the file and the field)."""
    contradiction = source.dims.contradicted(dims)
    if contradiction is not None:
        name, stated, shown = contradiction
        raise UsageError(
            f"{source.path}: {name} is {stated}, but the model has {shown}; give this model's own "
            f"config, or leave {opt('genai_config')} out"
        )
    tokens = source.tokens
    if tokens is not None and dims.vocab_size is not None:
        for key, ids in (
            ("bos_token_id", (tokens.bos,)),
            ("eos_token_id", tokens.eos),
            ("pad_token_id", (tokens.pad,)),
        ):
            bad = [t for t in ids if t >= dims.vocab_size]
            if bad:
                raise UsageError(
                    f"{source.path}: {key} {bad[0]} is outside the model's vocabulary of {dims.vocab_size}; "
                    f"give this model's own config, or leave {opt('genai_config')} out"
                )
    for key, seen, said in (
        ("head_size", dims.head_size, source.dims.head_size),
        ("num_key_value_heads", dims.kv_heads, source.dims.kv_heads),
    ):
        if seen is None and said is None:
            raise UsageError(
                f"{source.path}: {key}: missing, and the model's past tensors leave it open; give it in "
                "the config"
            )
