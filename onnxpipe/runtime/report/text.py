"""A run report as text for people: the stage table, the verdict lines, the baselines and memory."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from onnxpipe.core.options import opt
from onnxpipe.core.text import counted, human_bytes, table
from onnxpipe.runtime.report.model import RunReport, WorkerReport


def shapes_text(shapes: Mapping[str, Sequence[int]]) -> str:
    return ", ".join(f"{n}={'x'.join(str(d) for d in s)}" for n, s in shapes.items())


# --------------------------------------------------------------------------------------------------
# text


def _ms(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.2f}"


def _bytes(x: int | None) -> str:
    return "-" if x is None else human_bytes(x)


def versus_estimate(error: float | None) -> str:
    """A measured time against its estimate in words (``error`` is ``(est - meas) / meas``): ``2.4x
    slower``, ``6% faster``; a signed percentage of the measured time read as the opposite of what it
    said (``+411.6%`` for a stage that ran 5x faster than estimated)."""
    if error is None or error <= -1.0 or math.isnan(error):
        return "-"
    ratio = 1.0 / (1.0 + error)  # measured / estimated
    if ratio >= 1.5:
        return f"{ratio:.1f}x slower"
    if ratio <= 1 / 1.5:
        return f"{1 / ratio:.1f}x faster"
    if abs(ratio - 1.0) < 0.005:
        return "as estimated"
    return f"{abs(ratio - 1.0) * 100:.0f}% {'slower' if ratio > 1 else 'faster'}"


_WORKERS = {
    "threads": ("thread worker", None),
    "processes": ("worker process", "worker processes"),
    "ray": ("Ray actor", None),
}
"""What a backend's workers are called (``on 2 thread workers``, not ``on 2 threads workers``)."""


def workers_text(n: int, mode: str) -> str:
    """``2 thread workers``, ``1 worker process``, ``3 Ray actors``."""
    noun, plural = _WORKERS.get(mode, (f"{mode} worker", None))
    return counted(n, noun, plural)


def _stage_list(stages: Sequence[int]) -> str:
    return ", ".join(str(s) for s in stages)


def worker_line(worker: WorkerReport, *, bottleneck: bool = False) -> str:
    """One shared worker's stages summed, as :func:`format_report` prints it (``*``: the bottleneck)."""
    mark = " *" if bottleneck else ""
    err = "" if worker.estimate_error is None else f" ({versus_estimate(worker.estimate_error)} than est)"
    busy = "-" if math.isnan(worker.busy_fraction) else f"{worker.busy_fraction * 100:.0f}%"
    line = (
        f"worker {worker.index}{mark}: stages {_stage_list(worker.stages)}: "
        f"est {_ms(worker.estimated_ms)} ms, measured {_ms(worker.measured_ms)} ms{err}, "
        f"busy {busy}, weights {_bytes(worker.param_bytes)}"
    )
    if worker.model_rss_bytes is not None:
        line += f", model memory {human_bytes(worker.model_rss_bytes)}"
    return line


def format_report(report: RunReport) -> str:
    """The report as the CLI prints it: a stage table, the totals, then the baselines if any.

    Per-worker memory (peak RSS, model memory) is shown only where each worker has its own process;
    thread workers show their weights and the memory line says what can be compared.  Where stages share
    workers (an interleaved split), a line per worker after the table sums its stages (:func:`worker_line`)
    and the totals name the bottleneck worker as well as the busiest stage.
    """
    lines = [
        _stage_table(report),
        *(worker_line(w, bottleneck=w.index == report.bottleneck_worker) for w in report.workers),
        *_hop_lines(report),
        _totals_line(report),
        *_baseline_lines(report),
        *_recovery_lines(report),
    ]
    lines += [line for line in (_machine_line(report), memory_line(report)) if line]
    if report.outputs_match is not None:
        verdict = "match" if report.outputs_match else "DO NOT match"
        lines.append(
            f"outputs {verdict} the original model's (max rel diff {report.outputs_max_rel_diff or 0.0:.3g})"
        )
    lines.extend(f"note: {n}" for n in report.notes)
    return "\n".join(lines)


