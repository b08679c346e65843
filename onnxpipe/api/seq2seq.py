"""``split`` of an encoder-decoder folder (optimum's layout: :mod:`onnxpipe.ir.seq2seq`) as one family.

The ``K`` stages are dealt to the encoder and the decoder together, as one chain: the encoder's layers
first, then the decoder's.  The encoder runs once per sequence and the decoder once per token, so no one
time weighs both; what every stage holds whatever the traffic is its weights, so the chain is dealt by
*weight bytes* (from the initializers' shapes, external data included): of the counts that leave each part
one stage at least, the encoder gets the one whose largest stage holds the fewest bytes, the decoder the
rest, and each part is split by its own layers as any model is (the decoder's as a decoder: each layer's
self- and cross-attention caches on its stage).  The decoder is split as its one step graph
(:func:`~onnxpipe.ir.seq2seq.step_decoder`, kept beside the two splits as ``decoder_step_model.onnx``, a
second copy of the decoder's weights, with the folder's config and tokenizer files), and profiled at a
later step's sizes (no new encoder frames, the cross cache full), which is what most of a generation runs.

Generating (:func:`onnxpipe.api.generating.generate_folder`) runs the two splits one after the other:
every input through the encoder's stages, then the decoder's stages over the sequences (the encoder's and
the decoder's stages never work at once), each decode step carrying one sequence (the step graph takes no
attention mask, so sequences are not padded into one step).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path

import onnx

from onnxpipe.api.options import SplitOptions
from onnxpipe.api.results import SplitResult
from onnxpipe.core.errors import ModelLoadError, UsageError
from onnxpipe.core.events import Listener
from onnxpipe.core.model_config import config_beside
from onnxpipe.core.options import opt
from onnxpipe.export.outdir import check_target, staged_folder, writing
from onnxpipe.ir.model import PROTOBUF_LIMIT, initializer_nbytes
from onnxpipe.ir.seq2seq import (
    DECODER,
    ENCODER,
    ENCODER_OUTPUT,
    MERGED,
    WITH_PAST,
    find_seq2seq,
    step_decoder,
)
from onnxpipe.manifest import load_manifest
from onnxpipe.manifest.seq2seq import SEQ2SEQ_FILE, STEP_FILE, Seq2SeqRecord, read_seq2seq, write_seq2seq


def split_folder(
    folder: Path, options: SplitOptions, listener: Listener, split: Callable[..., SplitResult]
) -> SplitResult:
    """Split the encoder-decoder in ``folder`` into ``options.out`` (see the module docstring) by
    ``split`` (:func:`onnxpipe.api.splitting.split`, the door this is called from): the decoder's
    :class:`SplitResult`, its notes saying how the stages were dealt.  The whole family is written in a
    temporary folder that replaces ``options.out`` once complete, ``seq2seq.json`` last."""
    found = find_seq2seq(folder)
    if found is None:
        raise ModelLoadError(
            f"{folder}: a folder is split as an encoder-decoder (optimum's {ENCODER} with {DECODER} and "
            f"{WITH_PAST}, or with {MERGED}); it holds none: give a model file"
        )
    k = options.plan.stages
    if not isinstance(k, int) or k < 2:
        raise UsageError(f"{opt('stages', k)}: an encoder-decoder folder takes a count of 2 or more stages")
    out = options.out.absolute()
    check_target(out, force=options.export.force, protected=(folder,))
    encoder_proto = onnx.load(str(found.encoder), load_external_data=False)
    step = step_decoder(found)
    encoder_shapes, decoder_shapes = _given_shapes(options, encoder_proto, step)
    weights = (_weight_bytes(encoder_proto), _weight_bytes(step))
    k_encoder = _encoder_stages(k, weights)
    balance = (
        f"{k} stages dealt by weight bytes: the encoder ({weights[0] / 2**20:.1f} MiB, once per sequence) "
        f"{k_encoder} in encoder/, the decoder ({weights[1] / 2**20:.1f} MiB, per token) {k - k_encoder} in "
        "decoder/, each layer's self- and cross-attention caches on its stage"
    )
    beside = found.side_files
    with staged_folder(out, last=SEQ2SEQ_FILE) as tmp:
        decoder_options = _decoder_options(options, tmp, k - k_encoder, step, found.folder, decoder_shapes)
        with writing(out / STEP_FILE, out):
            large = step.ByteSize() > PROTOBUF_LIMIT  # Whisper-large's fp32 decoder holds 3.6 GB
            onnx.save(step, str(tmp / STEP_FILE), save_as_external_data=large, location=f"{STEP_FILE}.data")
            for path in beside:
                shutil.copy(path, tmp / path.name)
        encoder = split(
            found.encoder, _part(options, tmp / "encoder", k_encoder, encoder_shapes), listener=listener
        )
        decoder = split(tmp / STEP_FILE, decoder_options, listener=listener)
        record = Seq2SeqRecord(
            encoder="encoder",
            decoder="decoder",
            encoder_inputs=tuple(i.name for i in encoder_proto.graph.input),
            encoder_output=encoder_proto.graph.output[0].name,
            start_ids=found.start_ids,
            eos_ids=found.eos_ids,
            balance=balance,
            source=str(folder.absolute()),
            files=tuple(p.name for p in beside),
        )
        with writing(out / SEQ2SEQ_FILE, out):
            write_seq2seq(tmp, record)
    plan = decoder.manifest.plan
    notes = (f"encoder-decoder: {balance}; the stages shown are the decoder's", *found.notes, *plan.notes)
    manifest = dataclasses.replace(decoder.manifest, plan=dataclasses.replace(plan, notes=notes))
    report = decoder.report if encoder.ok else encoder.report
    return dataclasses.replace(decoder, manifest=manifest, out_dir=out, report=report)


def written_stages(result: SplitResult) -> str:
    """The stages ``result``'s split wrote, in words (what ``split`` prints): an encoder-decoder's two
    parts counted, its result's plan being the decoder's."""
    record = read_seq2seq(result.out_dir)
    k = result.plan.k
    if record is None:
        return f"{k} stages"
    encoder = load_manifest(result.out_dir / record.encoder, check_files=False).k
    parts = f"{encoder} in {record.encoder}/, {k} in {record.decoder}/, the decoder's shown"
    return f"{encoder + k} stages ({parts})"


def _weight_bytes(model: onnx.ModelProto) -> int:
    """The bytes of ``model``'s weights, from their shapes: those in external data count too."""
    return sum(initializer_nbytes(t) for t in model.graph.initializer)


