"""Pipeline schedules, their simulation, their activation memory, and the choice between them.

The partitioner balances per-micro-batch costs; how long a whole batch takes, and how much memory each
stage needs while it runs, depends on the *schedule*: in which order each device runs the forward (F) and
backward (B) steps of the micro-batches.  This module simulates inference streaming and the two
training schedules BaPipe explores:

``stream``
    Inference: every device runs F0, F1, ... F(M-1).  Nothing is kept for a backward pass.
``gpipe``
    GPipe: every device runs all forwards F0..F(M-1), then all backwards B0..B(M-1) in the *same*
    micro-batch order (as in the Megatron-LM figure; the reverse order gives the same times when every
    micro-batch costs the same, and the same order keeps gradient accumulation deterministic).
``1f1b``
    1F1B (PipeDream-Flush): stage ``s`` of ``K`` runs ``w = min(K-s-1, M)`` warm-up forwards, then
    alternates one forward and one backward (F(w), B0, F(w+1), B1, ...), then the remaining backwards.

The simulation is a discrete-event one with these rules (all times per micro-batch):

* a device runs its steps in the schedule's order, one at a time, each as soon as its inputs are there;
* F(s, j) needs micro-batch ``j``'s activations from stage ``s-1``: they leave when F(s-1, j) ends and take
  ``link[s]`` seconds on the link into stage ``s``; stage 0's inputs come over ``link[0]`` from the source
  (normally 0: the model input is already on the first device);
* B(s, j) needs F(s, j) done and the gradient from stage ``s+1``, which leaves when B(s+1, j) ends and takes
  ``link[s+1]`` seconds back (a gradient has the size of its activation); the last stage's B(j) may start
  right after its F(j) (the loss is computed there);
* a link carries one transfer at a time in each direction (so a link is a pipeline resource with its own
  throughput, the "transfer time" of the bottleneck), links are full duplex, and transfers overlap compute.

Everything is in seconds and bytes; no model or device is needed, which is what lets the tests check the
timelines against hand-computed ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from onnxpipe.core.errors import ManifestError, PartitionError, UsageError

ScheduleKind = Literal["stream", "gpipe", "1f1b"]
StepKind = Literal["F", "B"]
KINDS: tuple[ScheduleKind, ...] = ("stream", "gpipe", "1f1b")
TRAINING_KINDS: tuple[ScheduleKind, ...] = ("gpipe", "1f1b")
DEFAULT_BACKWARD_RATIO = 2.0
"""Backward over forward time when no training graph says better: two matrix products per forward one."""


@dataclass(frozen=True)
class Step:
    """One forward (``"F"``) or backward (``"B"``) of micro-batch ``microbatch`` on a device."""

    kind: StepKind
    microbatch: int
    start: float
    end: float


@dataclass(frozen=True)
class Transfer:
    """Micro-batch ``microbatch``'s cut moving over link ``link``, the one between stages ``link - 1`` and
    ``link`` (link 0 brings the model input from the source to stage 0).

    ``kind == "F"``: activations forward into stage ``link``; ``kind == "B"``: gradients back into stage
    ``link - 1``.
    """

    link: int
    kind: StepKind
    microbatch: int
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """A simulated schedule: every device's ordered steps with start and end times.

    ``steady_state_throughput_per_s`` is micro-batches per second once the pipeline is full (one over the
    slowest resource: a device's F+B time or a link's transfer time); ``makespan`` is one whole batch of
    ``microbatches`` micro-batches, fill and drain included.
    """

    kind: ScheduleKind
    microbatches: int
    stages: tuple[tuple[Step, ...], ...]
    transfers: tuple[Transfer, ...]
    makespan: float
    steady_state_throughput_per_s: float
    workers: tuple[int, ...] | None = None
    """The worker of each stage when stages share workers (an interleaved split); ``None``: one each."""

    @property
    def k(self) -> int:
        return len(self.stages)

    @property
    def devices(self) -> int:
        """How many devices (workers) run the stages."""
        return self.k if self.workers is None else len(set(self.workers))

    @property
    def busy(self) -> tuple[float, ...]:
        """Seconds each device computes during the makespan."""
        return tuple(sum(st.end - st.start for st in steps) for steps in self.stages)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the device-time ``devices * makespan``: ``(K-1)/(M+K-1)`` for a balanced pipeline
        of ``K`` stages on ``K`` devices."""
        if self.makespan <= 0 or not self.stages:
            return 0.0
        return max(0.0, 1.0 - sum(self.busy) / (self.devices * self.makespan))

    @property
    def first_latency(self) -> float:
        """When micro-batch 0 is finished: its last forward (inference) or its backward on stage 0."""
        if self.kind == "stream":
            return next((st.end for st in self.stages[-1] if st.microbatch == 0), 0.0)
        return next((st.end for st in self.stages[0] if st.kind == "B" and st.microbatch == 0), 0.0)

    def to_obj(self, device_names: Sequence[str] | None = None) -> dict[str, Any]:
        """The manifest's ``schedule``: per device the ordered ``[kind, micro-batch, start, end]`` steps.

        ``inf`` (the throughput of stages that take no time) is written as ``null``, as everywhere in the
        manifest.
        """
        names = list(device_names) if device_names is not None else [f"stage{s}" for s in range(self.k)]
        if len(names) != self.k:
            raise ValueError(f"{len(names)} device names for {self.k} stages")
        busy = self.busy
        return {
            "kind": self.kind,
            "microbatches": self.microbatches,
            "makespan_seconds": _num(self.makespan),
            "steady_state_throughput_per_s": _num(self.steady_state_throughput_per_s),
            "bubble_fraction": _num(self.bubble_fraction),
            "devices": [
                {
                    "stage": s,
                    "device": names[s],
                    **({} if self.workers is None else {"worker": self.workers[s]}),
                    "busy_seconds": _num(busy[s]),
                    "steps": [[st.kind, st.microbatch, _num(st.start), _num(st.end)] for st in steps],
                }
                for s, steps in enumerate(self.stages)
            ],
            "transfers": [[t.link, t.kind, t.microbatch, _num(t.start), _num(t.end)] for t in self.transfers],
        }

    @staticmethod
    def from_obj(obj: Any, where: str = "schedule", source: str = "manifest.json") -> Timeline:
        """Read :meth:`to_obj`'s output back; :class:`ManifestError` names the JSON path at fault."""
        return _TimelineReader(source).timeline(obj, where)


