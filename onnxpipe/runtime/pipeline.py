"""Run a split folder as a pipeline: one worker per stage, micro-batches streaming through.

>>> with Pipeline.from_manifest("out/") as pipe:            # doctest: +SKIP
...     outputs = pipe.run({"input_ids": ids})              # one micro-batch
...     for out in pipe.stream(batches):                    # many, results in input order
...         use(out)

:meth:`Pipeline.submit` returns a :class:`concurrent.futures.Future` and may be called from many threads
at once (a server's request handlers): micro-batches enter the pipeline in the order they were
submitted, up to its capacity, and the rest wait in an unbounded queue.  ``submit`` checks and copies
the inputs, so a malformed request fails alone (:class:`~onnxpipe.core.errors.UsageError`) and the caller may
reuse its arrays at once.  A driver thread collects what comes out and sets the futures, so callbacks
added to them run on that thread: they must be quick and must not wait for another result of the same
pipeline.  A future can be cancelled while it is queued, not once a worker has it.

When a stage fails, or the driver meets any unexpected error, every pending future fails with the same
:class:`~onnxpipe.core.errors.RuntimeStageError`, every worker is stopped, and the pipeline refuses further
work.  :meth:`Pipeline.close` (and a normal exit from ``with``) lets what was submitted finish first;
Ctrl-C in :meth:`run` or :meth:`stream` stops the workers at once.  A pipeline dropped without
``close()`` finishes what was submitted and stops its workers once it is garbage-collected.

Process workers are started with ``spawn`` but never import the caller's ``__main__``
(:mod:`onnxpipe.runtime.backends.spawning`): a script needs no ``if __name__ == "__main__":`` guard, and
``python -`` and notebooks work too.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import onnxruntime as ort

from onnxpipe.core.dims import Shape
from onnxpipe.core.errors import RuntimeStageError, UsageError
from onnxpipe.manifest import DecoderIORecord, Manifest, load_manifest
from onnxpipe.runtime.affinity import assign_cpus
from onnxpipe.runtime.backends.processes import ProcessBackend
from onnxpipe.runtime.backends.ray_backend import RayBackend
from onnxpipe.runtime.backends.threads import ThreadBackend
from onnxpipe.runtime.base import Backend, BackendConfig, LocalConfig, RayConfig, Tensors
from onnxpipe.runtime.driver import CLOSE_TIMEOUT_S, CLOSED, Driver, Job
from onnxpipe.runtime.generate import Batching, Generation, OnToken, StepFeeds, batch_size
from onnxpipe.runtime.generate import generate as generate_tokens
from onnxpipe.runtime.kvstate import CONTROL, PadSide
from onnxpipe.runtime.options import GenerateOptions, Sampling
from onnxpipe.runtime.prompting import Prompting, settle
from onnxpipe.runtime.session import WorkerStats
from onnxpipe.runtime.spec import (
    Placement,
    WorkerSpec,
    check_providers_here,
    generation_io,
    generation_specs,
    manifest_placements,
    model_generation_spec,
    padding_side,
    placement_for_device,
    stage_specs,
)
from onnxpipe.runtime.trips import Trip
from onnxpipe.verification.verify import source_model_path


class Pipeline:
    """Workers running the stages of a split folder (or any chain of :class:`WorkerSpec`).

    The model inputs' shapes (from the manifest) let :meth:`submit` refuse an input of the wrong rank or
    fixed dimension before it enters the pipeline, where it would fail a stage and with it every request.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        input_types: Mapping[str, str],
        output_names: Sequence[str],
        lanes: Sequence[Sequence[WorkerSpec]],
        manifest: Manifest | None = None,
        directory: Path | None = None,
        pin_note: str | None = None,
        generation_io: DecoderIORecord | None = None,
    ) -> None:
        self.backend = backend
        self.input_types = dict(input_types)
        self.input_shapes: dict[str, Shape] = (
            {t.name: t.shape for t in manifest.model_inputs} if manifest is not None else {}
        )
        self.output_names = tuple(output_names)
        self.lanes = tuple(tuple(lane) for lane in lanes)
        self.manifest = manifest
        self.directory = directory
        self._pad_side: PadSide | None = None
        self.pin_note = pin_note
        """Why the workers were not pinned although asked to be (too few CPUs), else None."""
        self.generation_io = generation_io
        """Set when the workers generate (:meth:`generate`): each keeps its layers' KV cache."""
        self._next_sequence = 0
        self._driver = Driver(backend, self.output_names)
        self._finalizer = weakref.finalize(self, self._driver.abandon)
        self._finalizer.atexit = False  # at exit the workers go with the process

    # ---------------------------------------------------------------------------------- opening

    @classmethod
    def from_manifest(
        cls,
        directory: str | Path,
        backend: BackendConfig | None = None,
        *,
        threads: int | None = None,
        placements: Sequence[Placement] | None = None,
        check_files: bool = True,
        generation: bool = False,
    ) -> Pipeline:
        """Start one worker per stage of the split folder ``directory``.

        ``backend`` says where: :class:`~onnxpipe.runtime.base.LocalConfig` (the default: threads of
        this process, or processes; pinned to CPUs of their own with ``pin``, :attr:`pin_note` saying why
        not when there are too few) or :class:`~onnxpipe.runtime.base.RayConfig`.  Each stage runs as the
        manifest records (:func:`~onnxpipe.runtime.spec.manifest_placements`): with the provider,
        provider options and threads of its device in the manifest's ``cluster`` (a split made with
        ``--devices``; a device may name another runtime, OpenVINO or tract, and one pipeline may mix
        them: docs/runtimes.md), else with the provider its ``device`` name implies (``cpu0``,
        ``cuda:1``) and the plan's threads; ``threads`` replaces every stage's intra-op threads.
        ``placements`` gives each stage's explicitly instead.  On the local backend a provider (or
        runtime) from the manifest that this machine lacks is a :class:`UsageError`, before any worker
        starts.

        ``generation``: the split of a decoder LLM runs :meth:`generate`: each worker keeps its own
        layers' KV cache between steps (:mod:`onnxpipe.runtime.kvstate`), the caller sends token ids,
        mask and positions and gets logits back.  Such a pipeline does not take :meth:`run` feeds.
        """
        config = backend if backend is not None else LocalConfig()
        d = Path(directory)
        manifest = load_manifest(d, check_files=check_files)
        from_manifest = placements is None
        if placements is None:
            placements = manifest_placements(manifest, threads)
        elif len(placements) != manifest.k:
            raise UsageError(f"{len(placements)} placements given for the {manifest.k} stages of {d}")
        io = generation_io(manifest, d) if generation else None
        specs = (generation_specs if generation else stage_specs)(d, manifest, placements)
        local = isinstance(config, LocalConfig)
        if from_manifest and local:  # Ray actors check the provider on their own node
            check_providers_here(specs, ort.get_available_providers())
        pin_note = None
        shared = (
            [manifest.worker_of(i) for i in range(manifest.k)] if manifest.plan.workers is not None else None
        )
        if isinstance(config, LocalConfig) and config.pin:
            lanes, pin_note = assign_cpus([specs], workers=shared)
            specs = lanes[0]
        types = {t.name: t.dtype for t in manifest.model_inputs}
        outputs = [o.name for o in manifest.model_outputs]
        if io is not None:
            types = generation_input_types(manifest, io)
            outputs = [str(io.logits_output)]
        return cls(
            make_backend([specs], config, workers=shared),
            input_types=types,
            output_names=outputs,
            lanes=[specs],
            manifest=manifest,
            directory=d,
            pin_note=pin_note,
            generation_io=io,
        )

    @classmethod
    def generating_replicas(
        cls,
        directory: str | Path,
        replicas: int = 1,
        backend: BackendConfig | None = None,
        *,
        threads: int | None = None,
        model: str | Path | None = None,
    ) -> Pipeline:
        """``replicas`` workers each running the whole source model of the split ``directory`` and
        keeping its whole KV cache: the unsplit model generating (one replica), or data-parallel
        replicas, to compare a split's :meth:`generate` with, side by side.  ``model``: the source model
        (default: the manifest's ``source.path``)."""
        if replicas < 1:
            raise UsageError(f"replicas {replicas}: give 1 or more")
        config = backend if backend is not None else LocalConfig()
        d = Path(directory)
        manifest = load_manifest(d, check_files=False)
        io = generation_io(manifest, d)
        path = source_model_path(d, manifest, model)
        n = manifest.plan.threads if threads is None else threads
        place = placement_for_device("cpu", n)
        lanes = [[model_generation_spec(path, manifest, place, index=i)] for i in range(replicas)]
        if isinstance(config, LocalConfig) and config.pin:
            lanes, _ = assign_cpus(lanes)
        return cls(
            make_backend(lanes, config),
            input_types=generation_input_types(manifest, io),
            output_names=[str(io.logits_output)],
            lanes=lanes,
            manifest=manifest,
            directory=d,
            generation_io=io,
        )

    # ---------------------------------------------------------------------------------- running

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(self.input_types)

    @property
    def capacity(self) -> int:
        """Micro-batches the workers hold at most; more wait in the pipeline's queue."""
        return self.backend.capacity

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

        The pipeline must have been opened for generation (``from_manifest(..., generation=True)`` or
        :meth:`generating_replicas`).  Sequences run concurrently, one step each in the pipeline at a
        time, so that ``K`` stages are busy with ``K`` sequences (:mod:`onnxpipe.runtime.generate`).
        :meth:`generate_with` takes every option (chat templates, a tokenizer elsewhere).
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
            **GenerateOptions.drawn(sampling),
        )
        return self.generate_with(self.prompting(options), on_token)

    def batching(self, options: GenerateOptions) -> Batching:
        """How this pipeline's steps carry ``options``' sequences: ``options.batch`` at most, by default
        as many as fill one step per stage (one where the model cannot pad sequences of different
        lengths: it takes no positions or no mask)."""
        if self.generation_io is None:
            return Batching()
        if self._pad_side is None:
            self._pad_side = padding_side([spec.path for spec in self.lanes[0]])
        feeds = StepFeeds(self.generation_io, self.input_types)
        size = batch_size(options, len(self.lanes[0]), self.backend.lanes)
        if size > 1 and options.batch is None and not feeds.can_pad(self._pad_side):
            size = 1
        return Batching(size, self._pad_side)

    def prompting(self, options: GenerateOptions) -> Prompting:
        """``options`` settled for this pipeline's model: prompts as ids, its tokenizer, its end ids."""
        if self.directory is None or self.manifest is None:
            raise UsageError("only a pipeline opened from a split folder knows its model's tokenizer")
        return settle(self.directory, self.manifest, options)

    def generate_with(self, prompting: Prompting, on_token: OnToken | None = None) -> Generation:
        """:meth:`generate` for prompts settled by :meth:`prompting`."""
        io = self.generation_io
        if io is None:
            raise UsageError(
                "this pipeline was not opened for generation; open it with "
                "Pipeline.from_manifest(directory, generation=True)"
            )
        options = prompting.options
        feeds = StepFeeds(io, self.input_types)
        batching = self.batching(options)
        first = self._next_sequence
        self._next_sequence += len(options.prompt_ids)
        self.reset_stats()
        result: Generation = self._interruptible(
            lambda: generate_tokens(
                lambda f, lane: self._submit_to(f, lane),
                self.backend.lanes,
                feeds,
                options,
                first_ident=first,
                on_token=on_token,
                batching=batching,
            )
        )
        busy = tuple(sum(r.run_seconds for r in w.records) for w in self.stats())
        shares = tuple(b / result.seconds if result.seconds > 0 else 0.0 for b in busy)
        return prompting.with_texts(dataclasses.replace(result, busy_shares=shares))

    def _submit_to(self, feeds: Mapping[str, np.ndarray], lane: int) -> Job:
        return self._driver.submit(self._check_feeds(feeds), lane)

    def submit(self, feeds: Mapping[str, np.ndarray]) -> Job:
        """Queue one micro-batch (model inputs by name); the future's result is the model outputs.

        The inputs are checked first (names, dtypes, ranks, fixed dimensions): a malformed request raises
        :class:`UsageError` here and the pipeline goes on serving the others.  They are copied, so the
        caller may reuse its arrays as soon as this returns.  See :class:`Job` for cancelling and
        callbacks.
        """
        return self._driver.submit(self._check_feeds(feeds))

    def run(self, feeds: Mapping[str, np.ndarray]) -> Tensors:
        """Model outputs for one micro-batch of model inputs."""
        result: Tensors = self._interruptible(lambda: self.submit(feeds).result())
        return result

    def stream(self, inputs: Iterable[Mapping[str, np.ndarray]]) -> Iterator[Tensors]:
        """Model outputs for each micro-batch of ``inputs``, in input order, while later ones run.

        At most :attr:`capacity` micro-batches are taken from ``inputs`` ahead of the one yielded, so an
        endless stream is fine; each is copied as it is taken, so ``inputs`` may yield one buffer over
        and over.  Stopping the iteration early leaves nothing behind: what was submitted finishes and
        is dropped.
        """
        window = max(1, self.capacity)
        pending: deque[Job] = deque()
        try:
            for feeds in inputs:
                pending.append(self.submit(feeds))
                while len(pending) >= window or (pending and pending[0].done()):
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except KeyboardInterrupt:
            self.close(graceful=False)
            raise

    def run_many(self, inputs: Iterable[Mapping[str, np.ndarray]]) -> list[Tensors]:
        """``list(stream(inputs))``, stopping the workers on Ctrl-C."""
        result: list[Tensors] = self._interruptible(lambda: list(self.stream(inputs)))
        return result

    def _interruptible(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except KeyboardInterrupt:
            self.close(graceful=False)
            raise

    def _check_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Private C-ordered copies of the model inputs in ``feeds``; a :class:`UsageError` if malformed."""
        missing = [n for n in self.input_types if n not in feeds]
        if missing:
            listed = ", ".join(self.input_types)
            raise UsageError(f"model input {missing[0]!r} is not in the feeds; give every input: {listed}")
        extra = [n for n in feeds if n not in self.input_types]
        if extra:
            raise UsageError(
                f"{extra[0]!r} is not a model input; the inputs are {', '.join(self.input_types)}"
            )
        checked: dict[str, np.ndarray] = {}
        for name, expected in self.input_types.items():
            value = np.asarray(feeds[name])
            if expected not in ("", "undefined") and str(value.dtype) != expected:
                raise UsageError(
                    f"model input {name!r} is {value.dtype}, the model takes {expected}; convert it first"
                )
            self._check_shape(name, value.shape)
            # a copy, never a view: the caller may refill its buffer while this waits or runs
            checked[name] = np.array(value, order="C", copy=True)
        return checked

    def _check_shape(self, name: str, shape: tuple[int, ...]) -> None:
        """Refuse a wrong rank or a wrong fixed dimension; symbolic and unknown dimensions take any size."""
        expected = self.input_shapes.get(name)
        if expected is None:
            return
        if len(shape) == len(expected) and all(
            not isinstance(want, int) or want == got for want, got in zip(expected, shape, strict=True)
        ):
            return
        dims = ", ".join("?" if d is None else str(d) for d in expected)
        raise UsageError(f"model input {name!r} has shape {tuple(shape)}; the model takes [{dims}]")

    # ---------------------------------------------------------------------------------- stats

    def stats(self) -> list[WorkerStats]:
        """Each worker's timing records and memory since it started or since :meth:`reset_stats`."""
        self._raise_if_failed()
        return self.backend.stats()

    def reset_stats(self) -> None:
        self._raise_if_failed()
        self.backend.reset_stats()

    def trips(self) -> list[Trip]:
        """Each delivered micro-batch's hops since the stats were reset, where the backend times them
        (Ray, :mod:`onnxpipe.runtime.trips`); empty for local workers."""
        return self.backend.trips()

    def worker_pids(self) -> list[int]:
        """Process ids of the local worker processes (empty for threads and Ray)."""
        return self.backend.worker_pids()

    def idle(self) -> bool:
        """Whether no micro-batch is queued or running."""
        return self._driver.idle()

    def _raise_if_failed(self) -> None:
        if self._driver.error is not None:
            raise RuntimeStageError(f"the pipeline stopped after a failure: {self._driver.error}")
        if not self._driver.accepting:
            raise UsageError(CLOSED)

    @property
    def failure(self) -> RuntimeStageError | None:
        """The error that stopped the pipeline, if one did."""
        return self._driver.error

    # ---------------------------------------------------------------------------------- closing

    def close(self, graceful: bool = True, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Refuse new work, then stop and join every worker.  Safe to call twice.

        ``graceful`` (also a normal exit from ``with``): the micro-batches already submitted, queued
        ones included, finish first, for at most ``timeout`` seconds; those still pending then fail.
        Otherwise (Ctrl-C, an exception in the ``with`` block) every pending future fails at once.
        Called from a future's callback, on the driver thread, it cannot wait: the driver finishes the
        close once the callback returns.
        """
        driver = self._driver
        driver.request_stop(graceful, timeout)
        if threading.current_thread() is driver.thread:
            return
        try:
            driver.thread.join()
        except KeyboardInterrupt:  # Ctrl-C during a graceful close: stop at once
            driver.request_stop(False, 0.0)
            driver.thread.join()
            driver.close_backend()
            raise
        driver.close_backend()
        self._finalizer.detach()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(graceful=exc_type is None)


def make_backend(
    lanes: Sequence[Sequence[WorkerSpec]], config: BackendConfig, *, workers: Sequence[int] | None = None
) -> Backend:
    """Start the workers of ``lanes`` as ``config`` says (``workers``: the worker of each stage of an
    interleaved split, whose stages then share a worker process, take turns as threads, or share a Ray
    actor)."""
    if isinstance(config, RayConfig):
        return RayBackend(lanes, config, workers=workers)
    if config.mode == "processes":
        return ProcessBackend(lanes, slots=config.slots, workers=workers)
    return ThreadBackend(lanes, slots=config.slots, workers=workers)


def generation_input_types(manifest: Manifest, io: DecoderIORecord) -> dict[str, str]:
    """What a generating pipeline takes: the model inputs but the cache, and the control tensor."""
    pasts = set(io.past_to_present())
    types = {t.name: t.dtype for t in manifest.model_inputs if t.name not in pasts}
    types[CONTROL] = "int64"
    return types