def _encoder_stages(k: int, weights: tuple[int, int]) -> int:
    """The encoder's share of ``k`` stages (1 to ``k - 1``): the count whose largest stage holds the fewest
    bytes, each part's weights spread evenly over its stages (ties: the count nearest the encoder's share
    of the bytes)."""
    share = k * weights[0] / (sum(weights) or 1)
    return min(range(1, k), key=lambda e: (max(weights[0] / e, weights[1] / (k - e)), abs(e - share)))


def _given_shapes(
    options: SplitOptions, encoder: onnx.ModelProto, step: onnx.ModelProto
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """The ``--shape`` inputs the user gave, the encoder's and the decoder step's; a :class:`UsageError`
    for a name that is neither's input."""
    own = ({i.name for i in encoder.graph.input}, {i.name for i in step.graph.input})
    given = dict(options.profile.shapes)
    for name in given:
        if not any(name in names for names in own):
            raise UsageError(
                f"{opt('shapes', name)}: names no input of the encoder ({', '.join(sorted(own[0]))}) or of "
                "the decoder's step graph; give one of theirs, or leave it out"
            )
    encoder_shapes, decoder_shapes = ({n: d for n, d in given.items() if n in names} for names in own)
    return encoder_shapes, decoder_shapes


def _part(options: SplitOptions, out: Path, k: int, shapes: dict[str, tuple[int, ...]]) -> SplitOptions:
    """``options`` for one part: its folder, its stage count and its input shapes."""
    plan = dataclasses.replace(options.plan, stages=k)
    profile = dataclasses.replace(options.profile, shapes=shapes)
    return dataclasses.replace(options, out=out, plan=plan, profile=profile)


def _decoder_options(
    options: SplitOptions,
    out: Path,
    k: int,
    step: onnx.ModelProto,
    source: Path,
    given: dict[str, tuple[int, ...]],
) -> SplitOptions:
    """The decoder's options: a later step's sizes (no new frames, a full cross cache) where ``given``
    (the user's ``--shape``) sets none, a past within the model's positions, prompt tokens as many as its
    token input takes."""
    dims = {i.name: [d.dim_value or None for d in i.type.tensor_type.shape.dim] for i in step.graph.input}
    made = [o.type.tensor_type.shape.dim for o in step.graph.output if ".encoder." in o.name]
    frames = made[0][2].dim_value if made and len(made[0]) == 4 else 0  # the encoder's, where it fixes them
    shapes: dict[str, tuple[int, ...]] = {ENCODER_OUTPUT: (1, 0, dims[ENCODER_OUTPUT][2] or 1)}
    for name, d in dims.items():
        if ".encoder." in name and len(d) == 4:
            shapes[name] = (1, d[1] or 1, frames or 1, d[3] or 1)
        elif "encoder" in name and "mask" in name and len(d) == 2:  # T5's encoder_attention_mask
            shapes[name] = (1, frames or 1)
    part = _part(options, out / "decoder", k, shapes | given)
    decoder = part.plan.decoder
    config = config_beside(source / ENCODER).config  # Whisper's max_target_positions, 448
    positions = config.context_length if config is not None else None
    past = min(decoder.decode_past, positions - 1) if positions else decoder.decode_past
    new = dims["input_ids"][1] if len(dims.get("input_ids", [])) == 2 else None
    changed = dataclasses.replace(
        decoder,
        decode_past=past,
        prefill_tokens=min(decoder.prefill_tokens, new or decoder.prefill_tokens),
        max_context=min(decoder.max_context, positions or decoder.max_context),
    )
    return dataclasses.replace(part, plan=dataclasses.replace(part.plan, decoder=changed))