def _num(x: float) -> float | None:
    if math.isnan(x) or x == -math.inf:
        raise ValueError(f"{x} cannot be written to a manifest")
    return None if math.isinf(x) else float(x)


# --------------------------------------------------------------------------------------------------
# step orders and memory


def step_order(kind: ScheduleKind, stage: int, k: int, microbatches: int) -> tuple[tuple[StepKind, int], ...]:
    """The order in which device ``stage`` (of ``k``) runs its steps under ``kind``."""
    m = microbatches
    fwd: list[tuple[StepKind, int]] = [("F", j) for j in range(m)]
    if kind == "stream":
        return tuple(fwd)
    bwd: list[tuple[StepKind, int]] = [("B", j) for j in range(m)]
    if kind == "gpipe":
        return tuple(fwd + bwd)
    if kind == "1f1b":
        w = min(k - stage - 1, m)
        order = fwd[:w]
        for i in range(m - w):
            order += [fwd[w + i], bwd[i]]
        order += bwd[m - w :]
        return tuple(order)
    raise UsageError(f"unknown schedule {kind!r}; choose one of {', '.join(KINDS)}")


def in_flight(kind: ScheduleKind, stage: int, k: int, microbatches: int) -> int:
    """Most micro-batches whose activations stage ``stage`` (0-based, of ``k``) holds at once.

    * ``stream``: 1.  Inference keeps nothing for a backward pass, so a stage holds only the micro-batch it
      is computing; ``K - s`` micro-batches are in flight in the *pipeline*, but on different stages.
    * ``gpipe``: ``M``: every forward runs before the first backward frees anything.
    * ``1f1b``: ``min(M, K - s)``: ``K - s - 1`` warm-up forwards plus the one of the steady state; then
      every forward is followed by a backward that frees one.  The first stage holds the most.
    """
    if microbatches < 1:
        return 0
    if kind == "stream":
        return 1
    if kind == "gpipe":
        return microbatches
    if kind == "1f1b":
        return min(microbatches, k - stage)
    raise UsageError(f"unknown schedule {kind!r}; choose one of {', '.join(KINDS)}")