def _node_column(report: RunReport) -> tuple[str, list[str]] | None:
    """The stage table's node column, its header and a cell per stage (None for local workers).  Nodes
    of one machine's namespaces (or containers) share its host name, which then tells them apart no
    more: where their addresses do, the cells give the address and node id, the header the host."""
    nodes = [s.node for s in report.stages]
    on = [n for n in nodes if n is not None]
    if not on:
        return None
    hosts = {n.host for n in on}
    if len(hosts) == 1 and len(on) > 1 and len({n.address for n in on}) > 1:
        cells = [f"{n.address} {n.node_id[:8]}" if n else "-" for n in nodes]
        return f"node (address id, all on host {hosts.pop()})", cells
    return "node (host address id)", [f"{n.host} {n.address} {n.node_id[:8]}" if n else "-" for n in nodes]


def _stage_table(report: RunReport) -> str:
    shared = report.memory_shared
    nodes = _node_column(report)
    rows = []
    for i, s in enumerate(report.stages):
        mark = " *" if s.index == report.bottleneck_stage else ""
        place = s.worker.placement
        row = [
            f"{s.index}{mark}",
            s.worker.stage.file if s.worker.stage is not None else s.worker.label,
            f"{place.threads} @{','.join(str(c) for c in place.cpus)}" if place.cpus else str(place.threads),
            _ms(s.estimated_ms),
            _ms(s.measured_ms),
            versus_estimate(s.estimate_error),
            f"{s.busy_fraction * 100:.0f}%" if not math.isnan(s.busy_fraction) else "-",
            _bytes(s.param_bytes),
        ]
        if not shared:
            row += [_bytes(s.stats.peak_rss_bytes), _bytes(s.model_rss_bytes)]
        if nodes is not None:
            row += [nodes[1][i], _bytes(s.shipped_bytes)]
        rows.append(row)
    headers = ["stage", "file", "threads", "est ms", "measured ms", "measured vs est", "busy", "weights"]
    if not shared:
        headers += ["peak RSS", "model mem"]
    if nodes is not None:
        headers += [nodes[0], "shipped"]
    return table(headers, rows)


def _hop_lines(report: RunReport) -> list[str]:
    """The hops' table, the link that bounds the pipeline if one does (in words: its bytes, its time and
    rate, against the slowest stage's time), and the hops' overhead (on a cluster only)."""
    if not report.hops:
        return []
    rows = [
        [
            f"{h.source} -> {h.target}",
            _bytes(h.bytes_per_microbatch),
            _ms(h.single_ms),
            _ms(h.stream_ms),
        ]
        for h in report.hops
    ]
    lines = [table(["hop", "bytes/micro-batch", "one at a time ms", "in the stream ms"], rows)]
    bound = report.bounding_hop
    if bound is not None and bound.single_ms is not None:
        rate = bound.bytes_per_microbatch / (bound.single_ms / 1e3) * 8 / 1e6
        slowest = max(report.stages, key=lambda s: s.handling_ms)
        lines.append(
            f"link: {bound.source} -> {bound.target} bounds the pipeline: "
            f"{human_bytes(bound.bytes_per_microbatch)} a micro-batch take {bound.single_ms:.2f} ms on it "
            f"(about {rate:.0f} Mbit/s), longer than stage {slowest.index}'s {slowest.handling_ms:.2f} ms; "
            "a faster link, machines closer together, or a cut where fewer bytes cross makes it faster, "
            "more CPU does not"
        )
    if report.overhead_ms is not None:
        lines.append(
            f"overhead: one micro-batch at a time took {report.overhead_ms:.2f} ms beyond its stages' own "
            f"work ({_ms(report.hop_overhead_ms)} ms a hop)"
        )
    return lines


def _recovery_lines(report: RunReport) -> list[str]:
    """A line per lost actor brought back, and the failure that stopped the run, if one did."""
    lines = [
        f"recovered: {'stages' if len(r.stages) > 1 else 'stage'} {_stage_list(r.stages)} lost "
        f"{'its node' if r.node_lost else 'its actor on'} {r.lost.short}; running again on {r.now.short} "
        f"{r.seconds:.1f} s later, {r.replayed} micro-batch(es) sent again"
        for r in report.recoveries
    ]
    if report.failure is not None:
        lines.append(f"STOPPED after {report.microbatches} micro-batch(es): {report.failure}")
    return lines


