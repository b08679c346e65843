"""onnxruntime sessions for :mod:`onnxpipe.cost.measure`: the timing run and its trace, the optimized graph
onnxruntime saves, and runs at ``ORT_DISABLE_ALL`` that expose chosen tensors as outputs."""

from __future__ import annotations

import bisect
import contextlib
import json
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from onnxpipe.core.errors import ProfileError, error_line
from onnxpipe.core.options import opt
from onnxpipe.core.ortsession import OptimizationLevel, open_session, session_options
from onnxpipe.core.progress import Progress
from onnxpipe.ir.external import holds_external
from onnxpipe.ir.model import ModelView, set_items, subgraph_outer_reads


@dataclass
class Timing:
    optimized: onnx.ModelProto
    optimized_dir: Path
    node_seconds: dict[str, float]
    """Per optimized node, scaled to the unprofiled total."""
    output_bytes: dict[str, int]
    total_seconds: float
    foreign_seconds: float
    foreign_names: list[str]


DEFAULT_HINT = f"give the shapes the model expects with {opt('shapes', 'NAME=D1,D2,...')}"


class OrtModel:
    """The view's model for onnxruntime: its (renamed) graph, with external data read from ``base_dir``.

    Sessions are configured by :func:`onnxpipe.core.ortsession.session_options`, the one place that sets
    onnxpipe's session settings, so the profiled session runs as the stages will; only the profiler's
    own needs (trace, saved optimized graph, silent log) are added here.
    """

    def __init__(
        self, view: ModelView, tmp: Path, label: str, threads: int, hint: str = DEFAULT_HINT
    ) -> None:
        self.view = view
        self.tmp = tmp
        self.label = label
        self.threads = threads
        self.hint = hint
        """What a failed run's message tells the user to do (the guessed dims, or the inputs given)."""

    def options(
        self,
        level: OptimizationLevel,
        *,
        threads: int | None,
        external_dir: Path | None,
        trace: bool = False,
        save_as: str | None = None,
    ) -> ort.SessionOptions:
        """Options at onnxpipe's settings; ``trace``: profile into ``tmp``; ``save_as``: save the optimized
        graph as ``tmp/<save_as>.onnx``, weights over 1 KiB in ``<save_as>.data`` beside it."""
        config = (
            {
                "session.optimized_model_external_initializers_file_name": f"{save_as}.data",
                "session.optimized_model_external_initializers_min_size_in_bytes": "1024",
            }
            if save_as is not None
            else None
        )
        return session_options(
            level=level,
            threads=threads,
            log_severity=4,  # errors reach the user as one ProfileError line, not ORT's log
            external_dir=external_dir,
            config=config,
            profile_prefix=self.tmp / "trace" if trace else None,
            optimized_path=self.tmp / f"{save_as}.onnx" if save_as is not None else None,
        )

    def session(self, model: bytes, so: ort.SessionOptions, what: str) -> ort.InferenceSession:
        def fail(e: Exception) -> ProfileError:
            return ProfileError(
                f"{self.label}: onnxruntime cannot load {what} ({error_line(e)}); make sure onnxruntime "
                "supports its ops and opset and finds its external weight files, or use "
                f"{opt('cost', 'static')}"
            )

        return open_session(model, so, fail=fail)

    def run(self, sess: ort.InferenceSession, feeds: Mapping[str, np.ndarray], what: str) -> Any:
        names = {i.name for i in sess.get_inputs()}
        try:
            return sess.run(None, {k: v for k, v in feeds.items() if k in names})
        except Exception as e:
            shapes = ", ".join(f"{k}={list(np.shape(v))}" for k, v in feeds.items())
            raise ProfileError(
                f"{self.label}: onnxruntime failed running {what} ({error_line(e)}) with inputs {shapes}; "
                f"{self.hint}"
            ) from e

    def save_optimized(self, model: bytes, stem: str, what: str) -> onnx.ModelProto:
        """Optimize at ENABLE_ALL and return the optimized graph (weights left in ``tmp``)."""
        so = self.options(
            "ORT_ENABLE_ALL", threads=self.threads, external_dir=self.view.base_dir, save_as=stem
        )
        sess = self.session(model, so, what)
        del sess
        return self._load_saved(stem)

    def _load_saved(self, stem: str) -> onnx.ModelProto:
        path = self.tmp / f"{stem}.onnx"
        try:
            return onnx.load(str(path), load_external_data=False)
        except Exception as e:
            raise ProfileError(
                f"{self.label}: onnxruntime did not save its optimized graph ({error_line(e)}); "
                f"use {opt('cost', 'static')} for this model"
            ) from e

    def measure(self, samples: Sequence[Mapping[str, Any]], warmup: int, runs: int, bar: Progress) -> Timing:
        """Time ``warmup + runs`` profiled runs and ``runs`` plain ones, feeding the samples in turn (so
        that the medians come from all of them)."""
        so = self.options(
            "ORT_ENABLE_ALL",
            threads=self.threads,
            external_dir=self.view.base_dir,
            trace=True,
            save_as="optimized",
        )
        if self.view.base_dir is None and holds_external(self.view.proto):
            raise ProfileError(
                f"{self.label}: its weights are in external files but the model was not loaded from a file; "
                "load it with onnxpipe.load_model(path)"
            )
        sess = self.session(self.view.proto.SerializeToString(), so, "the model")
        for i in range(warmup + runs):
            self.run(sess, samples[i % len(samples)], "the model")
            bar.advance()
        trace = sess.end_profiling()
        walls: list[float] = []
        for i in range(runs):
            feeds = samples[i % len(samples)]
            start = time.perf_counter()
            self.run(sess, feeds, "the model")
            walls.append(time.perf_counter() - start)
            bar.advance()
        del sess
        total = statistics.median(walls)
        optimized = self._load_saved("optimized")
        events = json.loads(Path(trace).read_text(encoding="utf-8"))
        medians, output_bytes = node_medians(events, runs)
        top = {n.name for n in optimized.graph.node}
        foreign = sorted(n for n in medians if n not in top)
        foreign_us = sum(medians[n] for n in foreign)
        kept = {n: us for n, us in medians.items() if n in top}
        measured = sum(kept.values())
        scale = total / (measured * 1e-6) if measured > 0 else 0.0
        return Timing(
            optimized=optimized,
            optimized_dir=self.tmp,
            node_seconds={n: us * 1e-6 * scale for n, us in kept.items()},
            output_bytes=output_bytes,
            total_seconds=total,
            foreign_seconds=foreign_us * 1e-6 * scale,
            foreign_names=foreign,
        )


