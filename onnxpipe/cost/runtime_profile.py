"""Costs measured on the runtime a stage will run on: ``onnxpipe profile --runtime R``.

A plan balanced on onnxruntime's costs is not balanced on OpenVINO or tract: each runtime fuses, lays out
and vectorises differently, so the share of the time each node takes moves (the ``runtimes`` benchmark
measures how far, ``benchmarks/results/runtimes.json``).  This module times the whole model on the
runtime and gives every compute node its share:

1. **Total.**  The median wall time of ``runs`` runs on the runtime after ``warmup`` (what a stage's run
   costs there, per-run overhead included).
2. **Per node where the runtime reports it.**  OpenVINO's per-layer counters (``PERF_COUNT``) and
   tract's profile name their layers after the ONNX node, or the tensor it computes, often with a suffix
   for what the runtime made of it (``fc1.relu.low``, ``x_f32_bf16_fc1.gemm``).  A layer is matched to
   the node whose name or output is its name, else its longest dotted prefix, else (OpenVINO's
   reorders) its suffix after an underscore.
3. **Else through the static costs.**  What no node claims (a layer the runtime made up, a runtime that
   reports nothing: onnxruntime on another provider) is spread over the nodes in proportion to their
   static FLOPs-and-bytes costs (:mod:`onnxpipe.cost.static`).  The split is then balanced per stage by
   calibration on the devices (``split --calibrate --devices``, :mod:`onnxpipe.calibrate.devices`),
   which times each stage on its own runtime.

Finally the node times are scaled to sum to the total, as :func:`onnxpipe.cost.measure.profile_model`
does for onnxruntime.  :attr:`Profile.exact_fraction` is the share of the reported time matched to one
node; :attr:`Profile.unattributed` says what was spread.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from onnxpipe.cluster.costs import reference_setting
from onnxpipe.core.choices import CostSource
from onnxpipe.core.errors import ProfileError, UsageError, error_line
from onnxpipe.core.runtimes import EngineConfig, median_seconds, open_engine
from onnxpipe.cost.measure import profile_model
from onnxpipe.cost.profile import Profile
from onnxpipe.cost.static import static_profile
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapes import resolve_input_shapes

LAYER_RUNS = 5
"""Runs whose per-layer reports are taken (the median of each layer's time)."""


def profile_on_runtime(
    view: ModelView,
    config: EngineConfig,
    *,
    runs: int = 10,
    warmup: int = 3,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> Profile:
    """Node seconds of ``view`` measured on ``config``'s runtime (see the module docstring).

    onnxruntime on the CPU is :func:`onnxpipe.cost.measure.profile_model` itself.  Raises
    :class:`ProfileError` when the runtime cannot load or run the model.
    """
    if runs < 1:
        raise UsageError(f"runs must be >= 1, got {runs}")
    if reference_setting(config):
        prof = profile_model(view, threads=config.threads, runs=runs, warmup=warmup, shapes=shapes)
        return dataclasses.replace(prof, runtime=config.label)
    if view.path is None:
        raise UsageError(f"{view.label}: profiling on {config.label} needs the model as a file")
    input_shapes = resolve_input_shapes(view, shapes)
    feeds = random_feeds(view, input_shapes)
    base = static_profile(view, shapes=input_shapes)
    engine = open_engine(
        view.path,
        config,
        fail=lambda e: ProfileError(
            f"{view.path}: does not load in {config.label} ({error_line(e)}); profile it on another runtime"
        ),
    )
    try:
        total = median_seconds(lambda: engine.run(engine.output_names, feeds), runs=runs, warmup=warmup)
        # tract's profiler times many iterations itself (for seconds): once is enough
        repeats = 1 if config.kind.times_layers_itself else min(runs, LAYER_RUNS)
        reports = [engine.layer_seconds(feeds) for _ in range(repeats)]
    except ProfileError:
        raise
    except Exception as e:
        raise ProfileError(
            f"{view.path}: fails in {config.label} on random inputs ({error_line(e)}); "
            "profile it on another runtime"
        ) from e
    finally:
        engine.close()
    layers = _median_layers([r for r in reports if r is not None])
    seconds, matched_share, notes = attribute_layers(view, layers, base.node_seconds, total)
    if not layers:
        notes = [f"{config.label} reports no per-layer times: every node's share follows its static cost"]
    return dataclasses.replace(  # the static profile's model, shapes and tensor bytes, measured times
        base,
        source=CostSource.PROFILE,
        threads=config.threads,
        runs=runs,
        node_seconds=MappingProxyType(seconds),
        total_seconds=total,
        unattributed=tuple(notes),
        exact_fraction=matched_share,
        runtime=config.label,
    )


def _median_layers(reports: Sequence[Mapping[str, float]]) -> dict[str, float]:
    names = {n for r in reports for n in r}
    return {n: statistics.median(r.get(n, 0.0) for r in reports) for n in sorted(names)}


def attribute_layers(
    view: ModelView, layers: Mapping[str, float], static: Mapping[str, float], total: float
) -> tuple[dict[str, float], float, list[str]]:
    """Every compute node's seconds from the runtime's ``layers`` (its names), what no node claims
    spread by ``static`` cost, all scaled to sum to ``total``; the share matched; notes."""
    nodes = [n.name for n in view.compute_nodes]
    by_name: dict[str, str] = {n.name: n.name for n in view.compute_nodes}
    for info in view.compute_nodes:
        for out in info.outputs:
            by_name.setdefault(out, info.name)
    seconds = dict.fromkeys(nodes, 0.0)
    unmatched: list[str] = []
    spread = 0.0
    for layer, t in layers.items():
        owner = match_layer(layer, by_name)
        if owner is None:
            unmatched.append(layer)
            spread += t
        else:
            seconds[owner] += t
    reported = sum(layers.values())
    weights = {n: float(static.get(n, 0.0)) for n in nodes}
    weight_sum = sum(weights.values())
    if weight_sum > 0 and spread > 0:
        for n in nodes:
            seconds[n] += spread * weights[n] / weight_sum
    notes: list[str] = []
    if not reported:  # nothing reported: the static costs' shares
        seconds = dict(weights)
    elif unmatched:
        notes.append(
            f"{len(unmatched)} runtime layer(s) ({spread / reported:.0%} of the reported time) matched no "
            f"node and were spread by static cost, e.g. {', '.join(unmatched[:3])}"
        )
    have = sum(seconds.values())
    scale = total / have if have > 0 else 0.0
    if have <= 0 and nodes:
        seconds = dict.fromkeys(nodes, total / len(nodes))
        scale = 1.0
    matched = (reported - spread) / reported if reported > 0 else 0.0
    return {n: t * scale for n, t in seconds.items()}, matched, notes


def match_layer(layer: str, by_name: Mapping[str, str]) -> str | None:
    """The node a runtime's layer ``layer`` stands for (names and outputs in ``by_name``), or None."""
    if layer in by_name:
        return by_name[layer]
    parts = layer.split(".")
    for i in range(len(parts) - 1, 0, -1):  # tract: "fc1.relu.low", "fc3.gemm.ab.pack_b"
        prefix = ".".join(parts[:i])
        if prefix in by_name:
            return by_name[prefix]
    pieces = layer.split("_")
    for i in range(1, len(pieces)):  # OpenVINO's conversions: "x_f32_bf16_fc1.gemm"
        suffix = "_".join(pieces[i:])
        if suffix in by_name:
            return by_name[suffix]
    return None