def _totals_line(report: RunReport) -> str:
    """Micro-batches, throughput, latency and the bottleneck."""
    steady = (
        f"{report.steady_throughput_per_s:.2f}/s once full"
        if report.steady_throughput_per_s is not None
        else "too few for a steady rate"
    )
    sat = report.latency_saturated
    latency = (
        f"latency at saturation ({report.latency_in_flight} in flight) p50 {sat.p50_ms:.2f} ms, "
        f"p90 {sat.p90_ms:.2f} ms"
    )
    if report.latency_single is not None:
        one = report.latency_single
        latency += f"; one at a time p50 {one.p50_ms:.2f} ms, p90 {one.p90_ms:.2f} ms"
    if report.workers:
        on = f"{len(report.workers)} workers ({report.k} interleaved stages, {report.mode})"
        bottleneck = (
            f"bottleneck worker {report.bottleneck_worker} (*), busiest stage {report.bottleneck_stage} (*)"
        )
    else:
        on = workers_text(report.k, report.mode)
        bottleneck = f"bottleneck stage {report.bottleneck_stage} (*)"
    bound = report.bounding_hop
    if bound is not None:
        bottleneck = f"bottleneck the link {bound.source} -> {bound.target}"
    return (
        f"{report.microbatches} micro-batches ({shapes_text(report.input_shapes)}) on {on}: "
        f"{report.throughput_per_s:.2f}/s ({steady}); {latency}; {bottleneck}"
    )


def _baseline_lines(report: RunReport) -> list[str]:
    """The baselines' table, the verdict and the balanced ceiling (nothing without baselines)."""
    if not report.baselines:
        return []
    rows = [
        [
            name,
            b.description,
            f"{b.throughput_per_s:.2f}",
            f"{b.pipeline_speedup:.2f}x",
            _bytes(b.peak_rss_bytes),
        ]
        for name, b in report.baselines.items()
    ]
    lines = [table(["baseline", "how", "per s", "pipeline is", "peak RSS/worker"], rows), _verdict(report)]
    replicas = report.baselines.get("replicas")
    if replicas is not None and replicas.balanced_ceiling is not None:
        lines.append(
            "ceiling: at the speeds the replicas' CPUs ran (their own records), a perfectly balanced "
            f"pipeline on them would have reached about {replicas.balanced_ceiling:.2f}x the replicas "
            f"(this one: {replicas.pipeline_speedup:.2f}x)"
        )
    return lines


def _machine_line(report: RunReport) -> str | None:
    """How fast this machine ran against the one the estimates were made on, and the estimates' error at
    that speed."""
    slowdown = report.machine_slowdown
    if slowdown is None:
        return None
    if slowdown >= 1.005:
        speed = (
            f"{slowdown:.2f}x slower than when the estimates were made: other work kept the CPUs busy, or "
            "they ran at a lower clock"
        )
    elif slowdown <= 1 / 1.005:
        speed = f"{1 / slowdown:.2f}x faster than when the estimates were made: the machine was busier then"
    else:
        speed = "as fast as when the estimates were made"
    line = f"machine: the whole model on one thread ran {speed}"
    if report.estimate_max_error is not None and report.estimate_max_error_at_machine_speed is not None:
        line += (
            "; counting that, the estimates were off by up to "
            f"{report.estimate_max_error_at_machine_speed * 100:.1f}% "
            f"(not counting it: {report.estimate_max_error * 100:.1f}%)"
        )
    return line


