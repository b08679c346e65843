"""Pipeline schedules and their simulation: in which order each device runs its steps, and when.

The partitioner balances per-micro-batch costs; how long a whole batch takes, and how many micro-batches
each stage holds while it runs, depends on the *schedule*: in which order each device runs the forward (F) and
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

import heapq
import math
from collections.abc import Sequence

from onnxpipe.core.choices import ScheduleKind, choice
from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt
from onnxpipe.schedule.timeline import DEFAULT_MICROBATCHES, Step, StepKind, Timeline, Transfer

# --------------------------------------------------------------------------------------------------
# step orders


def step_order(kind: ScheduleKind, stage: int, k: int, microbatches: int) -> tuple[tuple[StepKind, int], ...]:
    """The order in which device ``stage`` (of ``k``) runs its steps under ``kind``."""
    m = microbatches
    fwd: list[tuple[StepKind, int]] = [("F", j) for j in range(m)]
    if kind == ScheduleKind.STREAM:
        return tuple(fwd)
    bwd: list[tuple[StepKind, int]] = [("B", j) for j in range(m)]
    if kind == ScheduleKind.GPIPE:
        return tuple(fwd + bwd)
    w = min(k - stage - 1, m)  # 1F1B
    order = fwd[:w]
    for i in range(m - w):
        order += [fwd[w + i], bwd[i]]
    order += bwd[m - w :]
    return tuple(order)


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
    if kind == ScheduleKind.STREAM:
        return 1
    if kind == ScheduleKind.GPIPE:
        return microbatches
    return min(microbatches, k - stage)  # 1F1B


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
    ``workers[s]``: the device that runs stage ``s`` when stages share devices (``stream`` only: an
    interleaved split); ``None``: a device per stage.
    """
    kind = choice(ScheduleKind, kind, "ScheduleRequest.kind")
    if microbatches < 1:
        raise UsageError(
            f"need at least one micro-batch, got {microbatches}; choose {opt('microbatches')} 1 or more"
        )
    k = len(fwd)
    if k < 1:
        raise ValueError("simulate needs at least one stage")
    if len(link) != k:
        raise ValueError(f"link has {len(link)} entries for {k} stages (link[0] is the source's link)")
    if kind.training:
        if bwd is None:
            raise ValueError(f"schedule {kind!r} needs backward times")
        if len(bwd) != k:
            raise ValueError(f"bwd has {len(bwd)} entries for {k} stages")
    b_cost = [float(x) for x in bwd] if kind.training and bwd is not None else [0.0] * k
    f_cost = [float(x) for x in fwd]
    l_cost = [float(x) for x in link]
    for name, seq in (("fwd", f_cost), ("bwd", b_cost), ("link", l_cost)):
        if any(not (math.isfinite(x) and x >= 0) for x in seq):
            raise ValueError(f"{name} times must be finite and non-negative: {seq}")
    if workers is None:
        return _simulate(kind, f_cost, b_cost, l_cost, microbatches, None)
    if kind.training:
        raise UsageError(f"schedule {kind!r}: stages that share a worker are planned for inference only")
    if len(workers) != k or any(w < 0 for w in workers):
        raise ValueError(f"workers must give each of the {k} stages a worker index >= 0: {list(workers)}")
    return _simulate(kind, f_cost, b_cost, l_cost, microbatches, tuple(int(w) for w in workers))