def activation_memory(kind: ScheduleKind, stage: int, k: int, microbatches: int, act_bytes: float) -> float:
    """Activation bytes stage ``stage`` needs: :func:`in_flight` times one micro-batch's ``act_bytes``.

    ``act_bytes`` is what one micro-batch leaves on the stage: for training, the activations stashed for
    its backward (about every intermediate tensor of the stage); for inference, the stage's peak working
    set.  Not counted: the cut tensors buffered while a transfer overlaps compute.
    """
    return in_flight(kind, stage, k, microbatches) * act_bytes


def stage_memory(
    kind: ScheduleKind, stage: int, k: int, microbatches: int, act_bytes: float, param_bytes: float
) -> float:
    """Parameters plus activations: what must fit the stage's device.

    For training give ``param_bytes`` with gradients and optimizer state included (Adam: about 4x the
    weights).
    """
    return param_bytes + activation_memory(kind, stage, k, microbatches, act_bytes)


def backward_seconds(fwd: Sequence[float], ratio: float = DEFAULT_BACKWARD_RATIO) -> tuple[float, ...]:
    """Backward time per stage as ``ratio`` times forward, for models without a training graph."""
    if not ratio > 0 or math.isinf(ratio):
        raise UsageError(f"backward ratio must be a positive number, got {ratio}")
    return tuple(ratio * f for f in fwd)


# --------------------------------------------------------------------------------------------------
# simulation


def _send(
    transfers: list[Transfer],
    free: list[float],
    lk: int,
    direction: StepKind,
    j: int,
    ready: float,
    cost: float,
) -> float:
    """Move micro-batch ``j`` over link ``lk`` (one transfer at a time per direction, ``free`` says when
    each is next idle) once it is ``ready``; the arrival time.  Free links (``cost <= 0``) record nothing."""
    if cost <= 0:
        return ready
    start = max(ready, free[lk])
    free[lk] = start + cost
    transfers.append(Transfer(lk, direction, j, start, start + cost))
    return start + cost


