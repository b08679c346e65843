"""Pictures of a plan: a Gantt chart of the simulated schedule and per-stage bars against capacity.

A table says which stage is the bottleneck; a picture shows *why*: a bubble at the start of every device
row (fill), a link row busier than its devices (the cut is too big for the network), a memory bar over its
device's line (the schedule holds too many micro-batches).  matplotlib is an optional extra
(``pip install 'onnxpipe[plot]'``) imported only here and only when a picture is asked for, and only its
object-oriented API is used (no ``pyplot``, no global backend switch), so plotting from a library or a
notebook changes nothing for the caller.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxpipe.core.errors import UsageError
from onnxpipe.core.extras import install_hint
from onnxpipe.core.options import opt
from onnxpipe.planning.types import Plan
from onnxpipe.schedule.simulate import stream
from onnxpipe.schedule.timeline import Timeline

SUFFIXES = (".png", ".svg")
_F_COLOR = "#4C78A8"
_B_COLOR = "#F58518"
_LINK_F_COLOR = "#54A3A0"
"""Transfers have one colour everywhere: the Gantt's link rows and the bars' transfer part."""
_LINK_B_COLOR = "#A8D5D2"
_PARAM_COLOR = "#8C6D31"
_ACT_COLOR = "#B279A2"
_CAP_COLOR = "#D62728"
_LOG_MEMORY_RATIO = 30.0
"""A device's memory more than this many times the largest stage's use puts the memory axis on a log
scale: linear, an 8 GiB line beside 11 MiB of weights leaves the bars a pixel high."""


@dataclass(frozen=True)
class StageSummary:
    """What the bar chart shows for one stage: its device, times per micro-batch and memory."""

    device: str
    compute_seconds: float
    transfer_seconds: float
    param_bytes: float
    activation_bytes: float
    memory_cap: float = math.inf
    backward_seconds: float = 0.0
    """Of ``compute_seconds``, the backward pass's share (training schedules; 0 for inference)."""

    @property
    def memory_bytes(self) -> float:
        return self.param_bytes + self.activation_bytes


def _matplotlib() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise UsageError(
            f"drawing a plan needs matplotlib, which is not installed; {install_hint('plot')}, or drop "
            f"{opt('plot')}"
        ) from e
    return Figure


def _time_unit(seconds: float) -> tuple[str, float]:
    if seconds >= 1.0:
        return "s", 1.0
    if seconds >= 1e-3:
        return "ms", 1e3
    return "µs", 1e6


def _byte_unit(nbytes: float) -> tuple[str, float]:
    for unit, scale in (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if nbytes >= scale:
            return unit, scale
    return "B", 1.0


def stage_seconds(s: StageSummary, overlapped: bool) -> float:
    """A stage's time per micro-batch as the plan counts it: transfer beside compute (the larger counts)
    or added to it."""
    return (
        max(s.compute_seconds, s.transfer_seconds) if overlapped else s.compute_seconds + s.transfer_seconds
    )


def plot_plan(
    timeline: Timeline,
    stages: Sequence[StageSummary],
    path: str | Path,
    *,
    title: str | None = None,
    overlapped: bool = False,
) -> Path:
    """Draw the plan into ``path`` (PNG or SVG, by suffix) and return the path.

    The title says K, the bottleneck, the throughput and the bubble (after ``title``, the model's name).
    Top: one row per device (stage 0 at the top) with its forward (blue) and backward (orange) steps,
    each labelled with its micro-batch number when there is room, and one row per link that carries
    anything (activations going forward above, gradients coming back below, in the transfer colour).
    Bottom left: each stage's time per micro-batch, forward, backward and transfer in the Gantt's
    colours, stacked where they add (``overlapped`` False) or transfer beside compute where links run
    beside it, with its number on top and the bottleneck as a dashed line.  Bottom right: parameters and
    activations stacked, with each device's memory as a red line, on a log scale when the memory is far
    above the use.
    """
    out = Path(path)
    if out.suffix.lower() not in SUFFIXES:
        raise UsageError(f"{out}: cannot tell the picture format; give a file name ending in .png or .svg")
    if len(stages) != timeline.k:
        raise ValueError(f"{len(stages)} stage summaries for a timeline of {timeline.k} stages")
    figure_cls = _matplotlib()
    k = timeline.k
    link_rows = sorted({t.link for t in timeline.transfers})
    rows = k + len(link_rows)
    fig = figure_cls(figsize=(11, 3.2 + 0.42 * rows + 3.4), layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=[max(1.5, 0.42 * rows), 3.2])
    gantt = fig.add_subplot(grid[0, :])
    times = fig.add_subplot(grid[1, 0])
    memory = fig.add_subplot(grid[1, 1])
    _draw_gantt(gantt, timeline, [s.device for s in stages], link_rows)
    bottleneck = max((stage_seconds(s, overlapped) for s in stages), default=0.0)
    _draw_times(times, stages, overlapped, bottleneck)
    _draw_memory(memory, stages)
    unit, scale = _time_unit(bottleneck)
    summary = (
        f"{k} stage{'s' if k != 1 else ''}, bottleneck {bottleneck * scale:.3g} {unit}, "
        f"{timeline.steady_state_throughput_per_s:.4g} micro-batches/s, "
        f"{timeline.kind} schedule of {timeline.microbatches}: bubble {timeline.bubble_fraction:.0%}"
    )
    fig.suptitle(f"{title}\n{summary}" if title else summary)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format=out.suffix.lower()[1:], dpi=110)
    except OSError as e:
        raise UsageError(f"{out}: cannot write the picture ({e}); choose another {opt('plot')} file") from e
    return out


