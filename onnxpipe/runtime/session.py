"""The work of one worker, whatever runs it (a thread, a process, a Ray actor): open the stage on its
runtime (an onnxruntime session, or an OpenVINO or tract engine: :mod:`onnxpipe.core.runtimes`), run one
micro-batch, say precisely what failed, and keep timing records.

Failures are raised as :class:`StageFailure` with a one-line message naming the stage, the micro-batch,
the node and the tensor at fault; the backends carry that text to the caller, who raises it as
:class:`onnxpipe.core.errors.RuntimeStageError`.
"""

from __future__ import annotations

import os
import re
import resource
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from onnxpipe.core.errors import UsageError, error_line
from onnxpipe.core.runtimes import Engine, open_engine, runs_here
from onnxpipe.runtime.affinity import pinned
from onnxpipe.runtime.kvstate import CONTROL, Control, KVState, NoCache, StepFlags
from onnxpipe.runtime.spec import WorkerSpec
from onnxpipe.runtime.trips import NodePlace

MAX_RECORDS = 1 << 16
"""Timing records a worker keeps (the most recent ones): bounded, so a long-running server does not grow."""

_NOTHING = np.zeros(0, dtype=np.float32)
"""What a dropped generation step sends in place of the tensors its stage would have made."""

_NODE_NAME = re.compile(r"running (\w+) node\. Name:'([^']*)'")


class StageFailure(Exception):
    """A stage could not load or run; the message is the complete one-line explanation."""


class CacheMissing(StageFailure):
    """A generation step reached a worker that holds no cache of one of its sequences (a worker started
    again after its node died holds none)."""


@dataclass(frozen=True)
class Record:
    """One micro-batch at one worker (``time.perf_counter`` seconds in that worker's process).

    ``received``: the worker took it; ``run_start``/``run_end``: the session ran; ``out_ready``: a free
    slot downstream was available (waiting for it is backpressure, not work); ``done``: sent on.
    """

    seq: int
    received: float
    run_start: float
    run_end: float
    out_ready: float
    done: float

    @property
    def run_seconds(self) -> float:
        return self.run_end - self.run_start

    @property
    def busy_seconds(self) -> float:
        return (self.run_end - self.received) + (self.done - self.out_ready)


@dataclass(frozen=True)
class MemorySnapshot:
    """A process's resident memory now, its peak, and its shared memory (None where not read)."""

    rss_bytes: int | None
    peak_rss_bytes: int | None
    shared_memory_bytes: int | None


def memory_snapshot(*, shared: bool = False) -> MemorySnapshot:
    """The process's memory, read once (``shared``: a process shared with other workers, whose shared
    memory is not a worker's own)."""
    return MemorySnapshot(current_rss_bytes(), peak_rss_bytes(), None if shared else _status_kib("RssShmem"))


@dataclass(frozen=True)
class WorkerStats:
    """What a worker measured since it started or since its stats were last reset."""

    index: int
    label: str
    records: tuple[Record, ...]
    pid: int | None
    load_seconds: float
    startup_rss_bytes: int | None
    rss_bytes: int | None
    peak_rss_bytes: int | None
    process_shared: bool = False
    """True when the worker shares its process with others (threads): the memory is the process's."""
    load_rss_bytes: int | None = None
    """How much the process's resident memory grew while this worker's session loaded."""
    shared_memory_bytes: int | None = None
    """Shared memory resident in the worker now (``RssShmem``): its channels' slots, which a worker
    process touches and counts in its peak, but which are the channel's, not the model's."""
    hosted_with: tuple[int, ...] = ()
    """The stages (this one among them) whose sessions one worker process hosts: an interleaved split's
    worker.  Empty when the worker process runs this stage alone.  Its memory is then the worker's."""
    node: NodePlace | None = None
    """The cluster node the worker ran on (Ray); None for a worker of this machine."""

    @property
    def model_rss_bytes(self) -> int | None:
        """Memory the worker's model costs: its peak less its memory before loading and less its
        channels' shared memory when the worker has its process to itself (a process hosting several
        stages, :attr:`hosted_with`, gives the same figure for each: all its models' together), else the
        growth while its session loaded."""
        if self.process_shared:
            return self.load_rss_bytes
        if self.peak_rss_bytes is None or self.startup_rss_bytes is None:
            return None
        return max(0, self.peak_rss_bytes - self.startup_rss_bytes - (self.shared_memory_bytes or 0))