def simulate(
    kind: ScheduleKind,
    fwd: Sequence[float],
    bwd: Sequence[float] | None,
    link: Sequence[float],
    microbatches: int,
    workers: Sequence[int] | None = None,
) -> Timeline:
    """Simulate ``microbatches`` micro-batches through ``len(fwd)`` stages (rules in the module docstring).

    ``fwd[s]`` / ``bwd[s]``: seconds of one micro-batch's forward / backward on stage ``s``'s device
    (``bwd`` is ignored, and may be ``None``, for ``stream``); ``link[s]``: seconds to move one micro-batch's
    cut into stage ``s`` (``link[0]`` from the source, normally 0).  All three have one entry per stage.
    ``workers[s]``: the device that runs stage ``s`` when stages share devices (``stream`` only; see
    :func:`_simulate_shared`); ``None``: a device per stage.
    """
    if kind not in KINDS:
        raise UsageError(f"unknown schedule {kind!r}; choose one of {', '.join(KINDS)}")
    if microbatches < 1:
        raise UsageError(
            f"need at least one micro-batch, got {microbatches}; choose --microbatches 1 or more"
        )
    k = len(fwd)
    if k < 1:
        raise ValueError("simulate needs at least one stage")
    if len(link) != k:
        raise ValueError(f"link has {len(link)} entries for {k} stages (link[0] is the source's link)")
    training = kind != "stream"
    if training:
        if bwd is None:
            raise ValueError(f"schedule {kind!r} needs backward times")
        if len(bwd) != k:
            raise ValueError(f"bwd has {len(bwd)} entries for {k} stages")
    b_cost = [float(x) for x in bwd] if training and bwd is not None else [0.0] * k
    f_cost = [float(x) for x in fwd]
    l_cost = [float(x) for x in link]
    for name, seq in (("fwd", f_cost), ("bwd", b_cost), ("link", l_cost)):
        if any(not (math.isfinite(x) and x >= 0) for x in seq):
            raise ValueError(f"{name} times must be finite and non-negative: {seq}")

    if workers is not None:
        if training:
            raise UsageError(f"schedule {kind!r}: stages that share a worker are planned for inference only")
        if len(workers) != k or any(w < 0 for w in workers):
            raise ValueError(f"workers must give each of the {k} stages a worker index >= 0: {list(workers)}")
        return _simulate_shared(f_cost, l_cost, microbatches, tuple(int(w) for w in workers))
    m = microbatches
    orders = [step_order(kind, s, k, m) for s in range(k)]
    f_arrive: list[list[float | None]] = [[None] * m for _ in range(k)]
    b_arrive: list[list[float | None]] = [[None] * m for _ in range(k)]
    f_done: list[list[float | None]] = [[None] * m for _ in range(k)]
    transfers: list[Transfer] = []
    link_f_free = [0.0] * k  # link s (stage s-1 -> s), forward direction
    link_b_free = [0.0] * k  # link s, backward direction (stage s -> s-1)

    for j in range(m):  # the source sends the model inputs one micro-batch after another
        f_arrive[0][j] = _send(transfers, link_f_free, 0, "F", j, 0.0, l_cost[0])

    steps: list[list[Step]] = [[] for _ in range(k)]
    ptr = [0] * k
    dev_free = [0.0] * k
    progress = True
    while progress:
        progress = False
        for s in range(k):
            while ptr[s] < len(orders[s]):
                op, j = orders[s][ptr[s]]
                ready = f_arrive[s][j] if op == "F" else b_arrive[s][j]
                if ready is None:
                    break
                if op == "B" and f_done[s][j] is None:
                    raise RuntimeError(f"schedule {kind}: B{j} before F{j} on stage {s}")
                start = max(dev_free[s], ready)
                end = start + (f_cost[s] if op == "F" else b_cost[s])
                dev_free[s] = end
                steps[s].append(Step(op, j, start, end))
                if op == "F":
                    f_done[s][j] = end
                    if s + 1 < k:
                        f_arrive[s + 1][j] = _send(transfers, link_f_free, s + 1, "F", j, end, l_cost[s + 1])
                    elif training:
                        b_arrive[s][j] = end
                elif s > 0:
                    b_arrive[s - 1][j] = _send(transfers, link_b_free, s, "B", j, end, l_cost[s])
                ptr[s] += 1
                progress = True
    if any(ptr[s] < len(orders[s]) for s in range(k)):
        raise RuntimeError(f"schedule {kind} deadlocked at steps {ptr}")  # a bug in step_order

    per_device = [f + b for f, b in zip(f_cost, b_cost, strict=True)]
    slowest = max(max(per_device), max(l_cost))
    makespan = max((st.end for row in steps for st in row), default=0.0)
    transfers.sort(key=lambda t: (t.start, t.link, t.kind, t.microbatch))
    return Timeline(
        kind=kind,
        microbatches=m,
        stages=tuple(tuple(row) for row in steps),
        transfers=tuple(transfers),
        makespan=makespan,
        steady_state_throughput_per_s=(1.0 / slowest) if slowest > 0 else math.inf,
    )


