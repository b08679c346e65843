"""Generation as a layer over the pipeline: a :class:`Generator` drives a split's workers step by step.

A :class:`~onnxpipe.runtime.pipeline.Pipeline` runs stages; it knows nothing of tokens.  A generator
reads the split's IO contract (:func:`split_contract`: which model inputs are the token ids, the mask, the
positions, a layer's cache; which output is the logits; read from the manifest's ``plan.decoder.io``, or,
for a manifest written before the planner recorded it, made from the source model by the planner's own
logic), opens a pipeline whose workers keep their layers' caches
(:func:`~onnxpipe.runtime.spec.generation_specs`), and drives it: each step's feeds built role by role
(:mod:`.feeds`), the steps scheduled and batched (:mod:`.scheduler`), the result made in one place
(:meth:`~.result.Generation.of`).  The same generator drives replicas of the unsplit model
(:meth:`Generator.replicas`) and the plain loop in the caller's thread (:meth:`Generator.plain`).

What a generation starts from (:func:`settle`, for both doors to generation, :func:`onnxpipe.generate`
and :meth:`Generator.generate`, once, before any worker starts): the prompts as token ids, the ids that
end a sequence, and the tokenizer that turns text into ids and back, found beside the split or its
source model.

>>> with Generator.open("stages/") as gen:                        # doctest: +SKIP
...     made = gen.generate([[3, 17, 42], [101, 2]], max_new_tokens=32)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from onnxpipe.core.errors import UsageError
from onnxpipe.core.iocontract import IOContract, Role
from onnxpipe.core.options import opt
from onnxpipe.core.progress import ClosesOnExit
from onnxpipe.core.tokenizer_files import has_tokenizer, model_folders
from onnxpipe.ir.decoder import find_decoder, io_contract
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import DecoderLimits, Manifest, decoder_limits, load_manifest
from onnxpipe.runtime.base import BackendConfig, Tensors
from onnxpipe.runtime.generation.feeds import Builder, StepFeeds, split_embedding
from onnxpipe.runtime.generation.result import Generation
from onnxpipe.runtime.generation.scheduler import Batching, OnToken, batch_size, schedule
from onnxpipe.runtime.kvstate import PadSide
from onnxpipe.runtime.options import GenerateOptions, Sampling
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.session import StageRunner, WorkerStats
from onnxpipe.runtime.spec import (
    Placement,
    WorkerSpec,
    generation_inputs,
    model_generation_spec,
    padding_side,
    placement_for_device,
)
from onnxpipe.runtime.text import TextCodec
from onnxpipe.verification.verify import runnable_source, source_model_path


class Generator(ClosesOnExit):
    """Generates through ``steps`` (a pipeline of a split, replicas, the plain loop: lanes of workers
    that each keep their layers' caches, taking a step's feeds in a lane), each step's feeds made by
    ``feeds`` from the split's IO contract.  ``manifest`` and ``directory`` (the split's) find the
    tokenizer and the end ids."""

    def __init__(
        self,
        steps: Pipeline | PlainLoop,
        feeds: StepFeeds,
        *,
        manifest: Manifest | None = None,
        directory: Path | None = None,
    ) -> None:
        self.steps = steps
        self.feeds = feeds
        self.manifest = manifest
        self.directory = directory
        self._side: PadSide | None = None  # where a step's caches are padded: read off the model files
        self._next_sequence = 0

    # ---------------------------------------------------------------------------------- opening

    @classmethod
    def open(
        cls,
        directory: str | Path,
        backend: BackendConfig | None = None,
        *,
        threads: int | None = None,
        placements: Sequence[Placement] | None = None,
        check_files: bool = True,
        contract: IOContract | None = None,
        embedding: Path | None = None,
        builders: Mapping[Role, Builder] | None = None,
    ) -> Generator:
        """Start one worker per stage of the decoder's split ``directory`` (``backend``, ``threads``,
        ``placements`` as for :meth:`Pipeline.from_manifest
        <onnxpipe.runtime.pipeline.Pipeline.from_manifest>`), each keeping its own layers' KV cache
        between steps (:mod:`onnxpipe.runtime.kvstate`).  A split that cannot generate is refused,
        saying why, before any worker starts.  ``contract``: the split's, where the caller read it
        already (:func:`split_contract`); ``embedding``: the embedding model of a split that takes
        ``inputs_embeds`` (default: the one its ``genai_config.json`` names; :class:`~.feeds.Embedding`);
        ``builders``: the feeds of roles only the caller can make (:class:`~.feeds.StepFeeds`)."""
        d, manifest, feeds = _split(directory, check_files, contract, embedding, builders)
        pipe = Pipeline.from_manifest(
            d, backend, threads=threads, placements=placements, manifest=manifest, contract=feeds.contract
        )
        return cls(pipe, feeds, manifest=manifest, directory=d)

    @classmethod
    def replicas(
        cls,
        directory: str | Path,
        replicas: int = 1,
        backend: BackendConfig | None = None,
        *,
        threads: int | None = None,
        model: str | Path | None = None,
        contract: IOContract | None = None,
        embedding: Path | None = None,
    ) -> Generator:
        """``replicas`` workers each running the whole source model of the split ``directory`` and
        keeping its whole KV cache: the unsplit model generating (one replica), or data-parallel
        replicas, to compare a split's generation with, side by side.  ``model``: the source model
        (default: the manifest's ``source.path``); ``contract``, ``embedding`` as for :meth:`open`."""
        if replicas < 1:
            raise UsageError(f"replicas {replicas}: give 1 or more")
        d, manifest, feeds, spec = _whole_model(directory, threads, model, contract, embedding)
        lanes = [[spec(i)] for i in range(replicas)]
        pipe = Pipeline.start(
            lanes,
            backend,
            manifest=manifest,
            directory=d,
            input_types=feeds.input_types,
            output_names=[str(feeds.contract.logits)],
        )
        return cls(pipe, feeds, manifest=manifest, directory=d)

    @classmethod
    def plain(
        cls,
        directory: str | Path,
        *,
        threads: int | None = None,
        model: str | Path | None = None,
        contract: IOContract | None = None,
        embedding: Path | None = None,
    ) -> Generator:
        """The whole source model of the split ``directory`` generating as a plain onnxruntime loop in
        this thread (:class:`PlainLoop`): the baseline a split's generation
        is honest against; ``contract``, ``embedding`` as for :meth:`open`."""
        d, manifest, feeds, spec = _whole_model(directory, threads, model, contract, embedding)
        return cls(PlainLoop(spec(0)), feeds, manifest=manifest, directory=d)

    # ---------------------------------------------------------------------------------- generating

    def generate(
        self,
        prompts: Sequence[Sequence[int] | str],
        max_new_tokens: int = 32,
        *,
        eos_token_ids: Sequence[int] | None = None,
        in_flight: int | None = None,
        sampling: Sampling | None = None,
        on_token: OnToken | None = None,
        batch: int | None = None,
    ) -> Generation:
        """New tokens for each prompt (token ids, or text: encoded by the model's tokenizer, and its new
        tokens decoded into :attr:`Generation.texts`), at most ``max_new_tokens`` each, fewer when an end
        id comes (``eos_token_ids``, default the model's; ``()`` for none); ``in_flight``: sequences in
        the pipeline at once (default: all), ``batch`` at most in one step (default: enough for a step per
        stage; 1: a step per sequence); each token the highest logit, or drawn as ``sampling`` says
        (:func:`~onnxpipe.runtime.generation.scheduler.draw`); ``on_token`` is told each token as it comes.

        Sequences run concurrently, one step each in the pipeline at a time, so that ``K`` stages are
        busy with ``K`` sequences (:mod:`.scheduler`).  :meth:`generate_with` takes every option (chat
        templates, a tokenizer elsewhere).
        """
        texts = [p for p in prompts if isinstance(p, str)]
        if texts and len(texts) != len(prompts):
            raise UsageError("give every prompt as text, or every prompt as token ids")
        options = GenerateOptions(
            prompt_ids=tuple(tuple(p) for p in prompts if not isinstance(p, str)),
            prompts=tuple(texts),
            max_new_tokens=max_new_tokens,
            eos_token_ids=None if eos_token_ids is None else tuple(eos_token_ids),
            in_flight=in_flight,
            batch=batch,
            **({} if sampling is None else {"do_sample": True, **asdict(sampling)}),  # the knobs of sampling
        )
        return self.generate_with(self.prompting(options), on_token)

    def prompting(self, options: GenerateOptions) -> Prompting:
        """``options`` settled for this split's model: prompts as ids, its tokenizer, its end ids."""
        if self.directory is None or self.manifest is None:
            raise UsageError("only a generator opened from a split folder knows its model's tokenizer")
        return settle(self.directory, self.manifest, options)

    def batching(self, options: GenerateOptions) -> Batching:
        """How the steps carry ``options``' sequences: ``options.batch`` at most, by default as many as
        fill one step per stage (one where the model cannot pad sequences of different lengths: it takes
        no positions or no mask)."""
        if self._side is None:
            self._side = padding_side([spec.path for spec in self.steps.lanes[0]])
        size = batch_size(options, len(self.steps.lanes[0]), len(self.steps.lanes))
        if size > 1 and options.batch is None and not self.feeds.can_pad(self._side):
            size = 1
        return Batching(size, self._side)

    def generate_with(
        self, prompting: Prompting, on_token: OnToken | None = None, *, lead: float = 0.0
    ) -> Generation:
        """:meth:`generate` for prompts settled by :meth:`prompting`; ``lead``: as for
        :meth:`Generation.of <.result.Generation.of>`."""
        options = prompting.options
        batching = self.batching(options)
        first = self._next_sequence
        self._next_sequence += len(options.prompt_ids)
        self.steps.reset_stats()
        try:
            run = schedule(
                self.steps.submit,
                len(self.steps.lanes),
                self.feeds,
                options,
                first_ident=first,
                on_token=on_token,
                batching=batching,
            )
        except KeyboardInterrupt:
            self.steps.close(graceful=False)
            raise
        busy = tuple(sum(r.run_seconds for r in w.records) for w in self.steps.stats())
        return Generation.of(run, busy, prompting.codec, lead=lead)

    # ---------------------------------------------------------------------------------- closing

    def close(self, graceful: bool = True) -> None:
        """Stop the workers (:meth:`Pipeline.close <onnxpipe.runtime.pipeline.Pipeline.close>`)."""
        self.steps.close(graceful)


def _split(
    directory: str | Path,
    check_files: bool,
    contract: IOContract | None,
    embedding: Path | None,
    builders: Mapping[Role, Builder] | None = None,
) -> tuple[Path, Manifest, StepFeeds]:
    """The split ``directory``, its manifest, and the step feeds of its contract (``contract``, else the
    manifest's), its embeddings made by its embedding model where it takes them."""
    d = Path(directory)
    manifest = load_manifest(d, check_files=check_files)
    contract = contract or split_contract(manifest, d)
    embed = split_embedding(d, manifest, contract, embedding)
    return d, manifest, StepFeeds(contract, generation_inputs(manifest, contract), embed, builders)


def _whole_model(
    directory: str | Path,
    threads: int | None,
    model: str | Path | None,
    contract: IOContract | None,
    embedding: Path | None,
) -> tuple[Path, Manifest, StepFeeds, Callable[[int], WorkerSpec]]:
    """The split ``directory``, its manifest, the feeds of its contract and the spec of a worker running
    the whole source model (``model``, default the manifest's) with its whole cache, by replica index."""
    d, manifest, feeds = _split(directory, False, contract, embedding)
    path = runnable_source(d, manifest, model)
    place = placement_for_device("cpu", manifest.plan.threads if threads is None else threads)

    def spec(index: int) -> WorkerSpec:
        return model_generation_spec(path, manifest, place, feeds.contract, index=index)

    return d, manifest, feeds, spec


# --------------------------------------------------------------------------------------------------
# the IO contract


def split_contract(manifest: Manifest, folder: str | Path) -> IOContract:
    """The IO contract of the split in ``folder``, or a :class:`UsageError` naming the folder and saying
    why it cannot generate."""
    where = Path(folder)
    file = manifest.source.file
    dec = manifest.plan.decoder
    if dec is None:
        raise UsageError(
            f"{where}: {file} was not split as a decoder LLM with a KV cache (the manifest has no "
            "plan.decoder); only such a split can generate"
        )
    if not dec.layer_cuts:
        raise UsageError(
            f"{where}: {file} was split with {opt('layer_cuts', False)}: a layer's cache may lie in two "
            "stages, so no worker can keep it; split it again with layer cuts"
        )
    contract = dec.io if dec.io is not None else _from_source(manifest, where)
    if contract.logits is None:
        raise UsageError(f"{where}: {file}: no logits output was found among the model outputs")
    return contract


def _from_source(manifest: Manifest, folder: Path) -> IOContract:
    """The contract of a manifest written before ``plan.decoder.io``: the planner's, from the source model
    the manifest records (:func:`onnxpipe.ir.decoder.io_contract`)."""
    try:
        path = source_model_path(folder, manifest, None)
    except UsageError as e:
        raise UsageError(
            f"{e}: the manifest predates plan.decoder.io (what a generation loop feeds), which is made "
            "from the source model; re-run onnxpipe split"
        ) from None
    view = load_model(path, check=False)
    dec = find_decoder(view)
    if dec is None:
        raise UsageError(
            f"{path}: the source model recorded in {folder} is no decoder with a KV cache any more; "
            "re-run onnxpipe split"
        )
    return io_contract(view, dec)


# --------------------------------------------------------------------------------------------------
# prompts, tokenizer and end ids


@dataclass(frozen=True)
class Prompting:
    """The settled start of a generation: ``options`` with token ids for every prompt and the end ids to
    stop at, the tokenizer when text came in (its new tokens then go out as text too), and where the end
    ids were read (for the reader of the output)."""

    options: GenerateOptions
    codec: TextCodec | None
    eos_from: str | None


def settle(folder: Path, manifest: Manifest, options: GenerateOptions) -> Prompting:
    """``options`` with the prompts as ids and the model's end ids where none were given, checked
    against the model's vocabulary and context (:func:`~onnxpipe.manifest.decoder_limits`) before any
    worker runs: an id beyond the vocabulary or a sequence past the context would otherwise fail deep
    in a run, after the work."""
    limits = decoder_limits(folder, manifest)
    codec = None
    if options.prompts or options.tokenizer is not None:
        codec = TextCodec.load(_tokenizer_folder(folder, manifest, options.tokenizer))
    ids = options.prompt_ids
    if options.prompts:
        assert codec is not None
        ids = tuple(codec.encode(p, chat=options.chat, system=options.system) for p in options.prompts)
    _check_fits(ids, options, limits, codec)
    eos, source = _eos(folder, manifest, options, limits, codec)
    settled = dataclasses.replace(
        options, prompt_ids=ids, prompts=(), chat=False, system=None, eos_token_ids=eos, ignore_eos=False
    )
    return Prompting(settled, codec, source)


def _check_fits(
    ids: tuple[tuple[int, ...], ...], options: GenerateOptions, limits: DecoderLimits, codec: TextCodec | None
) -> None:
    """Refuse a prompt of no token (text the tokenizer made nothing of: options refuse an empty
    ``prompt_ids``), an id beyond the vocabulary, a sequence past the context."""
    vocab = limits.vocab_size
    for i, prompt in enumerate(ids):
        if not prompt and codec is not None and options.prompts:
            raise UsageError(
                f"prompt {i} ({options.prompts[i]!r}): the tokenizer in {codec.folder} made no token of this "
                f"text; give text it has tokens for, or the prompt as token ids ({opt('prompt_ids')})"
            )
        beyond = [t for t in prompt if vocab is not None and t >= vocab]
        if beyond and codec is not None:
            raise UsageError(
                f"{codec.folder}: its tokenizer makes id {beyond[0]}, beyond the model's vocabulary of "
                f"{vocab}: "
                f"it is not this model's tokenizer; give the model's own as {opt('tokenizer')}"
            )
        if beyond:
            raise UsageError(
                f"{opt('prompt_ids')}: prompt {i} holds id {beyond[0]}, beyond the model's vocabulary of "
                f"{vocab} (ids 0 to {vocab - 1 if vocab else 0}); give ids the model knows"
            )
        need = len(prompt) + options.max_new_tokens
        if need > limits.context:
            room = limits.context - len(prompt)
            fix = (
                f"give {opt('max_new_tokens')} {room} or less"
                if room > 0
                else "give a shorter prompt, or split the model again with a larger max_context"
            )
            raise UsageError(
                f"prompt {i}: its {len(prompt)} token(s) and {opt('max_new_tokens', options.max_new_tokens)} "
                f"need {need} positions, beyond the context of {limits.context} the split was made for; {fix}"
            )


def _tokenizer_folder(folder: Path, manifest: Manifest, given: Path | None) -> Path:
    """The folder given, else the split's when it holds a tokenizer (a split copies its model's), else the
    source model's, else the one above it (the ``onnx/`` layout of Hugging Face repositories)."""
    if given is not None:
        return given
    # the model that was split, where its folder still exists (its tokenizer may lie there or one up)
    source = None if manifest.source.path is None else (folder / manifest.source.path).resolve()
    searched = [folder, *(model_folders(source) if source is not None and source.parent.is_dir() else ())]
    for where in searched:
        if has_tokenizer(where):
            return where
    places = ", ".join(str(p) for p in searched[:-1])
    places = f"{places} or {searched[-1]}" if places else str(searched[-1])
    raise UsageError(
        f"no tokenizer (tokenizer.json, tokenizer.model, or vocab.json with merges.txt) in {places}; "
        f"give the folder of the model's tokenizer files as {opt('tokenizer')}, or token ids as "
        f"{opt('prompt_ids')}"
    )


def _eos(
    folder: Path,
    manifest: Manifest,
    options: GenerateOptions,
    limits: DecoderLimits,
    codec: TextCodec | None,
) -> tuple[tuple[int, ...], str | None]:
    """The ids to stop at and where they were read: those given, none with ``ignore_eos``, else the
    model's own as the split recorded them (its config's), else its tokenizer's end token.  No id is
    guessed: a model whose files name none stops only at ``max_new_tokens``."""
    if options.ignore_eos:
        return (), None
    if options.eos_token_ids is not None:
        return options.eos_token_ids, None
    record = manifest.plan.decoder.model if manifest.plan.decoder is not None else None
    if limits.eos_ids:
        config = record.config if record is not None and record.config else "the model's config"
        return limits.eos_ids, f"{config}, as the split recorded it"
    if codec is not None and codec.eos_ids:
        return codec.eos_ids, f"{codec.folder / 'tokenizer_config.json'}"
    return (), None


# --------------------------------------------------------------------------------------------------
# the plain loop
#
# The unsplit model generating as a plain onnxruntime loop: the baseline a split's generation is honest
# against.  A split is worth its cost only if it beats what a user would write without it: one session of
# the whole model, in the caller's thread, the presents fed back as the next pasts.  Measured through the
# pipeline's own machinery (a worker thread, queues, copies at every hop), the unsplit model looks slower
# than it is, and the pipeline's gain larger.  So this loop runs the model where the caller is, with
# nothing between the step and the session: each step goes straight to the model's runner (the same cache
# bookkeeping and batching as a pipeline worker's, :class:`~onnxpipe.runtime.session.StageRunner`), with
# the same threads, and its future is done when ``submit`` returns.
#
# ``InferenceSession.run`` with numpy arrays, not I/O binding: on the CPU provider, binding the cache as
# ``OrtValue`` s fed back step to step was measured side by side and made no step faster (the arrays
# onnxruntime returns are already its own buffers), so it would only add code.  A GPU provider, where
# binding keeps the cache on the device, would change that.


class PlainLoop:
    """The whole source model (``spec``: :func:`~onnxpipe.runtime.spec.model_generation_spec`) stepping in
    this thread, for a :class:`~onnxpipe.runtime.generation.generator.Generator` to drive as it drives a
    pipeline: one lane of one worker, whose steps are done when they are submitted."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.lanes = ((spec,),)
        self.runner = StageRunner(spec)
        self._steps = 0

    def submit(self, feeds: Mapping[str, np.ndarray], lane: int | None = None) -> Future[Tensors]:
        """Run one step now; the future is done when this returns."""
        fut: Future[Tensors] = Future()
        try:
            fut.set_result(self.runner.run(self._steps, feeds))
        except Exception as e:  # noqa: BLE001 - the step's failure is the future's, as a worker's would be
            fut.set_exception(e)
        self._steps += 1
        return fut

    def stats(self) -> list[WorkerStats]:
        """No worker's: the loop's time is the caller's (a :class:`Generation` of it has no busy shares)."""
        return []

    def reset_stats(self) -> None:
        """Nothing is recorded (:meth:`stats`)."""

    def close(self, graceful: bool = True) -> None:
        """Nothing runs between steps: nothing to stop."""
