"""``split`` of an encoder-decoder folder (optimum's layout: :mod:`onnxpipe.ir.seq2seq`) as one family.

The ``K`` stages are dealt to the encoder and the decoder together, as one chain: the encoder's layers
first, then the decoder's.  The encoder runs once per sequence and the decoder once per token, so no one
time weighs both; what every stage holds whatever the traffic is its weights, so the chain is dealt by
*weight bytes*: the encoder gets ``round(K * encoder bytes / all bytes)`` stages (at least one, and one
at least is left to the decoder), the decoder the rest, and each part is split by its own layers as any
model is (the decoder's as a decoder: each layer's self- and cross-attention caches on its stage).  The
decoder is split as its one step graph (:func:`~onnxpipe.ir.seq2seq.step_decoder`), written beside the
two splits with the folder's config and tokenizer files, and profiled at a later step's sizes (no new
encoder frames, the cross cache full), which is what most of a generation runs.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import onnx

from onnxpipe.api.options import SplitOptions
from onnxpipe.api.results import GenerateResult, SplitResult
from onnxpipe.core.choices import Backend
from onnxpipe.core.errors import ExportError, ModelLoadError, UsageError
from onnxpipe.core.events import Listener
from onnxpipe.core.iocontract import Role
from onnxpipe.core.options import opt
from onnxpipe.export.outdir import check_target
from onnxpipe.ir.seq2seq import ENCODER_OUTPUT, Seq2SeqFolder, encoder_frames, find_seq2seq, step_decoder
from onnxpipe.manifest import load_manifest
from onnxpipe.manifest.seq2seq import Seq2SeqRecord, read_seq2seq, write_seq2seq
from onnxpipe.runtime.base import LocalConfig
from onnxpipe.runtime.generation.generator import Generator
from onnxpipe.runtime.generation.result import Generation
from onnxpipe.runtime.generation.seq2seq import encode, encoder_output, plain_greedy, read_inputs
from onnxpipe.runtime.options import GenerateOptions

STEP_FILE = "decoder_step_model.onnx"
_BESIDE = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def split_folder(
    folder: Path, options: SplitOptions, listener: Listener, split: Callable[..., SplitResult]
) -> SplitResult:
    """Split the encoder-decoder in ``folder`` into ``options.out`` (see the module docstring) by
    ``split`` (:func:`onnxpipe.api.splitting.split`, the door this is called from): the decoder's
    :class:`SplitResult`, its notes saying how the stages were dealt."""
    found = find_seq2seq(folder)
    if found is None:
        raise ModelLoadError(
            f"{folder}: a folder is split as an encoder-decoder (optimum's encoder_model.onnx, "
            "decoder_model.onnx and decoder_with_past_model.onnx); it holds none: give a model file"
        )
    k = options.plan.stages
    if not isinstance(k, int) or k < 2:
        raise UsageError(f"{opt('stages', k)}: an encoder-decoder folder takes a count of 2 or more stages")
    out = options.out.absolute()
    if read_seq2seq(out) is None:
        check_target(out, force=options.export.force, protected=(folder,))
    elif not options.export.force:  # an earlier encoder-decoder split: replaced with force only
        raise ExportError(f"{out}: holds an earlier encoder-decoder split; {opt('force')} replaces it")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    step = step_decoder(found)
    onnx.save(step, str(out / STEP_FILE))
    for name in _BESIDE:
        if (folder / name).is_file():
            shutil.copy(folder / name, out / name)
    weights = (found.encoder.stat().st_size, (out / STEP_FILE).stat().st_size)
    k_encoder = min(k - 1, max(1, round(k * weights[0] / sum(weights))))
    balance = (
        f"{k} stages dealt by weight bytes: the encoder ({weights[0] / 2**20:.1f} MiB, once per sequence) "
        f"{k_encoder} in encoder/, the decoder ({weights[1] / 2**20:.1f} MiB, per token) {k - k_encoder} in "
        "decoder/, each layer's self- and cross-attention caches on its stage"
    )
    encoder = split(found.encoder, _part(options, out / "encoder", k_encoder, {}), listener=listener)
    decoder = split(
        out / STEP_FILE, _decoder_options(options, out, k - k_encoder, step, found), listener=listener
    )
    encoder_proto = onnx.load(str(found.encoder), load_external_data=False)
    write_seq2seq(
        out,
        Seq2SeqRecord(
            encoder="encoder",
            decoder="decoder",
            encoder_inputs=tuple(i.name for i in encoder_proto.graph.input),
            encoder_output=encoder_proto.graph.output[0].name,
            start_ids=found.start_ids,
            eos_ids=found.eos_ids,
            balance=balance,
            source=str(folder.absolute()),
        ),
    )
    plan = decoder.manifest.plan
    notes = (f"encoder-decoder: {balance}; the stages shown are the decoder's", *plan.notes)
    manifest = dataclasses.replace(decoder.manifest, plan=dataclasses.replace(plan, notes=notes))
    report = decoder.report if encoder.ok else encoder.report
    return dataclasses.replace(decoder, manifest=manifest, out_dir=out, report=report)


def _part(options: SplitOptions, out: Path, k: int, shapes: dict[str, tuple[int, ...]]) -> SplitOptions:
    """``options`` for one part: its folder, its stage count and its input shapes."""
    plan = dataclasses.replace(options.plan, stages=k)
    profile = dataclasses.replace(options.profile, shapes=shapes)
    return dataclasses.replace(options, out=out, plan=plan, profile=profile)


def _decoder_options(
    options: SplitOptions, out: Path, k: int, step: onnx.ModelProto, found: Seq2SeqFolder
) -> SplitOptions:
    """The decoder's options: a later step's sizes (no new frames, a full cross cache), a past within
    the model's positions, prompt tokens as many as its token input takes."""
    dims = {i.name: [d.dim_value or None for d in i.type.tensor_type.shape.dim] for i in step.graph.input}
    frames = encoder_frames(found) or 1
    shapes: dict[str, tuple[int, ...]] = {ENCODER_OUTPUT: (1, 0, dims[ENCODER_OUTPUT][2] or 1)}
    for name, d in dims.items():
        if ".encoder." in name and len(d) == 4:
            shapes[name] = (1, d[1] or 1, frames, d[3] or 1)
    part = _part(options, out / "decoder", k, shapes)
    decoder = part.plan.decoder
    positions = _max_positions(found.folder)
    past = min(decoder.decode_past, positions - 1) if positions else decoder.decode_past
    new = dims["input_ids"][1] if len(dims.get("input_ids", [])) == 2 else None
    changed = dataclasses.replace(
        decoder,
        decode_past=past,
        prefill_tokens=min(decoder.prefill_tokens, new or decoder.prefill_tokens),
        max_context=min(decoder.max_context, positions or decoder.max_context),
    )
    return dataclasses.replace(part, plan=dataclasses.replace(part.plan, decoder=changed))