def _simulate_shared(fwd: list[float], link: list[float], m: int, workers: tuple[int, ...]) -> Timeline:
    """Inference through stages some of which share a worker (an interleaved split).

    Each stage still runs micro-batches in order, one step at a time; a worker runs one step at a time of
    all its stages.  Steps are placed in the order of their earliest possible start, ties going to the
    deeper stage (which drains the pipeline): a worker that falls idle takes the first step that can run
    on it, and never waits for a later one.  That order is safe because a step whose input is not yet
    placed cannot start before the step that will produce it.  The throughput bound is the busiest
    worker's time per micro-batch (all its stages' steps) or the slowest link.
    """
    k = len(fwd)
    arrive: list[list[float | None]] = [[None] * m for _ in range(k)]
    link_free = [0.0] * k
    transfers: list[Transfer] = []

    for j in range(m):
        arrive[0][j] = _send(transfers, link_free, 0, "F", j, 0.0, link[0])
    free: dict[int, float] = dict.fromkeys(workers, 0.0)
    nxt = [0] * k
    steps: list[list[Step]] = [[] for _ in range(k)]
    for _ in range(k * m):
        best: tuple[float, int] | None = None
        for s in range(k):
            j = nxt[s]
            ready = arrive[s][j] if j < m else None
            if ready is not None:
                key = (max(free[workers[s]], ready), -s)
                best = key if best is None or key < best else best
        if best is None:
            raise RuntimeError(f"shared-worker schedule deadlocked at steps {nxt}")  # cannot happen
        start, s = best[0], -best[1]
        j = nxt[s]
        end = start + fwd[s]
        free[workers[s]] = end
        steps[s].append(Step("F", j, start, end))
        if s + 1 < k:
            arrive[s + 1][j] = _send(transfers, link_free, s + 1, "F", j, end, link[s + 1])
        nxt[s] += 1
    load: dict[int, float] = dict.fromkeys(workers, 0.0)
    for s in range(k):
        load[workers[s]] += fwd[s]
    slowest = max(max(load.values()), max(link))
    transfers.sort(key=lambda t: (t.start, t.link, t.kind, t.microbatch))
    return Timeline(
        kind="stream",
        microbatches=m,
        stages=tuple(tuple(row) for row in steps),
        transfers=tuple(transfers),
        makespan=max((st.end for row in steps for st in row), default=0.0),
        steady_state_throughput_per_s=(1.0 / slowest) if slowest > 0 else math.inf,
        workers=workers,
    )


# --------------------------------------------------------------------------------------------------
# choosing a schedule and a micro-batch count


@dataclass(frozen=True)
class ScheduleOption:
    """One (schedule, M) candidate: its iteration time and per-stage memory against the caps."""

    kind: ScheduleKind
    microbatches: int
    microbatch_size: int
    iteration_seconds: float
    memory_bytes: tuple[float, ...]
    fits: bool


@dataclass(frozen=True)
class ScheduleChoice:
    """The fastest option that fits memory, its timeline, and every option considered (for the table)."""

    kind: ScheduleKind
    microbatches: int
    microbatch_size: int
    timeline: Timeline
    memory_bytes: tuple[float, ...]
    options: tuple[ScheduleOption, ...]