def memory_line(report: RunReport) -> str | None:
    """What the memory numbers allow to say, like with like: a stage worker's model memory against a
    replica's, both measured in a fresh process of their own.

    Thread workers share one process, where what loading a session adds depends on what the allocator
    already holds; ``--compare`` then measures each stage in a short processes run
    (``worker_model_rss_bytes``).  Without those numbers, no ratio: only the stages' weights and peaks.
    Where stages share workers (an interleaved split), a worker's model memory and weights are its
    stages' together, and the largest worker's is compared.
    """
    replicas = report.baselines.get("replicas")
    workers = report.workers
    if replicas is not None and replicas.model_rss_bytes:
        ratio = _memory_ratio(report, replicas.model_rss_bytes)
        if ratio is not None:
            return f"{ratio} (a replica worker peaks at {_bytes(replicas.peak_rss_bytes)})"
    if not report.memory_shared:
        return None
    peaks = [p for p in [report.driver_peak_rss_bytes, *(s.stats.peak_rss_bytes for s in report.stages)] if p]
    weighed = [(weights, named) for named, _, weights in _workers_memory(report) if weights is not None]
    parts = []
    if weighed:
        each = ", ".join(f"{human_bytes(b)}{named}" for b, named in weighed)
        parts.append(f"{'worker' if workers else 'stage'} weights {each}")
    if peaks:
        parts.append(f"this process (every stage and the driver) peaked at {human_bytes(max(peaks))}")
    if replicas is not None and replicas.peak_rss_bytes:
        parts.append(f"one replica in its own process peaks at {human_bytes(replicas.peak_rss_bytes)}")
    return "memory: " + "; ".join(parts)


def _memory_ratio(report: RunReport, replica: int) -> str | None:
    """Each stage worker's model memory, or each shared worker's (its stages' together), against a
    replica's; None when none was measured.  Thread workers' were measured in a short run of their own:
    each stage in a process of its own, or each worker's stages in one (``hosted_with``)."""
    if report.workers:
        whose, largest = "a worker's model (its stages' together)", "worker"
        hosted = any(s.hosted_with for s in report.stages)
        alone = "each worker's stages in one process" if hosted else "each stage in a process of its own"
    else:
        whose, largest, alone = "a stage worker's model", "stage", "each in a process of its own"
    measured = [(m, named) for named, m, _ in _workers_memory(report) if m is not None]
    if not measured:
        return None
    where = f" ({alone}, a short run)" if report.memory_shared else ""
    most, named = max(measured, key=lambda m: m[0])
    each = ", ".join(f"{human_bytes(m)}{n}" for m, n in measured)
    return (
        f"memory: {whose} takes {each}, a replica's {human_bytes(replica)}{where}: the largest {largest}"
        f"{named} {most / replica:.2f}x a replica"
    )


def _workers_memory(report: RunReport) -> list[tuple[str, int | None, int | None]]:
    """Each worker's name in a line (`` (stages 0, 2)`` for one of shared stages, none for a stage's own
    worker), its model memory measured alone and its weights."""
    if report.workers:
        return [
            (f" (stages {_stage_list(w.stages)})", w.model_rss_bytes, w.param_bytes) for w in report.workers
        ]
    return [("", s.worker_model_rss_bytes, s.param_bytes) for s in report.stages]


def _verdict(report: RunReport) -> str:
    """One line on whether the pipeline was worth it: slower than a baseline says which, and by how much."""
    worst_name, worst = min(report.baselines.items(), key=lambda item: item[1].pipeline_speedup)
    if worst.pipeline_speedup >= 1.0:
        return f"verdict: the pipeline is faster than every baseline (at least {worst.pipeline_speedup:.2f}x)"
    if len(report.stages) == 1:  # nothing runs at once: what is left to see is the runner's own cost
        return (
            f"verdict: one stage, so nothing runs at once; the runner's hand-offs make it "
            f"{worst.pipeline_speedup:.2f}x the throughput of {worst_name} ({worst.description}): serve "
            "this model as one session here, and split it where it must fit several devices"
        )
    slower = (
        f"verdict: the pipeline is SLOWER than {worst_name} ({worst.description}): "
        f"{worst.pipeline_speedup:.2f}x its throughput"
    )
    bound = report.bounding_hop
    if bound is not None:
        return f"{slower}, bounded by the link from {bound.source} to {bound.target} (above)"
    return (
        f"{slower}; run that instead here, or give the stages CPUs of their own (fewer stages, "
        f"{opt('threads')}, more machines)"
    )
