"""How a split folder is run (:class:`RunOptions`) and generates (:class:`GenerateOptions`), apart from
the runtime's modules (which load numpy and onnxruntime) so that options objects are made, and the CLI
reads their defaults, without loading them."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from onnxpipe.cluster.devicesfile import load_cluster
from onnxpipe.core.choices import Backend, LocalMode, RayFiles, choice
from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt
from onnxpipe.cost.options import frozen_shapes

if TYPE_CHECKING:
    from onnxpipe.cluster.model import Cluster

DEFAULT_LOCAL_MODE = LocalMode.THREADS
"""Threads are the default because they pass tensors without copies and wake without inter-process
signals, which made them faster than processes on every model the ``pipeline`` benchmark measured
(``benchmarks/results/pipeline.json``, docs/runtime.md).  Processes isolate the stages and measure each
one's memory."""

DEFAULT_SLOTS = 2
"""Micro-batches each channel between two workers holds, whatever the backend: one being handed over while
the next is computed."""

DEFAULT_RAY_FILES = RayFiles.SHIP
"""Stage files reach Ray's nodes through Ray: a cluster needs no folder every machine shares, and each
node keeps what it got, so a second run ships nothing."""

DEFAULT_RAY_RESTARTS = 3
"""Times Ray starts a lost actor again (its node died) before the run stops: a spare node takes over."""

DEFAULT_RAY_RESTART_TIMEOUT_S = 120.0
"""Seconds a lost actor may take to run again: Ray first declares its node dead (its health checks,
about 15-30 s by default), then starts the actor on another node and the driver ships it its files."""

MEASURED_MICROBATCHES = 32
"""Micro-batches :func:`onnxpipe.run` streams when neither ``inputs`` nor ``microbatches`` says how many."""
SINGLE_LATENCY_MICROBATCHES = 8
"""Micro-batches run one at a time after the measured stream, for the latency of one alone."""
DEFAULT_RUN_WARMUP = 4
"""Untimed micro-batches before the measured stream: each worker's first runs allocate."""


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    """Where the workers of :class:`RunOptions` and :class:`GenerateOptions` run: ``backend``: local
    ``local_mode`` threads or processes, or Ray actors on the cluster at ``ray_address`` with per-stage
    ``ray_resources`` (a JSON file or one mapping per stage), their files shipped to their nodes or read
    from a shared folder (``ray_files``), a lost actor started again on another node up to
    ``ray_restarts`` times within ``ray_restart_timeout`` seconds; ``threads`` each (default: the split's
    devices', else the plan's)."""

    backend: Backend = Backend.LOCAL
    local_mode: LocalMode = DEFAULT_LOCAL_MODE
    threads: int | None = None
    ray_address: str | None = None
    ray_resources: Path | Sequence[Mapping[str, Any]] | None = None
    ray_files: RayFiles = DEFAULT_RAY_FILES
    ray_restarts: int = DEFAULT_RAY_RESTARTS
    ray_restart_timeout: float = DEFAULT_RAY_RESTART_TIMEOUT_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend", choice(Backend, self.backend, "backend"))
        object.__setattr__(self, "local_mode", choice(LocalMode, self.local_mode, "local_mode"))
        object.__setattr__(self, "ray_files", choice(RayFiles, self.ray_files, "ray_files"))
        as_paths(self, "ray_resources")
        if self.threads is not None and self.threads < 1:
            raise UsageError(f"{opt('threads', self.threads)}: give 1 or more threads per worker")
        if self.backend == Backend.RAY:
            return
        for f in fields(WorkerOptions):  # another backend's options are refused
            if f.name.startswith("ray_") and getattr(self, f.name) != f.default:
                raise UsageError(f"{opt(f.name)} is for {opt('backend', Backend.RAY)}")


