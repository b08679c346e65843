"""Per-node time at deployment settings, measured with onnxruntime and mapped back to the original nodes.

onnxruntime runs the model at ``ORT_ENABLE_ALL`` (what deployment runs), and its profiler names the nodes
of the *optimized* graph: on CPU the NCHWc layout pass renames most Conv nodes and the tensors between
them, and fusions replace groups of nodes by one kernel.  :func:`profile_model` maps those times back:

1. **Timing.**  One session at deployment settings (``intra_op_num_threads=threads``, one inter-op thread,
   sequential execution) with profiling on: ``warmup`` runs, then ``runs`` runs whose per-node
   ``<node>_kernel_time`` events give a median per optimized node.  The session saves its optimized graph,
   whose node names are the event names.  Profiling costs 8-16 us per event, so the same session then runs
   ``runs`` more times with profiling off, and the per-node medians are scaled so that they sum to that
   unprofiled median wall time (:attr:`Profile.total_seconds`).  The scaled times therefore include the
   session's own per-run cost (feeding inputs, fetching outputs), spread in proportion to node time.
2. **Anchors**, tensors present in both graphs: by name, and by value.  Both graphs run once more at
   ``ORT_DISABLE_ALL`` with every node output exposed; an optimized tensor holds the same value as an
   original one when their relative L2 distance is under :data:`VALUE_TOLERANCE`, after undoing the NCHWc
   blocked layout (blocks of 16 channels with AVX-512, 8 with AVX2: a width counts once a value read
   back with it matches an original one, as a wrong width only permutes the elements).  Values are
   compared through small random sketches, so tensors are released as soon as they are read (and graphs
   with big activations run in chunks of outputs).  When the model's float
   constants are degenerate (every element equal, as in the onnx "light" models) a jittered copy is used
   for this step, so that channels and branches can be told apart.
3. **Regions**: the nodes of both graphs are joined across every tensor that is not an anchor; each region
   is a fused group seen from both sides.  A region's measured time is spread over its original nodes in
   proportion to their static FLOPs (:mod:`onnxpipe.cost.static`; output elements as fallback).  A region with
   no original node gives its time to its neighbours.  Nothing is dropped: the node times always sum to
   the total, and :attr:`Profile.unattributed` says which times were not attributed to exactly one node.

This module runs the steps, kept in modules of their own: :mod:`onnxpipe.cost.trace` (step 1 and the
sessions), :mod:`onnxpipe.cost.valuematch` with :mod:`onnxpipe.cost.anchors` and
:mod:`onnxpipe.cost.sketch` (step 2), :mod:`onnxpipe.cost.attribution` (step 3); the result is a
:class:`~onnxpipe.cost.profile.Profile`.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from onnxpipe.core.choices import CostSource
from onnxpipe.core.errors import ProfileError, error_line
from onnxpipe.core.progress import Progress
from onnxpipe.cost.attribution import attribute
from onnxpipe.cost.options import ProfileOptions, frozen_shapes
from onnxpipe.cost.profile import SCHEMA_VERSION, Profile
from onnxpipe.cost.runnable import retry_note, retry_shapes
from onnxpipe.cost.trace import OrtModel
from onnxpipe.cost.valuematch import match_graphs
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.samples import Samples
from onnxpipe.ir.shapes import RETRY_SEQUENCE_SIZE, failure_hint, resolve_input_shapes

VALUE_CHUNK_BYTES = 512 << 20
"""Most bytes of exposed tensors one value-matching run may hold at once (read at each call)."""


def profile_model(
    view: ModelView,
    *,
    threads: int = 1,
    runs: int = 10,
    warmup: int = 3,
    shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    progress: bool | str = False,
    samples: Samples | None = None,
) -> Profile:
    """Measure every compute node of ``view`` with onnxruntime at deployment settings (see module doc).

    ``progress``: draw a bar (``True``, or a few words naming what is measured: a decoder's phase).

    The model runs on ``samples`` (the user's ``--inputs``, taken in turn) when given; else on
    :func:`onnxpipe.ir.feeds.random_feeds` with ``seed`` at ``shapes`` (overrides of
    :func:`onnxpipe.ir.shapes.resolve_input_shapes`).  When random inputs at guessed sequence sizes
    make the model fail, it is measured once more with those dims at
    :data:`~onnxpipe.ir.shapes.RETRY_SEQUENCE_SIZE` (a reflect pad longer than the guess), and the
    profile's notes say so.  Raises :class:`ProfileError` when onnxruntime cannot load or run the model,
    naming the dims that were guessed and the flags that set them.
    """
    given = frozen_shapes(shapes or {})
    how = ProfileOptions(threads=threads, runs=runs, warmup=warmup, shapes=given, inputs=samples)  # checked
    if samples is not None:
        hint = f"the model fails on the given inputs ({samples.describe()}); give inputs it runs on"
        return _measure(view, how, progress, hint, samples.shapes, list(samples.feeds))
    input_shapes = resolve_input_shapes(view, shapes)
    hint = failure_hint(view, input_shapes, shapes)
    try:
        return _measure(view, how, progress, hint, input_shapes, [random_feeds(view, input_shapes, seed)])
    except ProfileError as first:
        why = error_line(first.__cause__ or first)  # onnxruntime's own line, not the wrapped message
        larger = retry_shapes(view, shapes)
        if larger is None:
            raise
        try:
            prof = _measure(view, how, progress, hint, larger, [random_feeds(view, larger, seed)])
        except ProfileError:
            raise ProfileError(
                f"{view.label}: onnxruntime failed running the model on random inputs at the guessed sizes "
                f"({why}), and again with its sequence dims at {RETRY_SEQUENCE_SIZE}; {hint}"
            ) from first
    return dataclasses.replace(prof, unattributed=(retry_note(why, larger), *prof.unattributed))


def _measure(
    view: ModelView,
    how: ProfileOptions,
    progress: bool | str,
    hint: str,
    input_shapes: Mapping[str, tuple[int, ...]],
    samples: Sequence[Mapping[str, Any]],
) -> Profile:
    """One measurement on ``samples`` at ``input_shapes``: time, match, attribute (module doc); ``hint``:
    what a failure tells the user to do; ``progress``: as :func:`profile_model`'s."""
    label, feeds, given = view.label, samples[0], how.inputs
    threads, runs, warmup = how.threads or 1, how.runs, how.warmup
    what = f", {progress}" if isinstance(progress, str) else ""  # a phase the bar names
    steps = warmup + 2 * runs
    with (
        tempfile.TemporaryDirectory(prefix="onnxpipe-profile-") as tmpdir,
        Progress(steps, f"profiling {label}{what}", enabled=bool(progress), unit="runs") as bar,
    ):
        ort_model = OrtModel(view, Path(tmpdir), label, threads, hint)
        timing = ort_model.measure(samples, warmup, runs, bar)
        bar.set_label(f"matching {label}'s nodes to onnxruntime's")
        matched = match_graphs(view, ort_model, timing, feeds, input_shapes, VALUE_CHUNK_BYTES)
        result = attribute(view, timing, matched)
        bar.done_text = (
            f"profiled {label}{what}: {warmup} warm-up run(s), then {runs} timed twice: with "
            "onnxruntime's profiler (each node's time) and without (the whole model's)"
        )
    return Profile(
        schema_version=SCHEMA_VERSION,
        model_sha256=view.sha256,
        model_name=view.file_name,
        source=CostSource.PROFILE,
        threads=threads,
        runs=runs,
        input_shapes=MappingProxyType(dict(input_shapes)),
        node_seconds=MappingProxyType(result.node_seconds),
        tensor_bytes=MappingProxyType(matched.tensor_bytes),
        total_seconds=timing.total_seconds,
        regions=result.regions,
        unattributed=tuple(matched.notes + result.notes),
        exact_fraction=result.exact_fraction,
        inputs=given.records if given is not None else (),
        samples=given,
    )