def _max_positions(folder: Path) -> int | None:
    """The decoder's positions, from the folder's config (``max_target_positions``, Whisper's 448)."""
    path = folder / "config.json"
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("max_target_positions")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 1 else None


def generate_folder(
    folder: Path, record: Seq2SeqRecord, options: GenerateOptions, say: Listener
) -> GenerateResult:
    """Generate from ``options.inputs`` through the encoder-decoder split in ``folder``
    (:mod:`onnxpipe.runtime.generation.seq2seq`): each row encoded by the encoder's split, then decoded
    greedily from the start tokens by the decoder's; with ``compare`` the folder's unsplit files too, as a
    plain onnxruntime loop."""
    if options.prompts or options.prompt_ids:
        raise UsageError(
            f"{folder}: an encoder-decoder split generates from its encoder's inputs ({opt('inputs')}), "
            f"not from prompts; leave out {opt('prompts')} and {opt('prompt_ids')}"
        )
    if options.backend != Backend.LOCAL or options.do_sample:
        given = (
            opt("backend", options.backend) if options.backend != Backend.LOCAL else opt("do_sample", True)
        )
        raise UsageError(
            f"{given}: an encoder-decoder split generates greedily on local workers (so far); leave it out"
        )
    rows = read_inputs(options.inputs, record.encoder_inputs)
    say.step(f"encoding {len(rows)} input(s) through the encoder's split")
    encoded = encode(folder / record.encoder, rows, record.encoder_output, options.threads)
    decoder = folder / record.decoder
    tokenizer = decoder if (decoder / "tokenizer.json").is_file() else options.tokenizer
    settled = dataclasses.replace(
        options,
        inputs=(),
        prompt_ids=(record.start_ids,) * len(rows),
        tokenizer=tokenizer,
        eos_token_ids=options.eos_token_ids or record.eos_ids,
    )
    builders = {Role.ENCODER_OUTPUT: encoder_output(encoded)}
    config = LocalConfig(mode=options.local_mode)
    with Generator.open(decoder, config, threads=options.threads, builders=builders) as gen:
        prompting = gen.prompting(settled)
        k = len(gen.steps.lanes[0])
        say.step(f"generating {len(rows)} sequence(s) through the decoder's {k} stage(s)")
        runs = {"pipeline": gen.generate_with(prompting)}
    if options.compare:
        say.step("generating with the unsplit files (a plain onnxruntime loop in this thread)")
        plain = plain_greedy(Path(record.source), rows, record, settled.max_new_tokens)
        runs["unsplit"] = Generation.of(plain, (plain.seconds,), prompting.codec)
    return GenerateResult(
        prompts=prompting.options.prompt_ids,
        runs=runs,
        sampling=None,
        stages=k + load_manifest(folder / record.encoder, check_files=False).k,
        workers=k + load_manifest(folder / record.encoder, check_files=False).k,
        texts=runs["pipeline"].texts,
        backend=options.backend.value,
        cluster=None,
    )