def node_medians(events: Sequence[Mapping[str, Any]], runs: int) -> tuple[dict[str, float], dict[str, int]]:
    """Median per-node kernel time (us) over the last ``runs`` model runs, and each node's output bytes."""
    spans = sorted(
        (int(e["ts"]), int(e["ts"]) + int(e["dur"]))
        for e in events
        if e.get("cat") == "Session" and e.get("name") == "model_run"
    )[-runs:]
    starts = [s for s, _ in spans]
    per_run: dict[str, list[float]] = {}
    output_bytes: dict[str, int] = {}
    suffix = "_kernel_time"
    for e in events:
        name = e.get("name", "")
        if e.get("cat") != "Node" or not isinstance(name, str) or not name.endswith(suffix):
            continue
        node = name[: -len(suffix)]
        dur = float(e.get("dur", 0))
        if spans:
            ts = int(e["ts"])
            k = bisect.bisect_right(starts, ts) - 1
            if k < 0 or ts > spans[k][1]:
                continue  # a warm-up run
            per_run.setdefault(node, [0.0] * len(spans))[k] += dur
        else:  # no run markers (another onnxruntime version): the node's k-th event is run k
            per_run.setdefault(node, []).append(dur)
        args = e.get("args") or {}
        if node not in output_bytes and "output_size" in args:
            with contextlib.suppress(TypeError, ValueError):
                output_bytes[node] = int(args["output_size"])
    return {n: statistics.median(v[-runs:]) for n, v in per_run.items()}, output_bytes


@dataclass(frozen=True)
class Exposed:
    """A graph to run with its tensors ``names`` exposed as outputs, in chunks sized by ``estimates``
    (bytes per tensor); its external weights lie in ``external_dir``, ``what`` names it in errors.  With
    ``prune_inputs`` the graph inputs nothing reads are dropped for the run (old-IR models list
    initializers as inputs, and the optimizer may have folded them away)."""

    model: onnx.ModelProto
    names: Sequence[str]
    estimates: Mapping[str, int]
    external_dir: Path | None
    what: str
    prune_inputs: bool = False


def run_exposed(
    ort_model: OrtModel,
    run: Exposed,
    feeds: Mapping[str, np.ndarray],
    take: Callable[[str, np.ndarray], None],
    *,
    chunk_bytes: int,
) -> None:
    """Run ``run.model`` at DISABLE_ALL exposing ``run.names`` as outputs, in chunks of about
    ``chunk_bytes``.

    The graph outputs of the model are swapped for each chunk and restored afterwards (no copy of the
    weights is made); each value is handed to ``take`` and released.
    """
    graph = run.model.graph
    saved_outputs = list(graph.output)
    saved_inputs = list(graph.input)
    try:
        if run.prune_inputs:
            set_items(graph.input, _read_inputs(graph, feeds))
        for chunk in _chunks(run.names, run.estimates, chunk_bytes):
            set_items(graph.output, (onnx.ValueInfoProto(name=t) for t in chunk))
            so = ort_model.options("ORT_DISABLE_ALL", threads=None, external_dir=run.external_dir)
            sess = ort_model.session(run.model.SerializeToString(), so, run.what)
            values = ort_model.run(sess, feeds, run.what)
            del sess
            for t, arr in zip(chunk, values, strict=True):
                if isinstance(arr, np.ndarray):
                    take(t, arr)
            del values
    finally:
        set_items(graph.output, saved_outputs)
        set_items(graph.input, saved_inputs)


def _read_inputs(graph: onnx.GraphProto, feeds: Mapping[str, np.ndarray]) -> list[onnx.ValueInfoProto]:
    """The graph inputs that are initializers, are read (subgraphs included) or are fed."""
    inits = {t.name for t in graph.initializer}
    read = {i for n in graph.node for i in n.input} | {t for n in graph.node for t in subgraph_outer_reads(n)}
    return [i for i in graph.input if i.name in inits or i.name in read or i.name in feeds]


def _chunks(names: Sequence[str], estimates: Mapping[str, int], chunk_bytes: int) -> Iterable[list[str]]:
    chunk: list[str] = []
    size = 0
    for t in dict.fromkeys(names):
        b = max(0, estimates.get(t, 0))
        if chunk and size + b > chunk_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append(t)
        size += b
    if chunk:
        yield chunk
