"""Baselines for ``onnxpipe run --compare``: the original model run without a pipeline.

* ``session_1_thread``: one onnxruntime session with one intra-op thread, micro-batches one after
  another in this process;
* ``session_total_threads``: the same with as many threads as all the stages together;
* ``replicas``: K copies of the whole model, one worker process each with a stage's threads, fed in turn
  (data parallel), so that each replica's memory is measured too.

The sessions run in this process with no inter-process traffic at all: the strongest form of each
baseline, not a strawman.  :func:`compare_outputs` checks that the pipeline computed what the model does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from onnxpipe.errors import RuntimeStageError
from onnxpipe.ortsession import open_session, session_options
from onnxpipe.runtime.pipeline import Pipeline, make_backend
from onnxpipe.runtime.report import BaselineReport, Measurement, RunReport, measure
from onnxpipe.runtime.session import first_line
from onnxpipe.runtime.spec import Placement, model_spec
from onnxpipe.verification import DEFAULT_ATOL, DEFAULT_RTOL, compare

Feeds = Mapping[str, np.ndarray]


def session_throughput(
    model: Path, inputs: Sequence[Feeds], *, threads: int, warmup: int
) -> tuple[float, list[dict[str, np.ndarray]]]:
    """Micro-batches per second of one session with ``threads`` intra-op threads, and its outputs."""
    session = open_session(
        model,
        session_options(threads=threads),
        fail=lambda e: RuntimeStageError(f"{model}: the original model does not load ({first_line(e)})"),
    )
    names = [o.name for o in session.get_outputs()]
    for j in range(warmup):
        session.run(names, dict(inputs[j % len(inputs)]))
    outputs: list[dict[str, np.ndarray]] = []
    start = time.perf_counter()
    for feeds in inputs:
        outputs.append(dict(zip(names, session.run(names, dict(feeds)), strict=True)))
    wall = time.perf_counter() - start
    return (len(inputs) / wall if wall > 0 else math.inf), outputs


def replicas_measurement(
    model: Path,
    inputs: Sequence[Feeds],
    *,
    pipeline: Pipeline,
    replicas: int,
    threads: int,
    warmup: int,
) -> Measurement:
    """Run ``inputs`` through ``replicas`` one-worker lanes of the whole model."""
    lanes = [
        [
            model_spec(
                model,
                pipeline.input_names,
                pipeline.output_names,
                Placement(threads=threads),
                index=i,
            )
        ]
        for i in range(replicas)
    ]
    backend = make_backend(lanes, backend="local", mode="processes")
    with Pipeline(
        backend, input_types=pipeline.input_types, output_names=pipeline.output_names, lanes=lanes
    ) as data_parallel:
        return measure(data_parallel, inputs, warmup=warmup)


def compare_outputs(
    expected: Sequence[Mapping[str, np.ndarray]], actual: Sequence[Mapping[str, np.ndarray]]
) -> tuple[bool, float]:
    """Whether every output of ``actual`` matches ``expected`` (verify's tolerance); the worst rel diff."""
    ok = len(expected) == len(actual)
    worst = 0.0
    for e, a in zip(expected, actual, strict=False):
        for name, value in e.items():
            if name not in a:
                return False, math.inf
            c = compare(name, value, a[name], rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL)
            ok = ok and c.ok
            worst = max(worst, c.max_rel_diff)
    return ok, worst


def add_baselines(
    report: RunReport,
    pipeline: Pipeline,
    measurement: Measurement,
    model: Path,
    inputs: Sequence[Feeds],
    *,
    warmup: int,
) -> RunReport:
    """``report`` with the three baselines, the output check and the memory comparison added."""
    stage_threads = [s.placement.threads for s in pipeline.lanes[0]]
    total = sum(stage_threads)
    pipe_tp = report.throughput_per_s
    baselines: dict[str, BaselineReport] = {}

    tp1, expected = session_throughput(model, inputs, threads=1, warmup=warmup)
    baselines["session_1_thread"] = BaselineReport(
        "session_1_thread", "one session, 1 thread", 1, 1, tp1, pipe_tp / tp1
    )
    if total > 1:
        tpn, _ = session_throughput(model, inputs, threads=total, warmup=warmup)
        baselines["session_total_threads"] = BaselineReport(
            "session_total_threads", f"one session, {total} threads", 1, total, tpn, pipe_tp / tpn
        )
    k = len(stage_threads)
    # replicas always get their own processes, so that a replica's memory is measured
    rep = replicas_measurement(
        model, inputs, pipeline=pipeline, replicas=k, threads=max(stage_threads), warmup=warmup
    )
    peaks = [s.peak_rss_bytes for s in rep.stats if s.peak_rss_bytes is not None]
    model_mem = [m for m in (s.model_rss_bytes for s in rep.stats) if m is not None]
    load_mem = [m for m in (s.load_rss_bytes for s in rep.stats) if m is not None]
    baselines["replicas"] = BaselineReport(
        "replicas",
        f"{k} replicas of the model, {max(stage_threads)} thread(s) each",
        k,
        max(stage_threads),
        rep.throughput_per_s,
        pipe_tp / rep.throughput_per_s,
        peak_rss_bytes=max(peaks) if peaks else None,
        model_rss_bytes=max(model_mem) if model_mem else None,
        load_rss_bytes=max(load_mem) if load_mem else None,
    )
    ok, worst = compare_outputs(expected, measurement.outputs)
    return replace(report, baselines=baselines, outputs_match=ok, outputs_max_rel_diff=worst)