def _open(spec: WorkerSpec) -> Engine:
    """The engine of ``spec`` on its placement's runtime, its threads pinned to the worker's CPUs."""
    place = spec.placement
    if place.kind.takes_provider and not runs_here(place):
        available = ort.get_available_providers()
        raise StageFailure(
            f"{spec.label}: provider {place.provider} (device {spec.device!r}) is not available in "
            f"this onnxruntime on {os.uname().nodename} (it has {', '.join(available)}); install the "
            "matching onnxruntime package there or run the stage on another device"
        )
    try:
        with pinned(place.cpus):  # the runtime's intra-op threads inherit the worker's CPUs
            return open_engine(
                spec.path,
                place,
                fail=lambda e: StageFailure(
                    f"{spec.label}: does not load in {place.label} ({error_line(e)}); run it on another "
                    "runtime or re-run onnxpipe split"
                ),
            )
    except OSError as e:  # pinned(): CPUs this process may not use (or that do not exist)
        raise StageFailure(pin_failure(spec, e)) from e
    except UsageError as e:  # the runtime's package is missing: the line names the extra
        raise StageFailure(f"{spec.label}: {e}") from e


class StageRunner:
    """The engine of one worker spec (an onnxruntime session unless the placement names another
    runtime), and the bookkeeping around running it."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        start = time.perf_counter()
        rss_before = current_rss_bytes()
        place = spec.placement
        self.engine = _open(spec)
        self.load_seconds = time.perf_counter() - start
        rss_after = current_rss_bytes()
        self.load_rss_bytes = (
            rss_after - rss_before if rss_after is not None and rss_before is not None else None
        )
        self.records: deque[Record] = deque(maxlen=MAX_RECORDS)
        """The worker's timing records, bounded to the last :data:`MAX_RECORDS`."""
        self.kv: KVState | None = None
        """A generating worker's caches (:mod:`onnxpipe.runtime.kvstate`)."""
        if spec.generating:
            # OpenVINO's outputs may live in its infer request's buffers, which the next step reuses
            self.kv = KVState(spec.caches, copy=not place.kind.owns_outputs)

    def run(self, seq: int, received: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The tensors to send on, for micro-batch ``seq`` whose received tensors are ``received``."""
        spec = self.spec
        control: Control | None = None
        cached: dict[str, np.ndarray] = {}
        if self.kv is not None:
            control = Control.read(received[CONTROL])
            if all(r.flags & StepFlags.DROP for r in control.rows):  # ended early: nothing runs
                self.kv.drop(control)
                return {n: received.get(n, _NOTHING) for n in spec.sends}
            try:
                cached = self.kv.feeds(control)
            except NoCache as e:
                raise CacheMissing(f"{spec.label}: micro-batch {seq}: {e.args[0]}") from None
        try:
            feeds = {n: cached[n] if n in cached else received[n] for n in spec.inputs}
        except KeyError as e:
            raise StageFailure(
                f"{spec.label}: micro-batch {seq} lacks tensor {e.args[0]!r}; the upstream worker did not "
                "send it (a manifest out of step with its stage files?)"
            ) from None
        try:
            # a stage of dead-end nodes has no outputs; onnxruntime refuses to run for none
            results = self.engine.run(list(spec.outputs), feeds) if spec.outputs else []
        except Exception as e:
            raise StageFailure(describe_failure(spec, seq, feeds, e)) from e
        produced = dict(zip(spec.outputs, results, strict=True))
        if self.kv is not None and control is not None:
            self.kv.keep(control, produced)
        return {n: produced[n] if n in produced else received[n] for n in spec.sends}

    def stats(
        self,
        *,
        pid: int | None,
        startup_rss: int | None,
        shared: bool = False,
        hosted_with: tuple[int, ...] = (),
        memory: MemorySnapshot | None = None,
    ) -> WorkerStats:
        """This worker's stats; ``memory``: the process's memory read once for all the stages it hosts
        (read apart, a page touched between two reads made one worker report two model sizes)."""
        mem = memory if memory is not None else memory_snapshot(shared=shared)
        return WorkerStats(
            index=self.spec.index,
            label=self.spec.label,
            records=tuple(self.records),
            pid=pid,
            load_seconds=self.load_seconds,
            startup_rss_bytes=startup_rss,
            rss_bytes=mem.rss_bytes,
            peak_rss_bytes=mem.peak_rss_bytes,
            process_shared=shared,
            shared_memory_bytes=mem.shared_memory_bytes,
            load_rss_bytes=self.load_rss_bytes,
            hosted_with=hosted_with,
        )


def pin_failure(spec: WorkerSpec, e: OSError) -> str:
    """One line for a worker that cannot be pinned to its placement's CPUs."""
    return (
        f"{spec.label}: cannot pin to CPUs {list(spec.placement.cpus)} ({e.strerror or e}); give CPUs this "
        "process may use (os.sched_getaffinity(0)), or none"
    )


def describe_failure(spec: WorkerSpec, seq: int, feeds: Mapping[str, np.ndarray], e: BaseException) -> str:
    """One line: stage, micro-batch, node and tensor at fault (when onnxruntime names them), the inputs."""
    text = error_line(e)
    where = ""
    m = _NODE_NAME.search(text)
    if m:
        op, node = m.group(1), m.group(2)
        outs = node_outputs(spec.path, node)
        shown = f" (output {', '.join(repr(o) for o in outs)})" if outs else ""
        where = f" at {op} node {node!r}{shown}"
    else:
        named = [n for n in feeds if f"input: {n} " in text or f"'{n}'" in text or f" {n} " in text]
        if named:
            where = f" on input tensor {named[0]!r}"
    shapes = ", ".join(f"{n} {_describe_value(v)}" for n, v in feeds.items())
    return f"{spec.label} failed on micro-batch {seq}{where}: {text} [inputs: {shapes}]"


def node_outputs(path: str, node_name: str) -> list[str]:
    """Output tensor names of the node called ``node_name`` in the model at ``path`` (empty if unknown)."""
    try:
        import onnx

        graph = onnx.load(path, load_external_data=False).graph
    except Exception:  # noqa: BLE001 - best effort while reporting another error
        return []
    for node in graph.node:
        if node.name == node_name:
            return [o for o in node.output if o]
    return []


def _describe_value(v: object) -> str:
    """An array's dtype and shape; else the value's type: a stage's input may be an ONNX sequence (a
    list), a map or an absent optional (None), which travel between the stages as they are."""
    if isinstance(v, np.ndarray):
        return f"{v.dtype}[{','.join(str(d) for d in v.shape)}]"
    return type(v).__name__


# --------------------------------------------------------------------------------------------------
# memory


def _status_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_rss_bytes() -> int | None:
    """Peak resident memory of this process (VmHWM; ``getrusage`` where /proc is missing)."""
    value = _status_kib("VmHWM")
    if value is not None:
        return value
    try:
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (OSError, ValueError):
        return None
    return int(maxrss) * (1 if os.uname().sysname == "Darwin" else 1024)


def current_rss_bytes() -> int | None:
    """Resident memory of this process now (VmRSS), or ``None`` where /proc is missing."""
    return _status_kib("VmRSS")