def divisors(n: int) -> tuple[int, ...]:
    """Micro-batch counts that split a batch of ``n`` evenly."""
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def choose_schedule(
    fwd: Sequence[float],
    bwd: Sequence[float] | None,
    link: Sequence[float],
    act_bytes_per_stage: Sequence[float],
    param_bytes_per_stage: Sequence[float],
    mem_caps: Sequence[float],
    *,
    kinds: Sequence[ScheduleKind] | None = None,
    microbatch_options: Sequence[int] | None = None,
    batch: int = 1,
    latency: Sequence[float] | None = None,
    step_overhead_s: float = 0.0,
    device_names: Sequence[str] | None = None,
) -> ScheduleChoice:
    """The schedule and micro-batch count M that minimize the time of one batch within every device's memory.

    Inputs are **per sample**: ``fwd[s]``, ``bwd[s]`` seconds, ``link[s]`` transfer seconds into stage ``s``
    (bytes / bandwidth), ``act_bytes_per_stage[s]`` activation bytes.  A batch of ``batch`` samples is split
    into M micro-batches of ``batch / M`` samples (M must divide ``batch``; by default every divisor is
    tried), so a step takes ``step_overhead_s + fwd[s] * batch / M`` and a transfer ``latency[s] +
    link[s] * batch / M``.  Those fixed costs are what make a middle M best: without them more micro-batches
    always shorten the batch (smaller bubble) and GPipe's memory does not depend on M while 1F1B's shrinks.

    ``kinds`` defaults to both training schedules when ``bwd`` is given, else to ``stream``.  Ties go to
    less memory, then fewer micro-batches.  When nothing fits, :class:`PartitionError` names, for the
    option that comes closest, every device that overflows and the memory it would need.
    """
    k = len(fwd)
    for name, seq in (
        ("link", link),
        ("act_bytes_per_stage", act_bytes_per_stage),
        ("param_bytes_per_stage", param_bytes_per_stage),
        ("mem_caps", mem_caps),
    ):
        if len(seq) != k:
            raise ValueError(f"{name} has {len(seq)} entries for {k} stages")
    if batch < 1:
        raise UsageError(f"batch must be at least 1, got {batch}")
    chosen_kinds: Sequence[ScheduleKind] = (
        kinds if kinds is not None else (TRAINING_KINDS if bwd else ("stream",))
    )
    if not chosen_kinds:
        raise UsageError("no schedule to choose from; give at least one of " + ", ".join(KINDS))
    for kd in chosen_kinds:
        if kd not in KINDS:
            raise UsageError(f"unknown schedule {kd!r}; choose one of {', '.join(KINDS)}")
        if kd != "stream" and bwd is None:
            raise UsageError(f"schedule {kd} is for training and needs backward times; use --schedule stream")
    options = tuple(microbatch_options) if microbatch_options is not None else divisors(batch)
    for m in options:
        if m < 1 or batch % m:
            raise UsageError(
                f"{m} micro-batches do not split a batch of {batch} evenly; "
                f"choose --microbatches from {', '.join(map(str, divisors(batch)))}"
            )
    lat = [float(x) for x in latency] if latency is not None else [0.0] * k
    names = list(device_names) if device_names is not None else [f"stage {s}" for s in range(k)]

    considered: list[ScheduleOption] = []
    timelines: dict[tuple[ScheduleKind, int], Timeline] = {}
    for kd in chosen_kinds:
        for m in options:
            size = batch // m
            f = [step_overhead_s + x * size for x in fwd]
            b = [step_overhead_s + x * size for x in bwd] if kd != "stream" and bwd is not None else None
            lk = [lat[s] + link[s] * size for s in range(k)]
            tl = simulate(kd, f, b, lk, m)
            mem = tuple(
                stage_memory(kd, s, k, m, act_bytes_per_stage[s] * size, param_bytes_per_stage[s])
                for s in range(k)
            )
            fits = all(x <= cap for x, cap in zip(mem, mem_caps, strict=True))
            considered.append(ScheduleOption(kd, m, size, tl.makespan, mem, fits))
            timelines[(kd, m)] = tl
    feasible = [o for o in considered if o.fits]
    if not feasible:
        closest = min(considered, key=lambda o: (_overflow(o.memory_bytes, mem_caps), o.iteration_seconds))
        over = [
            f"{names[s]} needs {closest.memory_bytes[s]:.0f} bytes but has {mem_caps[s]:.0f}"
            for s in range(k)
            if closest.memory_bytes[s] > mem_caps[s]
        ]
        raise PartitionError(
            f"no schedule fits device memory; closest is {closest.kind} with {closest.microbatches} "
            f"micro-batches, where {'; '.join(over)}; give those devices that much memory, allow more "
            "micro-batches or the 1f1b schedule, or use more stages"
        )
    best = min(
        feasible,
        key=lambda o: (o.iteration_seconds, max(o.memory_bytes, default=0.0), o.microbatches),
    )
    return ScheduleChoice(
        kind=best.kind,
        microbatches=best.microbatches,
        microbatch_size=best.microbatch_size,
        timeline=timelines[(best.kind, best.microbatches)],
        memory_bytes=best.memory_bytes,
        options=tuple(considered),
    )


def _overflow(mem: Sequence[float], caps: Sequence[float]) -> float:
    """Worst need over capacity across stages (how far an option is from fitting)."""
    worst = 0.0
    for need, cap in zip(mem, caps, strict=True):
        if need > cap:
            worst = max(worst, need / cap if cap > 0 else math.inf)
    return worst


# --------------------------------------------------------------------------------------------------
# reading a timeline back from a manifest