def _simulate(
    kind: ScheduleKind,
    f_cost: list[float],
    b_cost: list[float],
    l_cost: list[float],
    m: int,
    workers: tuple[int, ...] | None,
) -> Timeline:
    """Each stage runs its steps in :func:`step_order`, one at a time on its worker (``workers[s]``, else
    a worker of its own), each as soon as its input is there and its worker is free.

    Steps are placed in the order of their earliest possible start, ties going to the deeper stage (which
    drains the pipeline): a worker that falls idle takes the first step that can run on it, and never
    waits for a later one.  That order is safe because a step whose input is not yet placed cannot start
    before the step that will produce it; with a worker per stage it changes no time.  The throughput
    bound is the busiest worker's time per micro-batch (all its stages' steps) or the slowest link.
    """
    k = len(f_cost)
    worker = workers or tuple(range(k))
    orders = [step_order(kind, s, k, m) for s in range(k)]
    f_arrive: list[list[float | None]] = [[None] * m for _ in range(k)]
    b_arrive: list[list[float | None]] = [[None] * m for _ in range(k)]
    transfers: list[Transfer] = []
    link_f_free = [0.0] * k  # link s (stage s-1 -> s), forward direction
    link_b_free = [0.0] * k  # link s, backward direction (stage s -> s-1)
    for j in range(m):  # the source sends the model inputs one micro-batch after another
        f_arrive[0][j] = _send(transfers, link_f_free, 0, "F", j, 0.0, l_cost[0])
    steps: list[list[Step]] = [[] for _ in range(k)]
    ptr = [0] * k
    free: dict[int, float] = dict.fromkeys(worker, 0.0)

    def start_of(s: int) -> float | None:
        """When stage ``s``'s next step could start, None while its input is not there."""
        if ptr[s] == len(orders[s]):
            return None
        op, j = orders[s][ptr[s]]
        ready = f_arrive[s][j] if op == "F" else b_arrive[s][j]
        return None if ready is None else max(free[worker[s]], ready)

    # each stage has one entry in the heap, at the start its next step had when queued: a start only
    # grows (its worker got busier), so an entry whose start still holds is the earliest
    queued: list[float | None] = [None] * k
    heap: list[tuple[float, int]] = []

    def queue(s: int) -> None:
        when = start_of(s)
        if when is not None and when != queued[s]:
            queued[s] = when
            heapq.heappush(heap, (when, -s))

    for s in range(k):
        queue(s)
    while heap:
        start, s = heapq.heappop(heap)
        s = -s
        if start != queued[s]:  # an entry a later one replaced
            continue
        queued[s] = None
        if start_of(s) != start:  # its worker got busier: wait again
            queue(s)
            continue
        op, j = orders[s][ptr[s]]
        end = start + (f_cost[s] if op == "F" else b_cost[s])
        free[worker[s]] = end
        steps[s].append(Step(op, j, start, end))
        if op == "F":
            if s + 1 < k:
                f_arrive[s + 1][j] = _send(transfers, link_f_free, s + 1, "F", j, end, l_cost[s + 1])
            elif kind.training:  # the loss is computed here: the backward may follow at once
                b_arrive[s][j] = end
        elif s > 0:
            b_arrive[s - 1][j] = _send(transfers, link_b_free, s, "B", j, end, l_cost[s])
        ptr[s] += 1
        for t in range(max(0, s - 1), min(k, s + 2)):  # this stage and the neighbours it fed
            queue(t)
    if any(ptr[s] < len(orders[s]) for s in range(k)):
        raise RuntimeError(f"schedule {kind} deadlocked at steps {ptr}")  # a bug in step_order
    load = {w: sum(f_cost[s] + b_cost[s] for s in range(k) if worker[s] == w) for w in set(worker)}
    slowest = max(max(load.values()), max(l_cost))
    return _timeline(kind, m, steps, transfers, slowest, workers)


def _timeline(
    kind: ScheduleKind,
    m: int,
    steps: list[list[Step]],
    transfers: list[Transfer],
    slowest: float,
    workers: tuple[int, ...] | None = None,
) -> Timeline:
    """The simulated steps as a :class:`Timeline`; ``slowest``: the seconds per micro-batch of the
    slowest resource (a device, a worker or a link), which bounds the throughput."""
    transfers.sort(key=lambda t: (t.start, t.link, t.kind, t.microbatch))
    return Timeline(
        kind=kind,
        microbatches=m,
        stages=tuple(tuple(row) for row in steps),
        transfers=tuple(transfers),
        makespan=max((st.end for row in steps for st in row), default=0.0),
        steady_state_throughput_per_s=(1.0 / slowest) if slowest > 0 else math.inf,
        workers=workers,
    )


def stream(
    compute: Sequence[float],
    microbatches: int = DEFAULT_MICROBATCHES,
    *,
    link: Sequence[float] | None = None,
    workers: Sequence[int] | None = None,
) -> Timeline:
    """The streaming timeline of stages whose micro-batch takes ``compute[s]``, over free links unless
    ``link`` says what each costs; ``workers`` as :func:`simulate` takes them."""
    links = list(link) if link is not None else [0.0] * len(compute)
    return simulate(ScheduleKind.STREAM, compute, None, links, microbatches, workers)
