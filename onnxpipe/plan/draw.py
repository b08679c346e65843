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
from onnxpipe.plan.types import Plan
from onnxpipe.schedule.simulate import simulate
from onnxpipe.schedule.timeline import DEFAULT_MICROBATCHES, Timeline

SUFFIXES = (".png", ".svg")
_F_COLOR = "#4C78A8"
_B_COLOR = "#F58518"
_LINK_F_COLOR = "#9D9D9D"
_LINK_B_COLOR = "#D3D3D3"


@dataclass(frozen=True)
class StageSummary:
    """What the bar chart shows for one stage: its device, times per micro-batch and memory."""

    device: str
    compute_seconds: float
    transfer_seconds: float
    param_bytes: float
    activation_bytes: float
    memory_cap: float = math.inf

    @property
    def memory_bytes(self) -> float:
        return self.param_bytes + self.activation_bytes


def _matplotlib() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise UsageError(
            "drawing a plan needs matplotlib, which is not installed; install onnxpipe[plot] "
            "(pip install 'onnxpipe[plot]') or drop --plot"
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


def plot_plan(
    timeline: Timeline,
    stages: Sequence[StageSummary],
    path: str | Path,
    *,
    title: str | None = None,
) -> Path:
    """Draw the plan into ``path`` (PNG or SVG, by suffix) and return the path.

    Top: one row per device (stage 0 at the top) with its forward (blue) and backward (orange) steps,
    each labelled with its micro-batch number when there is room, and one row per link that carries
    anything (activations going forward dark grey above, gradients coming back light grey below).
    Bottom left: per-stage compute and transfer time of one micro-batch (the bottleneck is the tallest
    bar); bottom right: parameters plus activations stacked, with each device's memory as a red line.
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
    fig = figure_cls(figsize=(11, 3.2 + 0.42 * rows + 3.2), layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=[max(1.5, 0.42 * rows), 3.0])
    gantt = fig.add_subplot(grid[0, :])
    times = fig.add_subplot(grid[1, 0])
    memory = fig.add_subplot(grid[1, 1])
    _draw_gantt(gantt, timeline, [s.device for s in stages], link_rows)
    _draw_times(times, stages)
    _draw_memory(memory, stages)
    fig.suptitle(
        title
        or (
            f"{timeline.kind} schedule, {timeline.microbatches} micro-batches: "
            f"bubble {timeline.bubble_fraction:.0%}"
        )
    )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format=out.suffix.lower()[1:], dpi=110)
    except OSError as e:
        raise UsageError(f"{out}: cannot write the picture ({e}); choose another --plot file") from e
    return out


def _draw_gantt(ax: Any, tl: Timeline, names: Sequence[str], link_rows: Sequence[int]) -> None:
    unit, scale = _time_unit(tl.makespan)
    labels: list[str] = []
    y = 0
    ylist: list[int] = []
    for s, steps in enumerate(tl.stages):
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
        labels.append(f"{s}: {names[s]}")
        ylist.append(y)
        y += 1
    for lk in link_rows:  # forward transfers in the upper half of the row, gradients in the lower
        for t in tl.transfers:
            if t.link == lk:
                color, dy = (_LINK_F_COLOR, -0.2) if t.kind == "F" else (_LINK_B_COLOR, 0.2)
                ax.barh(y + dy, (t.end - t.start) * scale, left=t.start * scale, height=0.38, color=color)
        labels.append(f"link {lk - 1}–{lk}" if lk > 0 else "input → 0")
        ylist.append(y)
        y += 1
    ax.set_yticks(ylist, labels)
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, max(tl.makespan * scale, 1e-12))
    handles = [
        _patch(_F_COLOR, "forward"),
        *([_patch(_B_COLOR, "backward")] if any(st.kind == "B" for row in tl.stages for st in row) else []),
        *([_patch(_LINK_F_COLOR, "activations")] if link_rows else []),
        *([_patch(_LINK_B_COLOR, "gradients")] if any(t.kind == "B" for t in tl.transfers) else []),
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.grid(axis="x", alpha=0.3)


def _patch(color: str, label: str) -> Any:
    from matplotlib.patches import Patch

    return Patch(color=color, label=label)


def _draw_times(ax: Any, stages: Sequence[StageSummary]) -> None:
    peak = max((max(s.compute_seconds, s.transfer_seconds) for s in stages), default=0.0)
    unit, scale = _time_unit(peak)
    xs = range(len(stages))
    ax.bar(
        [x - 0.2 for x in xs],
        [s.compute_seconds * scale for s in stages],
        0.4,
        label="compute",
        color=_F_COLOR,
    )
    ax.bar(
        [x + 0.2 for x in xs],
        [s.transfer_seconds * scale for s in stages],
        0.4,
        label="transfer in",
        color=_LINK_F_COLOR,
    )
    ax.set_xticks(list(xs), [f"{i}\n{s.device}" for i, s in enumerate(stages)], fontsize=8)
    ax.set_ylabel(f"per micro-batch ({unit})")
    ax.set_title("time per stage", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def _draw_memory(ax: Any, stages: Sequence[StageSummary]) -> None:
    finite_caps = [s.memory_cap for s in stages if math.isfinite(s.memory_cap)]
    peak = max([s.memory_bytes for s in stages] + finite_caps + [0.0])
    unit, scale = _byte_unit(peak)
    xs = list(range(len(stages)))
    params = [s.param_bytes / scale for s in stages]
    acts = [s.activation_bytes / scale for s in stages]
    ax.bar(xs, params, 0.6, label="parameters", color="#54A24B")
    ax.bar(xs, acts, 0.6, bottom=params, label="activations", color="#B279A2")
    labelled = False
    for x, s in zip(xs, stages, strict=True):
        if math.isfinite(s.memory_cap):
            ax.hlines(
                s.memory_cap / scale,
                x - 0.4,
                x + 0.4,
                colors="red",
                linewidth=2,
                label=None if labelled else "device memory",
            )
            labelled = True
    ax.set_xticks(xs, [f"{i}\n{s.device}" for i, s in enumerate(stages)], fontsize=8)
    ax.set_ylabel(f"memory ({unit})")
    ax.set_title("memory per stage", fontsize=10)
    ax.legend(fontsize=8, loc="best")
    ax.grid(axis="y", alpha=0.3)


def draw_plan(plan: Plan, path: str | Path, *, title: str | None = None) -> Path:
    """Gantt chart of the plan's simulated schedule and per-stage loads against device capacity."""
    timeline = plan.timeline or simulate(
        "stream", [s.cost_seconds for s in plan.stages], None, [0.0] * plan.k, DEFAULT_MICROBATCHES
    )
    caps = plan.cluster.mem_caps if plan.cluster is not None else (math.inf,) * plan.k
    summaries = [
        StageSummary(
            device=s.device,
            compute_seconds=s.compute_seconds,
            transfer_seconds=s.transfer_seconds,
            param_bytes=float(s.param_bytes),
            activation_bytes=float(s.peak_activation_bytes * plan.microbatch_size),
            memory_cap=float(caps[i]),
        )
        for i, s in enumerate(plan.stages)
    ]
    return plot_plan(timeline, summaries, path, title=title)
