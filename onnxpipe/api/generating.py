"""``generate``: tokens through a decoder's split, each worker keeping its layers' KV cache; optionally the
same prompts through the unsplit model and K replicas of it, side by side; an encoder-decoder's split
(:mod:`onnxpipe.api.seq2seq`) from its encoder's inputs (:func:`generate_folder`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from onnxpipe.api.results import GenerateResult
from onnxpipe.api.running import backend_config
from onnxpipe.core.choices import Backend
from onnxpipe.core.errors import UsageError
from onnxpipe.core.events import SILENT, Listener
from onnxpipe.core.iocontract import IOContract, Role
from onnxpipe.core.options import opt
from onnxpipe.manifest import load_manifest
from onnxpipe.manifest.seq2seq import SEQ2SEQ_FILE, Seq2SeqRecord, read_seq2seq
from onnxpipe.runtime.backends.ray_backend import RayBackend
from onnxpipe.runtime.base import BackendConfig, LocalConfig, RayConfig
from onnxpipe.runtime.generation.generator import Generator, Prompting, split_contract
from onnxpipe.runtime.generation.result import Generation
from onnxpipe.runtime.generation.seq2seq import (
    encode,
    encoder_mask,
    encoder_output,
    plain_greedy,
    read_inputs,
)
from onnxpipe.runtime.options import GenerateOptions
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.report.cluster import GenerationCluster, hop_shares
from onnxpipe.runtime.text import TextStreams


def generate(
    folder: str | Path,
    options: GenerateOptions,
    *,
    listener: Listener | None = None,
    on_text: Callable[[int, str], None] | None = None,
) -> GenerateResult:
    """The new tokens of each prompt of ``options`` (token ids, or text through the model's tokenizer)
    through the split in ``folder``; with ``options.compare`` also through the unsplit model (one worker,
    its whole cache) and as many replicas of it as the split has workers, whose tokens must be the same
    (:attr:`GenerateResult.same`).  ``on_text`` is told the pipeline's text as it is made (sequence
    index, new text), when the prompts were text.

    Everything that can be refused is refused before any worker starts: the options, the tokenizer and
    its chat template, the prompts."""
    say = listener or SILENT
    record = read_seq2seq(Path(folder))
    if record is not None:  # an encoder-decoder: its encoder's inputs, not prompts
        return generate_folder(Path(folder), record, options, say)
    if options.inputs:
        raise UsageError(
            f"{opt('inputs')} are an encoder-decoder split's encoder inputs; {folder} is no such split "
            f"(no {SEQ2SEQ_FILE}): give prompts"
        )
    manifest = load_manifest(Path(folder), check_files=False)
    contract = split_contract(manifest, folder)  # once for the request: the split's, the baselines'
    config = backend_config(options, manifest.k)
    with Generator.open(
        folder, config, threads=options.threads, contract=contract, embedding=options.embedding
    ) as gen:
        prompting = gen.prompting(options)
        _say_prompts(say, prompting)
        k = len(gen.steps.lanes[0])
        plan = gen.manifest.plan if gen.manifest is not None else None
        workers = (plan.workers if plan is not None else None) or k  # interleaved: fewer workers than stages
        count = len(prompting.options.prompt_ids)
        batch = gen.batching(prompting.options).size
        each = f", up to {batch} sequences a step" if batch > 1 else ""
        where = config.mode if isinstance(config, LocalConfig) else "ray"
        say.step(f"generating {count} sequence(s) through {k} stage(s) ({where}{each})")
        streams = (
            None if on_text is None or prompting.codec is None else TextStreams(prompting.codec, on_text)
        )
        runs: dict[str, Generation] = {"pipeline": gen.generate_with(prompting, streams)}
        if streams is not None:
            streams.close()
        cluster = _cluster(gen)
    if options.compare:
        runs.update(_baselines(folder, prompting, workers, say, contract=contract, config=config))
    return GenerateResult(
        prompts=prompting.options.prompt_ids,
        runs=runs,
        sampling=options.sampling,
        stages=k,
        workers=workers,
        backend=options.backend.value,
        cluster=cluster,
    )


def _cluster(gen: Generator) -> GenerationCluster | None:
    """Where the generation ran on a Ray cluster: each stage's node, each hop's share; None elsewhere."""
    pipe = gen.steps
    if not isinstance(pipe, Pipeline) or not isinstance(pipe.backend, RayBackend):
        return None
    backend = pipe.backend
    stages = [spec.index for spec in pipe.lanes[0]]
    hops, shares = hop_shares(backend.trips(), stages)
    return GenerationCluster(
        stages=tuple(stages),
        nodes=tuple(backend.placed),
        hops=hops,
        stage_shares=shares,
        recoveries=tuple(backend.recoveries),
    )


def _say_prompts(say: Listener, prompting: Prompting) -> None:
    """The lines before the work: each prompt's token count, and where generation stops."""
    settled = prompting.options
    sizes = ", ".join(str(len(p)) for p in settled.prompt_ids)
    say.line(f"prompts: {len(settled.prompt_ids)}, of {sizes} token(s)")
    eos = settled.eos_token_ids or ()
    if eos:
        source = f" (from {prompting.eos_from})" if prompting.eos_from else ""
        ids = ", ".join(map(str, eos))
        say.line(f"stops at end id(s) {ids}{source}, else after {settled.max_new_tokens} new tokens")
    else:
        say.line(f"stops after {settled.max_new_tokens} new tokens (no end id: none given or found)")


