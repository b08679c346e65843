"""What a user asks a planner for, beyond the model and its costs: :class:`PlanRequest`.

How many stages, on which devices (a cluster, or identical copies of the profiling machine joined by
links of one bandwidth), in which device order, dealt out to how many workers, under which schedule
(:class:`ScheduleRequest`).  The API, the CLI and the planners share it, so each option is spelled
once; a :class:`PlanRequest` refuses what cannot work together when it is made, before any cost is
measured.

How a decoder LLM's split is asked for (:class:`DecoderOptions`) is here too, apart from
:mod:`onnxpipe.planning.decoder_plan`, so that options objects are made without loading the model code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from onnxpipe.cluster.devicesfile import load_cluster
from onnxpipe.cluster.model import Cluster
from onnxpipe.core.choices import (
    BoundaryDtype,
    DeviceOrder,
    Ends,
    LinkModel,
    Objective,
    PhaseChoice,
    ScheduleChoice,
    ScheduleKind,
    SplitNodes,
    choice,
)
from onnxpipe.core.errors import PartitionError, UsageError
from onnxpipe.core.options import opt
from onnxpipe.ir.decoder_kinds import DECODE_PAST, PREFILL_TOKENS, PhaseShape, phase_shape
from onnxpipe.planning.orders import DEFAULT_TOLERANCE
from onnxpipe.schedule.timeline import DEFAULT_BACKWARD_RATIO, DEFAULT_MICROBATCHES

DEFAULT_LINK_MODEL = LinkModel.SERIAL
"""How a link's transfer time counts against a stage without a devices file: ``serial``, a stage receives
its inputs, then computes (compute + transfer in): the stages are this machine's workers, which receive
their own inputs (one core does both, or the link blocks it)."""
DEVICES_LINK_MODEL = LinkModel.OVERLAP
"""With a devices file (or a training schedule): ``overlap``, links move the next micro-batch while the
stage computes the current one (the larger of the two counts), as devices with their own network engines
do.  Plans without a devices file used to add and plans with one to overlap, with nothing saying so; the
same 1 Gbit/s link then gave two cuts.  Both stay, chosen by ``--link-model`` and recorded in the plan
and the manifest."""
DEFAULT_TIME_SLACK = 0.01
"""An interleaved split may be 1% slower than the fastest one if that balances the workers' weights:
the exactly fastest split of a CNN can leave most of its weights on one worker while one a fraction of
a percent slower halves them (``benchmarks/results/interleave.json``, docs/interleave.md)."""


@dataclass(frozen=True)
class ScheduleOption:
    """One schedule the planner tries: its kind, M micro-batches, and the samples in each."""

    kind: ScheduleKind
    microbatches: int
    size: int

    @property
    def training(self) -> bool:
        return self.kind.training

    def describe(self) -> str:
        return "streaming" if not self.training else f"{self.kind} with {self.microbatches} micro-batches"


@dataclass(frozen=True)
class ScheduleRequest:
    """What the user asked for: a schedule (or ``auto`` among the training ones), M, and the batch.

    ``batch`` samples (at the profiled input shapes) make one training iteration, split into
    ``microbatches`` micro-batches of ``batch / microbatches`` samples; ``auto`` tries every divisor of
    ``batch`` for M when ``microbatches`` is not given.  Streaming inference uses micro-batches of one
    profiled sample and M only for the simulated timeline.
    """

    kind: ScheduleChoice = ScheduleChoice.STREAM
    microbatches: int | None = None
    batch: int | None = None
    backward_ratio: float = DEFAULT_BACKWARD_RATIO

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", choice(ScheduleChoice, self.kind, "ScheduleRequest.kind"))

    @property
    def stream_microbatches(self) -> int:
        """M of a streaming timeline: the one asked for, else :data:`DEFAULT_MICROBATCHES`."""
        return self.microbatches or DEFAULT_MICROBATCHES

    def candidates(self) -> list[ScheduleOption]:
        """The schedules to try: (kind, M, samples per micro-batch)."""
        if not (self.backward_ratio > 0 and math.isfinite(self.backward_ratio)):
            raise UsageError(
                f"{opt('backward_ratio', self.backward_ratio)}: give a positive finite number (default 2)"
            )
        if self.microbatches is not None and self.microbatches < 1:
            raise UsageError(f"{opt('microbatches', self.microbatches)}: give 1 or more")
        if self.kind == ScheduleChoice.STREAM:
            if self.batch is not None or self.backward_ratio != DEFAULT_BACKWARD_RATIO:
                raise UsageError(
                    f"{opt('batch')} and {opt('backward_ratio')} plan training; give "
                    f"{opt('ScheduleRequest.kind', 'gpipe')}, 1f1b or auto, or leave them out for streaming "
                    "inference"
                )
            return [ScheduleOption(ScheduleKind.STREAM, self.stream_microbatches, 1)]
        kinds = self.kind.kinds
        batch = self.batch or self.microbatches or DEFAULT_MICROBATCHES
        if self.microbatches is not None:
            if batch % self.microbatches:
                raise UsageError(
                    f"{opt('microbatches', self.microbatches)} does not split {opt('batch', batch)} evenly; "
                    "choose a divisor of the batch"
                )
            options = [self.microbatches]
        else:
            options = [m for m in range(1, batch + 1) if batch % m == 0]
        return [ScheduleOption(kd, m, batch // m) for kd in kinds for m in options]


DEFAULT_MAX_CONTEXT = 4096
"""Tokens of context the KV cache memory is reported (and checked) for when ``--max-context`` is not
given: a common context length of today's small LLMs."""