class _TimelineReader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, what: str) -> ManifestError:
        return ManifestError(f"{self.source}: {where}: {what}; re-run onnxpipe split")

    def obj(self, v: Any, where: str) -> Mapping[str, Any]:
        if not isinstance(v, dict):
            raise self.fail(where, "expected an object")
        return v

    def lst(self, v: Any, where: str) -> list[Any]:
        if not isinstance(v, list):
            raise self.fail(where, "expected a list")
        return v

    def key(self, o: Mapping[str, Any], key: str, where: str) -> Any:
        if key not in o:
            raise self.fail(f"{where}.{key}", "missing")
        return o[key]

    def num(self, v: Any, where: str) -> float:
        if v is None:
            return math.inf
        if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v):
            raise self.fail(where, "expected a number or null")
        return float(v)

    def int_(self, v: Any, where: str, minimum: int = 0) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self.fail(where, f"expected a whole number >= {minimum}")
        return v

    def step_kind(self, v: Any, where: str) -> StepKind:
        if v not in ("F", "B"):
            raise self.fail(where, 'expected "F" or "B"')
        return cast(StepKind, v)

    def timeline(self, value: Any, w: str) -> Timeline:
        o = self.obj(value, w)
        kind = self.key(o, "kind", w)
        if kind not in KINDS:
            raise self.fail(f"{w}.kind", f"expected one of {', '.join(KINDS)}, got {kind!r}")
        m = self.int_(self.key(o, "microbatches", w), f"{w}.microbatches", 1)
        stages: list[tuple[Step, ...]] = []
        workers: list[int | None] = []
        for s, d in enumerate(self.lst(self.key(o, "devices", w), f"{w}.devices")):
            dw = f"{w}.devices[{s}]"
            do = self.obj(d, dw)
            if self.int_(self.key(do, "stage", dw), f"{dw}.stage") != s:
                raise self.fail(f"{dw}.stage", f"expected {s} (devices are listed in stage order)")
            workers.append(None if do.get("worker") is None else self.int_(do["worker"], f"{dw}.worker"))
            if (workers[-1] is None) != (workers[0] is None):
                odd = s if workers[-1] is None else 0  # the first device that lacks one
                raise self.fail(f"{w}.devices[{odd}].worker", "give a worker for every stage or for none")
            row = []
            for i, raw in enumerate(self.lst(self.key(do, "steps", dw), f"{dw}.steps")):
                sw = f"{dw}.steps[{i}]"
                item = self.lst(raw, sw)
                if len(item) != 4:
                    raise self.fail(sw, "expected [kind, microbatch, start, end]")
                row.append(
                    Step(
                        self.step_kind(item[0], f"{sw}[0]"),
                        self.int_(item[1], f"{sw}[1]"),
                        self.num(item[2], f"{sw}[2]"),
                        self.num(item[3], f"{sw}[3]"),
                    )
                )
            stages.append(tuple(row))
        transfers = []
        for i, raw in enumerate(self.lst(o.get("transfers", []), f"{w}.transfers")):
            tw = f"{w}.transfers[{i}]"
            item = self.lst(raw, tw)
            if len(item) != 5:
                raise self.fail(tw, "expected [link, kind, microbatch, start, end]")
            transfers.append(
                Transfer(
                    self.int_(item[0], f"{tw}[0]"),
                    self.step_kind(item[1], f"{tw}[1]"),
                    self.int_(item[2], f"{tw}[2]"),
                    self.num(item[3], f"{tw}[3]"),
                    self.num(item[4], f"{tw}[4]"),
                )
            )
        return Timeline(
            kind=cast(ScheduleKind, kind),
            microbatches=m,
            stages=tuple(stages),
            transfers=tuple(transfers),
            makespan=self.num(self.key(o, "makespan_seconds", w), f"{w}.makespan_seconds"),
            steady_state_throughput_per_s=self.num(
                self.key(o, "steady_state_throughput_per_s", w), f"{w}.steady_state_throughput_per_s"
            ),
            workers=None if not workers or workers[0] is None else tuple(cast(list[int], workers)),
        )
