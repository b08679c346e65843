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
(:mod:`onnxpipe.runtime.backends.processes`): a script needs no ``if __name__ == "__main__":`` guard, and
``python -`` and notebooks work too.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from onnxpipe.core.dims import Shape
from onnxpipe.core.errors import RuntimeStageError, UsageError
from onnxpipe.core.progress import ClosesOnExit
from onnxpipe.manifest import Manifest, load_manifest
from onnxpipe.runtime.affinity import assign_cpus
from onnxpipe.runtime.backends.lanes import Lanes
from onnxpipe.runtime.backends.processes import ProcessBackend
from onnxpipe.runtime.backends.ray_backend import RayBackend
from onnxpipe.runtime.backends.threads import ThreadBackend
from onnxpipe.runtime.base import BackendConfig, LocalConfig, RayConfig, Tensors
from onnxpipe.runtime.driver import CLOSE_TIMEOUT_S, Driver, Job
from onnxpipe.runtime.session import WorkerStats
from onnxpipe.runtime.spec import (
    Placement,
    WorkerSpec,
    check_providers_here,
    manifest_placements,
    stage_specs,
)
from onnxpipe.runtime.trips import Trip


class Pipeline(ClosesOnExit):
    """Workers running the stages of a split folder (or any chain of :class:`WorkerSpec`).

    The model inputs' shapes (from the manifest) let :meth:`submit` refuse an input of the wrong rank or
    fixed dimension before it enters the pipeline, where it would fail a stage and with it every request.
    """

    def __init__(
        self,
        backend: Lanes,
        *,
        input_types: Mapping[str, str],
        output_names: Sequence[str],
        lanes: Sequence[Sequence[WorkerSpec]],
        manifest: Manifest | None = None,
        directory: Path | None = None,
        pin_note: str | None = None,
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
        self.pin_note = pin_note
        """Why the workers were not pinned although asked to be (too few CPUs), else None."""
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
        starts.  A decoder's split generates through a
        :class:`~onnxpipe.runtime.generation.generator.Generator` instead.
        """
        d = Path(directory)
        manifest = load_manifest(d, check_files=check_files)
        return cls.start(
            [stage_specs(d, manifest, stage_placements(manifest, threads, placements, d))],
            backend,
            manifest=manifest,
            directory=d,
            input_types={t.name: t.dtype for t in manifest.model_inputs},
            output_names=[o.name for o in manifest.model_outputs],
            workers=shared_workers(manifest),
            check_here=placements is None,
        )

    @classmethod
    def start(
        cls,
        lanes: Sequence[Sequence[WorkerSpec]],
        backend: BackendConfig | None = None,
        *,
        input_types: Mapping[str, str],
        output_names: Sequence[str],
        manifest: Manifest | None = None,
        directory: Path | None = None,
        workers: Sequence[int] | None = None,
        check_here: bool = False,
    ) -> Pipeline:
        """Start the workers of ``lanes`` (the chains of one split: one lane, or replicas) as ``backend``
        says; ``input_types``: the inputs the first worker takes (name: dtype), ``output_names`` the
        outputs the last sends back; ``manifest`` and ``directory``: the split's, if any; ``workers``:
        the worker of each stage of an interleaved split (:func:`shared_workers`); ``check_here``: refuse
        a provider this machine lacks before any worker starts (the local backend; Ray actors check on
        their own node)."""
        config = backend if backend is not None else LocalConfig()
        if check_here and isinstance(config, LocalConfig):
            check_providers_here([s for lane in lanes for s in lane], ort.get_available_providers())
        pin_note = None
        if isinstance(config, LocalConfig) and config.pin:
            lanes, pin_note = assign_cpus(lanes, workers=workers)
        return cls(
            make_backend(lanes, config, workers=workers),
            input_types=input_types,
            output_names=output_names,
            lanes=lanes,
            manifest=manifest,
            directory=directory,
            pin_note=pin_note,
        )

    # ---------------------------------------------------------------------------------- running

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(self.input_types)

    @property
    def capacity(self) -> int:
        """Micro-batches the workers hold at most; more wait in the pipeline's queue."""
        return self.backend.capacity

    def submit(self, feeds: Mapping[str, np.ndarray], lane: int | None = None) -> Job:
        """Queue one micro-batch (model inputs by name); the future's result is the model outputs.
        ``lane``: the lane it must run in (a generation step, whose sequences' caches live there); by
        default the next free one.

        The inputs are checked first (names, dtypes, ranks, fixed dimensions): a malformed request raises
        :class:`UsageError` here and the pipeline goes on serving the others.  They are copied, so the
        caller may reuse its arrays as soon as this returns.  See :class:`Job` for cancelling and
        callbacks.
        """
        return self._driver.submit(self._check_feeds(feeds), lane)

    def run(self, feeds: Mapping[str, np.ndarray]) -> Tensors:
        """Model outputs for one micro-batch of model inputs."""
        return self.run_many([feeds])[0]

    def stream(self, inputs: Iterable[Mapping[str, np.ndarray]]) -> Iterator[Tensors]:
        """Model outputs for each micro-batch of ``inputs``, in input order, while later ones run.

        At most :attr:`capacity` micro-batches are taken from ``inputs`` ahead of the one yielded, so an
        endless stream is fine; each is copied as it is taken, so ``inputs`` may yield one buffer over
        and over.  Stopping the iteration early leaves nothing behind: what was submitted finishes and
        is dropped.
        """
        try:
            for job in self.jobs(inputs):
                yield job.result()
        except KeyboardInterrupt:
            self.close(graceful=False)
            raise

    def jobs(self, inputs: Iterable[Mapping[str, np.ndarray]]) -> Iterator[Job]:
        """The job of each micro-batch of ``inputs``, in input order, once it is done or :attr:`capacity`
        are in flight (its result then comes next): :meth:`stream`'s window, for a caller that wants
        the jobs' times too."""
        window = max(1, self.capacity)
        pending: deque[Job] = deque()
        for feeds in inputs:
            pending.append(self.submit(feeds))
            while len(pending) >= window or (pending and pending[0].done()):
                yield pending.popleft()
        while pending:
            yield pending.popleft()

    def run_many(self, inputs: Iterable[Mapping[str, np.ndarray]]) -> list[Tensors]:
        """``list(stream(inputs))``, stopping the workers on Ctrl-C."""
        return list(self.stream(inputs))

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
        self._driver.check_open()
        return self.backend.stats()

    def reset_stats(self) -> None:
        self._driver.check_open()
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


def make_backend(
    lanes: Sequence[Sequence[WorkerSpec]], config: BackendConfig, *, workers: Sequence[int] | None = None
) -> Lanes:
    """Start the workers of ``lanes`` as ``config`` says (``workers``: the worker of each stage of an
    interleaved split, whose stages then share a worker process, take turns as threads, or share a Ray
    actor)."""
    if isinstance(config, RayConfig):
        return RayBackend(lanes, config, workers=workers)
    if config.mode == "processes":
        return ProcessBackend(lanes, slots=config.slots, workers=workers)
    return ThreadBackend(lanes, slots=config.slots, workers=workers)


def stage_placements(
    manifest: Manifest, threads: int | None, placements: Sequence[Placement] | None, where: Path
) -> Sequence[Placement]:
    """Each stage's placement: ``placements`` when given (one per stage of the split in ``where``), else
    the manifest's (:func:`~onnxpipe.runtime.spec.manifest_placements`, ``threads`` replacing each
    stage's intra-op threads)."""
    if placements is None:
        return manifest_placements(manifest, threads)
    if len(placements) != manifest.k:
        raise UsageError(f"{len(placements)} placements given for the {manifest.k} stages of {where}")
    return placements


def shared_workers(manifest: Manifest) -> list[int] | None:
    """The worker of each stage of an interleaved split (``--workers``), whose stages share a worker;
    None where each stage has its own."""
    return [manifest.worker_of(i) for i in range(manifest.k)] if manifest.plan.workers is not None else None