def _draw_gantt(ax: Any, tl: Timeline, names: Sequence[str], link_rows: Sequence[int]) -> None:
    unit, scale = _time_unit(tl.makespan)
    labels: list[str] = []  # one per row, top to bottom: the stages, then the links
    for y, steps in enumerate(tl.stages):
        for st in steps:
            width = (st.end - st.start) * scale
            color = _F_COLOR if st.kind == "F" else _B_COLOR
            ax.barh(
                y, width, left=st.start * scale, height=0.8, color=color, edgecolor="white", linewidth=0.5
            )
            if tl.makespan > 0 and (st.end - st.start) / tl.makespan > 0.012:
                ax.text(
                    (st.start + st.end) / 2 * scale,
                    y,
                    str(st.microbatch),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white",
                )
        labels.append(f"{y}: {names[y]}")
    # forward transfers in the upper half of a link's row, gradients in the lower
    for y, lk in enumerate(link_rows, start=len(labels)):
        for t in tl.transfers:
            if t.link == lk:
                color, dy = (_LINK_F_COLOR, -0.2) if t.kind == "F" else (_LINK_B_COLOR, 0.2)
                ax.barh(y + dy, (t.end - t.start) * scale, left=t.start * scale, height=0.38, color=color)
        labels.append(f"link {lk - 1}–{lk}" if lk > 0 else "input → 0")
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, max(tl.makespan * scale * 1.01, 1e-12))
    handles = [
        _patch(_F_COLOR, "forward"),
        *([_patch(_B_COLOR, "backward")] if any(st.kind == "B" for row in tl.stages for st in row) else []),
        *([_patch(_LINK_F_COLOR, "transfer: activations")] if link_rows else []),
        *([_patch(_LINK_B_COLOR, "transfer: gradients")] if any(t.kind == "B" for t in tl.transfers) else []),
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.grid(axis="x", alpha=0.3)


def _patch(color: str, label: str) -> Any:
    from matplotlib.patches import Patch

    return Patch(color=color, label=label)


def _draw_times(ax: Any, stages: Sequence[StageSummary], overlapped: bool, bottleneck: float) -> None:
    totals = [stage_seconds(s, overlapped) for s in stages]
    peak = max([*totals, *(s.transfer_seconds for s in stages), bottleneck, 0.0])
    unit, scale = _time_unit(peak)
    xs = list(range(len(stages)))
    forward = [(s.compute_seconds - s.backward_seconds) * scale for s in stages]
    backward = [s.backward_seconds * scale for s in stages]
    transfer = [s.transfer_seconds * scale for s in stages]
    training = any(b > 0 for b in backward)
    width = 0.4 if overlapped else 0.6
    left = [x - 0.2 for x in xs] if overlapped else xs
    ax.bar(left, forward, width, label="forward compute" if training else "compute", color=_F_COLOR)
    if training:
        ax.bar(left, backward, width, bottom=forward, label="backward compute", color=_B_COLOR)
    compute_tops = [f + b for f, b in zip(forward, backward, strict=True)]
    if any(transfer):
        if overlapped:  # links run beside compute: the larger of the two counts
            ax.bar(
                [x + 0.2 for x in xs],
                transfer,
                width,
                label="transfer in (beside compute)",
                color=_LINK_F_COLOR,
            )
        else:  # a stage receives, then computes: the two add
            ax.bar(xs, transfer, width, bottom=compute_tops, label="transfer in (adds)", color=_LINK_F_COLOR)
    for x, total in zip(xs, totals, strict=True):
        _label(ax, f"{total * scale:.3g}", x, total * scale)
    if bottleneck > 0:
        ax.axhline(
            bottleneck * scale,
            color="black",
            linestyle="--",
            linewidth=1,
            label=f"bottleneck {bottleneck * scale:.3g} {unit}",
        )
    _stage_axis(ax, stages, "time per stage")
    ax.set_ylim(0, max(peak * scale * 1.18, 1e-12))
    ax.set_ylabel(f"per micro-batch ({unit})")


def _label(ax: Any, text: str, x: float, y: float, **style: Any) -> None:
    """``text`` just above the point ``(x, y)``: a bar's value, a device's memory line."""
    style.setdefault("fontsize", 8)
    ax.annotate(text, (x, y), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", **style)


def _bytes_text(nbytes: float) -> str:
    unit, scale = _byte_unit(nbytes)
    return f"{nbytes / scale:.3g} {unit}"


def _stage_axis(ax: Any, stages: Sequence[StageSummary], title: str) -> None:
    """One bar per stage along x, each named by its index and device; the chart's title, legend and
    grid."""
    ax.set_xticks(range(len(stages)), [f"{i}\n{s.device}" for i, s in enumerate(stages)], fontsize=8)
    ax.set_xlim(-0.6, len(stages) - 0.4)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="best")
    ax.grid(axis="y", alpha=0.3)


def _draw_memory(ax: Any, stages: Sequence[StageSummary]) -> None:
    finite_caps = [s.memory_cap for s in stages if math.isfinite(s.memory_cap)]
    use_peak = max([s.memory_bytes for s in stages] + [0.0])
    peak = max([use_peak, *finite_caps])
    log = bool(finite_caps) and use_peak > 0 and max(finite_caps) > _LOG_MEMORY_RATIO * use_peak
    unit, scale = _byte_unit(peak if not log else use_peak)
    xs = list(range(len(stages)))
    params = [s.param_bytes / scale for s in stages]
    acts = [s.activation_bytes / scale for s in stages]
    ax.bar(xs, params, 0.6, label="parameters", color=_PARAM_COLOR)
    ax.bar(xs, acts, 0.6, bottom=params, label="activations", color=_ACT_COLOR)
    labelled = False
    for x, s in zip(xs, stages, strict=True):
        used = s.memory_bytes
        share = (
            f" ({100 * used / s.memory_cap:.2g}%)" if math.isfinite(s.memory_cap) and s.memory_cap > 0 else ""
        )
        _label(ax, f"{_bytes_text(used)}{share}", x, used / scale)
        if math.isfinite(s.memory_cap):
            ax.hlines(
                s.memory_cap / scale,
                x - 0.4,
                x + 0.4,
                colors=_CAP_COLOR,
                linewidth=2,
                label=None if labelled else "device memory",
            )
            _label(ax, _bytes_text(s.memory_cap), x, s.memory_cap / scale, fontsize=7, color=_CAP_COLOR)
            labelled = True
    title = (
        "memory per stage against the device's"
        if finite_caps
        else "memory per stage (no device memory given)"
    )
    _stage_axis(ax, stages, title)
    if log:
        ax.set_yscale("log")
        smallest = min((v for v in params + acts if v > 0), default=1.0)
        ax.set_ylim(smallest / 3, peak / scale * 4)
        ax.set_ylabel(f"memory ({unit}, log scale: the devices hold far more)")
    else:
        ax.set_ylim(0, max(peak / scale * 1.18, 1e-12))
        ax.set_ylabel(f"memory ({unit})")


def draw_plan(plan: Plan, path: str | Path, *, title: str | None = None) -> Path:
    """Gantt chart of the plan's simulated schedule and per-stage loads against device capacity."""
    timeline = plan.timeline or stream([s.cost_seconds for s in plan.stages])
    caps = plan.cluster.mem_caps if plan.cluster is not None else (math.inf,) * plan.k
    summaries = [
        StageSummary(
            device=s.device,
            compute_seconds=s.compute_seconds,
            transfer_seconds=s.transfer_seconds,
            param_bytes=float(s.param_bytes),
            activation_bytes=float(s.peak_activation_bytes * plan.microbatch_size),
            memory_cap=float(caps[i]),
            backward_seconds=s.compute_seconds * _backward_share(timeline, i),
        )
        for i, s in enumerate(plan.stages)
    ]
    overlapped = plan.link_model == "overlap" if plan.link_model is not None else plan.cluster is not None
    return plot_plan(timeline, summaries, path, title=title, overlapped=overlapped)


def _backward_share(tl: Timeline, stage: int) -> float:
    """The backward steps' share of one micro-batch's compute on ``stage``, from the simulated schedule
    (0 for inference), so that the bars show forward and backward as the Gantt does."""
    steps = tl.stages[stage]
    f = sum(st.end - st.start for st in steps if st.kind == "F")
    b = sum(st.end - st.start for st in steps if st.kind == "B")
    return b / (f + b) if f + b > 0 else 0.0