@dataclass(frozen=True)
class DecoderOptions:
    """How a decoder is split: cuts between layers only (``layer_cuts``), where its ends go, and the
    context its KV cache memory is counted at."""

    layer_cuts: bool = True
    ends: Ends = Ends.FREE
    max_context: int = DEFAULT_MAX_CONTEXT
    phase: PhaseChoice = PhaseChoice.BOTH
    """The phase(s) the split is balanced for; ``both`` profiles the model at two shapes."""
    prefill_tokens: int = PREFILL_TOKENS
    decode_past: int = DECODE_PAST
    copy_inputs: bool = True
    """Whether a stage makes the rotary tables and masks of the model inputs instead of receiving them,
    where the plan's rule finds that cheaper (:mod:`onnxpipe.planning.decoder_recompute`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ends", choice(Ends, self.ends, "ends"))
        object.__setattr__(self, "phase", choice(PhaseChoice, self.phase, "phase"))
        self._check()

    def phases(self) -> tuple[PhaseShape, ...]:
        """The shapes to profile at: one phase, or prefill then decode for ``both``."""
        return tuple(
            phase_shape(p, prefill_tokens=self.prefill_tokens, decode_past=self.decode_past)
            for p in self.phase.phases
        )

    def _check(self) -> None:
        self.phases()  # refuses a bad prefill_tokens or decode_past
        if (
            isinstance(self.max_context, bool)
            or not isinstance(self.max_context, int)
            or self.max_context < 1
        ):
            raise UsageError(f"{opt('max_context', self.max_context)}: give a positive number of tokens")


DEFAULT_SPLIT_NODES = SplitNodes.OFF
"""Off by default: ``auto`` times the candidate node's parts (seconds of extra planning) and changes the
stage files' nodes; the ``nodesplit`` benchmark measures what it gains (docs/node-splitting.md)."""


