"""Generation as a layer over the pipeline: a :class:`Generator` drives a split's workers step by step.

A :class:`~onnxpipe.runtime.pipeline.Pipeline` runs stages; it knows nothing of tokens.  A generator
reads the split's IO contract (:mod:`.contract`: which model inputs are the token ids, the mask, the
positions, a layer's cache; which output is the logits), opens a pipeline whose workers keep their
layers' caches (:func:`~onnxpipe.runtime.spec.generation_specs`), and drives it: each step's feeds built
role by role (:mod:`.feeds`), the steps scheduled and batched (:mod:`.scheduler`), the result made in
one place (:meth:`~.result.Generation.of`).  The same generator drives replicas of the unsplit model
(:meth:`Generator.replicas`) and the plain loop in the caller's thread (:meth:`Generator.plain`).

>>> with Generator.open("stages/") as gen:                        # doctest: +SKIP
...     made = gen.generate([[3, 17, 42], [101, 2]], max_new_tokens=32)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from onnxpipe.core.errors import UsageError
from onnxpipe.core.iocontract import IOContract, Role
from onnxpipe.core.progress import ClosesOnExit
from onnxpipe.manifest import Manifest, load_manifest
from onnxpipe.runtime.base import BackendConfig
from onnxpipe.runtime.generation.contract import generation_input_types, split_contract
from onnxpipe.runtime.generation.embedding import split_embedding
from onnxpipe.runtime.generation.feeds import Step, StepFeeds
from onnxpipe.runtime.generation.result import Generation
from onnxpipe.runtime.generation.scheduler import Batching, OnToken, batch_size, schedule
from onnxpipe.runtime.kvstate import PadSide
from onnxpipe.runtime.options import GenerateOptions, Sampling
from onnxpipe.runtime.pipeline import Pipeline, shared_workers, stage_placements
from onnxpipe.runtime.plainloop import PlainLoop
from onnxpipe.runtime.prompting import Prompting, settle
from onnxpipe.runtime.spec import (
    Placement,
    WorkerSpec,
    generation_specs,
    model_generation_spec,
    padding_side,
    placement_for_device,
)
from onnxpipe.verification.verify import runnable_source

Builder = Callable[[Step], np.ndarray]
"""A step's feed of one role (:data:`~.feeds.BUILDERS`)."""


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
        already (:func:`~.contract.split_contract`); ``embedding``: the embedding model of a split that
        takes ``inputs_embeds`` (default: the one its ``genai_config.json`` names; :mod:`.embedding`);
        ``builders``: the feeds of roles only the caller can make (:class:`~.feeds.StepFeeds`)."""
        d, manifest, feeds = _split(directory, check_files, contract, embedding, builders)
        placed = stage_placements(manifest, threads, placements, d)
        pipe = Pipeline.start(
            [generation_specs(d, manifest, placed, feeds.contract)],
            backend,
            manifest=manifest,
            directory=d,
            input_types=feeds.input_types,
            output_names=[str(feeds.contract.logits)],
            workers=shared_workers(manifest),
            check_here=placements is None,
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
        this thread (:class:`~onnxpipe.runtime.plainloop.PlainLoop`): the baseline a split's generation
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
        (:mod:`onnxpipe.runtime.sampling`); ``on_token`` is told each token as it comes.

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
    return d, manifest, StepFeeds(contract, generation_input_types(manifest, contract), embed, builders)


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