@dataclass(frozen=True)
class RunOptions(WorkerOptions):
    """Where and on what :func:`onnxpipe.run` runs a split folder, and what it measures.

    Workers: as :class:`WorkerOptions` says, with ``pin`` each local one on CPUs of its own, ``slots``
    micro-batches per link, ``devices``: a devices file (or cluster) naming each stage's provider and
    threads.

    Inputs: the user's, read as ``split`` reads them (``input_files``: one micro-batch per ``.npz`` or
    folder of ``.npy`` files; ``stacked_files``: several along a leading axis of each ``.npz``), or random
    ones at ``shapes`` (default: the planned shapes) from ``seed``; ``microbatches`` of them (default:
    all the files hold, else :data:`MEASURED_MICROBATCHES`) after ``warmup``; ``model``: the source model
    (default: the path in the manifest), for ``compare``.

    Results: ``report`` (the measurements as JSON) and ``outputs`` (the model outputs as ``.npz``) are
    written when given; ``compare`` also runs the model as one session and as K replicas, side by side.
    """

    devices: Cluster | None = None
    """A cluster, or the path of a devices file, read when the options are made."""
    slots: int = DEFAULT_SLOTS
    pin: bool = False
    input_files: tuple[Path, ...] = ()
    stacked_files: tuple[Path, ...] = ()
    microbatches: int | None = None
    warmup: int = DEFAULT_RUN_WARMUP
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))
    seed: int = 0
    model: Path | None = None
    report: Path | None = None
    outputs: Path | None = None
    compare: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "shapes", frozen_shapes(self.shapes))
        object.__setattr__(self, "input_files", tuple(Path(p) for p in self.input_files))
        object.__setattr__(self, "stacked_files", tuple(Path(p) for p in self.stacked_files))
        as_paths(self, "model", "report", "outputs")
        devices: object = self.devices
        if isinstance(devices, str | Path):  # a devices file, read when the options are made
            object.__setattr__(self, "devices", load_cluster(devices))
        self._check()

    @property
    def has_input_files(self) -> bool:
        return bool(self.input_files or self.stacked_files)

    def _check(self) -> None:
        """Refuse what cannot work together, before anything starts: another backend's options."""
        if self.slots < 1:
            raise UsageError(f"{opt('slots', self.slots)}: a link between stages needs at least one slot")
        if self.warmup < 0:
            raise UsageError(f"{opt('warmup', self.warmup)}: give 0 or more warm-up micro-batches")
        if self.microbatches is not None and self.microbatches < 1:
            raise UsageError(f"{opt('microbatches', self.microbatches)}: give 1 or more")
        if self.has_input_files and self.shapes:
            raise UsageError(
                f"{opt('shapes')} is for random inputs; the shapes of {opt('input_files')} are those in "
                "the files"
            )
        if self.backend == Backend.RAY and self.pin:
            raise UsageError(f"{opt('pin', True)} is for local workers; Ray places its actors itself")


def as_paths(options: object, *names: str) -> None:
    """The fields ``names`` of the frozen ``options`` given as strings, made paths (a ``ray_resources``
    given as mappings, and None, stay as they are)."""
    for name in names:
        value = getattr(options, name)
        if isinstance(value, str | os.PathLike):
            object.__setattr__(options, name, Path(value))