@dataclass(frozen=True)
class PlanRequest:
    """What to plan: ``stages`` stages (or ``"auto"``), on ``devices`` or identical workers.

    Without ``devices`` the stages run on copies of the profiling machine whose links carry
    ``bandwidth_bytes_per_s``; with it the devices file's links do.  ``workers`` deals the stages out to
    fewer identical workers in turn (an interleaved split, up to ``time_slack`` slower than the fastest
    split if that balances the workers' weights).  ``tolerance``: ``stages="auto"`` keeps the fewest
    stages within it of the best bottleneck.  ``split_nodes``: ``auto`` lets the plan cut one dominating
    node into parts over consecutive stages (one stage per identical worker only).
    """

    stages: int | Literal["auto"]
    devices: Cluster | None = None
    """The cluster, or the path of a devices file (docs/devices.md), read when the request is made."""
    bandwidth_bytes_per_s: float = math.inf
    order: DeviceOrder = DeviceOrder.FIXED
    schedule: ScheduleRequest = field(default_factory=ScheduleRequest)
    workers: int | None = None
    time_slack: float | None = None
    tolerance: float = DEFAULT_TOLERANCE
    split_nodes: SplitNodes = DEFAULT_SPLIT_NODES
    link_model: LinkModel | None = None
    """How transfers count (:data:`DEFAULT_LINK_MODEL`); None: serial without devices, overlap with."""
    decoder: DecoderOptions = field(default_factory=DecoderOptions)
    """How a decoder with a KV cache is split (ignored for other models)."""
    objective: Objective = Objective.THROUGHPUT
    """``throughput``: the slowest stage or link (a stream of requests); ``latency``: the sum of every
    stage and link, what one request alone (single-sequence decoding) waits for."""
    boundary_dtype: BoundaryDtype = BoundaryDtype.FLOAT32
    """What the float32 activations crossing a cut travel as
    (:func:`onnxpipe.planning.planner.plan_with_wire`)."""

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "boundary_dtype", choice(BoundaryDtype, self.boundary_dtype, "boundary_dtype")
        )
        object.__setattr__(self, "split_nodes", choice(SplitNodes, self.split_nodes, "split_nodes"))
        object.__setattr__(self, "objective", choice(Objective, self.objective, "objective"))
        devices: object = self.devices  # a devices file may come as its path
        if isinstance(devices, str | Path):
            object.__setattr__(self, "devices", load_cluster(devices))
        elif devices is not None and not isinstance(devices, Cluster):
            raise UsageError(f"{opt('devices')}: give a cluster or the path of a devices file")
        object.__setattr__(self, "order", choice(DeviceOrder, self.order, "order"))
        if self.link_model is not None:
            object.__setattr__(self, "link_model", choice(LinkModel, self.link_model, "link_model"))
        self._check()

    @property
    def interleaved(self) -> bool:
        """Whether the stages share workers (``workers`` fewer than the stages)."""
        return self.workers is not None and self.workers != self.stages

    @property
    def _streams_here(self) -> bool:
        """Streaming on copies of this machine in the fixed order: no devices file, order or schedule."""
        return (
            self.devices is None
            and self.order == DeviceOrder.FIXED
            and self.schedule.kind == ScheduleChoice.STREAM
        )

    @property
    def on_identical_workers(self) -> bool:
        """A streaming plan for copies of this machine in a fixed order (:mod:`onnxpipe.planning.workers`)."""
        return (
            self._streams_here
            and isinstance(self.stages, int)
            and self.link_model != LinkModel.OVERLAP
            and self.objective == Objective.THROUGHPUT
        )

    @property
    def off_the_chain(self) -> str | None:
        """The option (named as :func:`~onnxpipe.core.options.opt` names it) that takes this plan off a
        chain of identical workers (to the devices planner, or to interleaved workers); None for such a
        chain or automatic stages without devices (what plans for one phase and ``ends="own"`` cannot do,
        it names)."""
        if self.devices is not None:
            return opt("devices")
        if self.interleaved:
            return opt("workers")
        if not isinstance(self.stages, int):
            return None
        if self.order != DeviceOrder.FIXED:
            return opt("order", self.order)
        if self.schedule.kind != ScheduleChoice.STREAM:
            return opt("ScheduleRequest.kind", self.schedule.kind)
        if self.link_model == LinkModel.OVERLAP:
            return opt("link_model", LinkModel.OVERLAP)
        if self.objective == Objective.LATENCY:
            return opt("objective", Objective.LATENCY)
        return None

    @property
    def effective_link_model(self) -> LinkModel:
        """The link model the plan uses: the one asked for, else serial on identical workers streaming
        and overlap otherwise (a devices file, a free order, a training schedule)."""
        if self.link_model is not None:
            return self.link_model
        return DEFAULT_LINK_MODEL if self._streams_here else DEVICES_LINK_MODEL

    def check_stage_count(self, compute_nodes: int, label: str) -> None:
        """Refuse a stage count above the model's ``compute_nodes`` (cheap: before any cost is measured)."""
        if isinstance(self.stages, int) and not 1 <= self.stages <= compute_nodes:
            raise PartitionError(
                f"{label}: cannot make {self.stages} non-empty stages from {compute_nodes} "
                f"compute nodes; choose {opt('stages')} between 1 and {compute_nodes}"
            )

    def _check(self) -> None:
        """Refuse what cannot work together, before any cost is measured (cheap)."""
        stages = self.stages
        if isinstance(stages, bool) or not (isinstance(stages, int) or stages == "auto"):
            raise UsageError(f"{opt('stages', stages)}: give a number of stages or 'auto'")
        if isinstance(stages, int) and stages < 1:
            raise UsageError(f"{opt('stages', stages)}: give 1 or more stages, or 'auto'")
        if self.workers is not None:
            self._check_workers()
        if self.time_slack is not None:
            if not self.interleaved:
                raise UsageError(
                    f"{opt('time_slack', self.time_slack)}: it trades time for balanced weights between "
                    f"workers that run several stages each; give {opt('workers', 'W')} with {opt('stages')} "
                    "a multiple of W above W"
                )
            if not (math.isfinite(self.time_slack) and self.time_slack >= 0):
                raise UsageError(
                    f"{opt('time_slack', self.time_slack)}: give a finite share of 0 or more (0.01 is 1%)"
                )
        cluster = self.devices
        if stages == "auto" and cluster is None and not self._streams_here:
            raise UsageError(
                f"{opt('stages', 'auto')} without {opt('devices')} plans streaming inference on this "
                f"machine's CPUs; give {opt('stages', 'K')} for a training schedule or "
                f"{opt('order', DeviceOrder.FREE)}, or a devices file"
            )
        if cluster is not None and isinstance(stages, int) and stages > cluster.size:
            raise PartitionError(
                f"{cluster.source or 'the devices file'}: {stages} stages need {stages} devices but it "
                f"lists {cluster.size}; choose {opt('stages')} between 1 and {cluster.size}"
            )
        if cluster is not None and self.bandwidth_bytes_per_s != math.inf:
            raise UsageError(
                f"{opt('bandwidth_bytes_per_s')}: the links of {cluster.source or 'the devices file'} set "
                "the bandwidth; give it there (links[].bandwidth_bytes_per_s) instead"
            )
        if self.link_model is not None:
            self._check_link_model()
        self.schedule.candidates()
        if self.split_nodes == SplitNodes.AUTO and (not self.on_identical_workers or self.interleaved):
            raise UsageError(
                f"{opt('split_nodes', SplitNodes.AUTO)} plans one stage per identical worker "
                f"({opt('stages', 'K')}, streaming, no {opt('devices')}, {opt('order')}, {opt('workers')} "
                f"or {opt('link_model', LinkModel.OVERLAP)}, objective throughput); give "
                f"{opt('split_nodes', SplitNodes.OFF)} "
                "for this plan"
            )
        if self.boundary_dtype == BoundaryDtype.BFLOAT16:
            raise UsageError(
                f"{opt('boundary_dtype', BoundaryDtype.BFLOAT16)}: onnxruntime's Python API cannot hand a "
                f"bfloat16 tensor from one stage to the next (numpy has no such type); choose "
                f"{opt('boundary_dtype', BoundaryDtype.FLOAT16)}, which sends as few bytes"
            )
        if self.split_nodes == SplitNodes.AUTO and self.boundary_dtype != BoundaryDtype.FLOAT32:
            raise UsageError(
                f"{opt('split_nodes', SplitNodes.AUTO)} cuts nodes into parts whose boundaries stay float32; "
                f"leave out {opt('boundary_dtype')} or {opt('split_nodes')}"
            )
        if self.objective == Objective.LATENCY:
            self._check_latency()

    def _check_latency(self) -> None:
        """``objective="latency"`` plans one request at a time through contiguous stages: not a training
        schedule, interleaved workers or cut nodes, which serve a stream."""
        if self.schedule.kind != ScheduleChoice.STREAM or self.workers is not None:
            raise UsageError(
                f"{opt('objective', Objective.LATENCY)} plans inference one request at a time; leave out "
                f"{opt('ScheduleRequest.kind')} and {opt('workers')}, or give "
                f"{opt('objective', Objective.THROUGHPUT)}"
            )

    def _check_link_model(self) -> None:
        if self.link_model == LinkModel.SERIAL and not self._streams_here:
            raise UsageError(
                f"{opt('link_model', LinkModel.SERIAL)} is planned for streaming on identical workers in a "
                f"fixed order; a devices file, {opt('order', DeviceOrder.FREE)} and training schedules "
                f"overlap links with compute: leave out {opt('link_model')} or give overlap"
            )
        if self.link_model == LinkModel.OVERLAP and self.interleaved:
            raise UsageError(
                f"{opt('link_model', LinkModel.OVERLAP)}: interleaved stages ({opt('workers')}) are "
                f"planned with serial links; leave out {opt('link_model')} or {opt('workers')}"
            )

    def _check_workers(self) -> None:
        """``workers``: identical CPU workers streaming inference, each running as many stages."""
        workers, stages = self.workers, self.stages
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise UsageError(f"{opt('workers', workers)}: give a positive number of workers")
        if not isinstance(stages, int):
            raise UsageError(
                f"{opt('workers')} needs a number of {opt('stages')}: an interleaved split deals them out "
                "in turn"
            )
        if stages % workers > 1:
            raise UsageError(
                f"{opt('stages', stages)} {opt('workers', workers)}: every worker runs the same number of "
                f"stages, worker 0 one more where the last stage wraps back to it (a tied embedding and LM "
                f"head on one worker); give a multiple of {workers} stages, or one more"
            )
        if self.devices is not None or self.order != DeviceOrder.FIXED:
            raise UsageError(
                f"{opt('workers')} plans identical workers; it cannot be combined with {opt('devices')} "
                f"or {opt('order')}"
            )
        if self.schedule.kind != ScheduleChoice.STREAM:
            raise UsageError(
                f"{opt('workers')}: interleaved stages are planned for inference "
                f"({opt('ScheduleRequest.kind', ScheduleChoice.STREAM)}), not {self.schedule.kind}"
            )