def _baselines(
    folder: str | Path,
    prompting: Prompting,
    workers: int,
    say: Listener,
    *,
    contract: IOContract,
    config: BackendConfig,
) -> dict[str, Generation]:
    """The unsplit model (a plain loop, every sequence in one step) and ``workers`` replicas of it (the
    sequences dealt over them, each replica's in one step), given the same prompts; ``contract``: the
    split's IO contract, ``config``: the backend the split generated on."""
    options = prompting.options
    if isinstance(config, RayConfig):  # the replicas go where Ray puts them, the split's pins aside
        config = dataclasses.replace(config, resources=None)
    say.step("generating with the unsplit model (a plain onnxruntime loop in this thread)")
    plain = Generator.plain(
        folder, threads=options.threads, model=options.model, contract=contract, embedding=options.embedding
    )
    runs = {"unsplit": plain.generate_with(prompting)}
    if workers > 1:
        say.step(f"generating with {workers} replicas of the unsplit model")
        many = Generator.replicas(
            folder,
            workers,
            config,
            threads=options.threads,
            model=options.model,
            contract=contract,
            embedding=options.embedding,
        )
        with many:
            runs["replicas"] = many.generate_with(prompting)
    return runs


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
    encoded, encoding = encode(folder / record.encoder, rows, record.encoder_output, options.threads)
    decoder = folder / record.decoder
    own = decoder if (decoder / "tokenizer.json").is_file() else None
    eos = options.eos_token_ids if options.eos_token_ids is not None or options.ignore_eos else record.eos_ids
    settled = dataclasses.replace(
        options,
        inputs=(),
        prompt_ids=(record.start_ids,) * len(rows),
        tokenizer=options.tokenizer or own,
        eos_token_ids=eos,
    )
    builders = {Role.ENCODER_OUTPUT: encoder_output(encoded), Role.ENCODER_MASK: encoder_mask(rows, encoded)}
    config = LocalConfig(mode=options.local_mode)
    with Generator.open(decoder, config, threads=options.threads, builders=builders) as gen:
        prompting = gen.prompting(settled)
        k = len(gen.steps.lanes[0])
        say.step(f"generating {len(rows)} sequence(s) through the decoder's {k} stage(s)")
        runs = {"pipeline": gen.generate_with(prompting, lead=encoding)}
    if options.compare:
        say.step("generating with the unsplit files (a plain onnxruntime loop in this thread)")
        plain = plain_greedy(Path(record.source), rows, record, settled.max_new_tokens, eos or ())
        runs["unsplit"] = Generation.of(plain, (plain.seconds,), prompting.codec)
    stages = k + load_manifest(folder / record.encoder, check_files=False).k
    return GenerateResult(
        prompts=prompting.options.prompt_ids,
        runs=runs,
        sampling=None,
        stages=stages,
        workers=stages,
        backend=options.backend.value,
        cluster=None,
    )