@dataclass(frozen=True)
class Sampling:
    """Sample the next token: logits over ``temperature``, only the ``top_k`` most likely (0: all),
    then only the most likely tokens whose probabilities add up to ``top_p`` (1.0: all), drawn with the
    sequence's generator from ``seed`` (:func:`~onnxpipe.runtime.generation.scheduler.draw`)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise UsageError(f"{opt('temperature', self.temperature)}: give a number above 0")
        if self.top_k < 0:
            raise UsageError(f"{opt('top_k', self.top_k)}: give 0 (all tokens) or more")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"{opt('top_p', self.top_p)}: give a number above 0 and at most 1")
        if self.seed < 0:
            raise UsageError(f"{opt('seed', self.seed)}: give 0 or more")


@dataclass(frozen=True)
class GenerateOptions(WorkerOptions):
    """What :func:`onnxpipe.generate` generates, and where.

    ``prompt_ids``: each prompt's token ids (several sequences in flight), or ``prompts``: each as text,
    encoded by the model's tokenizer (``tokenizer``: its folder, default the split's, else the source
    model's), with ``chat`` wrapped in its chat template as a user's message (after ``system``'s).  At
    most ``max_new_tokens`` new tokens each, fewer when an end-of-sequence id comes: ``eos_token_ids``,
    default the model's (the GenAI config its builder wrote, else its Hugging Face configs or tokenizer),
    none with ``ignore_eos``.  ``in_flight``: sequences in the pipeline at once (default: every prompt);
    ``batch``: sequences a decode step carries at most (default: those in flight over the stages, so that
    each stage has a step; 1: a step per sequence).
    Each token is the highest logit (greedy) unless ``do_sample``: then it is drawn as ``temperature``,
    ``top_k``, ``top_p`` and ``seed`` say (:class:`Sampling`'s defaults where not given).  Workers: as
    :class:`WorkerOptions` says, a lost actor's sequences rebuilt on its new node by a prefill of their
    tokens so far.  ``compare`` also generates with the unsplit model
    (``model``, default: the manifest's; a plain loop in this process) and K replicas of it (on the same
    backend: Ray actors placed by Ray, with Ray): the tokens must be the same.  ``embedding``: the
    embedding model (token ids in, ``inputs_embeds`` out) of a split that takes ``inputs_embeds``
    (default: the one its folder's ``genai_config.json`` names), run in the driver before each step.
    ``inputs``: an encoder-decoder split's encoder inputs, ``.npz`` files, a sequence per row, in place of
    prompts (each starts with the model's start tokens).
    """

    prompt_ids: tuple[tuple[int, ...], ...] = ()
    prompts: tuple[str, ...] = ()
    chat: bool = False
    system: str | None = None
    tokenizer: Path | None = None
    max_new_tokens: int = 32
    eos_token_ids: tuple[int, ...] | None = None
    ignore_eos: bool = False
    in_flight: int | None = None
    batch: int | None = None
    do_sample: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    compare: bool = False
    model: Path | None = None
    embedding: Path | None = None
    inputs: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        as_paths(self, "tokenizer", "model", "embedding")
        object.__setattr__(self, "prompt_ids", tuple(tuple(int(t) for t in p) for p in self.prompt_ids))
        object.__setattr__(self, "prompts", tuple(str(p) for p in self.prompts))
        object.__setattr__(self, "inputs", tuple(Path(p) for p in self.inputs))
        if self.eos_token_ids is not None:
            object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))
        self._check()

    @property
    def sampling(self) -> Sampling | None:
        """How tokens are drawn, or None: greedy."""
        given = {f.name: v for f in fields(Sampling) if (v := getattr(self, f.name)) is not None}
        return Sampling(**given) if self.do_sample else None

    def _check(self) -> None:
        """Refuse what cannot work together, before any worker starts."""
        if self.max_new_tokens < 1:
            raise UsageError(f"{opt('max_new_tokens', self.max_new_tokens)}: give 1 or more")
        if self.in_flight is not None and self.in_flight < 1:
            raise UsageError(f"{opt('in_flight', self.in_flight)}: give 1 or more sequences")
        if self.batch is not None and self.batch < 1:
            raise UsageError(f"{opt('batch', self.batch)}: give 1 or more sequences per step")
        if any(t < 0 for p in self.prompt_ids for t in p) or any(t < 0 for t in self.eos_token_ids or ()):
            raise UsageError(f"{opt('prompt_ids')}: token ids are 0 or more")
        empty = next((i for i, p in enumerate(self.prompt_ids) if not p), None)
        if empty is not None:
            raise UsageError(f"prompt {empty} holds no token id: give at least one")
        self._check_text()
        if not self.do_sample:
            given = [f.name for f in fields(Sampling) if getattr(self, f.name) is not None]
            if given:
                raise UsageError(
                    f"{opt(given[0])} is for sampling: add {opt('do_sample', True)}, or leave it out for "
                    "greedy tokens"
                )
        self.sampling  # noqa: B018 (a bad temperature, top-k or top-p is refused here)

    def _check_text(self) -> None:
        if not self.prompts and not self.prompt_ids and not self.inputs:
            raise UsageError(
                f"give at least one prompt, as text ({opt('prompts')}) or as {opt('prompt_ids')}"
            )
        if self.prompts and self.prompt_ids:
            raise UsageError(
                f"{opt('prompts')} and {opt('prompt_ids')}: give the prompts as text or as token ids, not "
                "both"
            )
        if self.chat and not self.prompts:
            raise UsageError(f"{opt('chat', True)} wraps text prompts: give them as {opt('prompts')}")
        if self.system is not None and not self.chat:
            raise UsageError(f"{opt('system')} is the chat's first message: add {opt('chat', True)}")
        if self.ignore_eos and self.eos_token_ids is not None:
            raise UsageError(
                f"{opt('ignore_eos', True)} and {opt('eos_token_ids')}: stop at the ids given, or at none"
            )


DEFAULT_LINK_REPEATS = 20
"""Transfers a link is timed at per size, one at a time: the median of them counts."""


@dataclass(frozen=True)
class LinkOptions:
    """How :func:`onnxpipe.links` measures the links of a devices file on a Ray cluster.

    A probe actor per device, on the cluster at ``ray_address`` (default: the one this process started,
    or a new local one), pinned to the device's node by ``ray_resources`` (a JSON file or one mapping per
    device, in pipeline order, as ``run`` takes per stage).  Each link is timed at ``sizes`` bytes
    (default: the boundary tensors of the split folder ``split``, between its stages on those devices,
    else :data:`DEFAULT_LINK_SIZES`), ``repeats`` transfers per size.  ``out``: the devices file written
    again with the measured links.
    """

    ray_address: str | None = None
    ray_resources: Path | Sequence[Mapping[str, Any]] | None = None
    split: Path | None = None
    sizes: tuple[int, ...] = ()
    repeats: int = DEFAULT_LINK_REPEATS
    out: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", tuple(int(n) for n in self.sizes))
        as_paths(self, "split", "out", "ray_resources")
        self._check()

    def _check(self) -> None:
        if self.repeats < 1:
            raise UsageError(f"{opt('repeats', self.repeats)}: give 1 or more transfers per size")
        if any(n < 1 for n in self.sizes):
            raise UsageError(f"{opt('sizes')}: give sizes of 1 byte or more")
        if self.split is not None and self.sizes:
            raise UsageError(
                f"give {opt('sizes')} or {opt('split')} (whose boundary tensors set them), not both"
            )


DEFAULT_LINK_SIZES = (64 * 1024, 1024 * 1024, 4 * 1024 * 1024)
"""Bytes a link is timed at without a split: tensors of a few pieces, of a megabyte and of several,
all sent inline as a stage sends them."""
