"""Tests of onnxpipe.planning.draw: a picture of a plan is written, in the format its suffix asks for."""

from __future__ import annotations

import builtins
import math
import re
from pathlib import Path
from typing import Any

import pytest

from onnxpipe.core.errors import UsageError
from onnxpipe.planning.draw import StageSummary, plot_plan
from onnxpipe.schedule.simulate import simulate

STAGES = [
    StageSummary("cpu0", 1e-3, 0.0, 3e6, 2e6, 8e6),
    StageSummary("gpu0", 2e-3, 5e-4, 5e6, 4e6, 6e6),  # over its memory: drawn above the red line
    StageSummary("edge", 1e-3, 5e-4, 1e6, 1e6, math.inf),
]


def test_png_and_svg(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    tl = simulate("1f1b", [1e-3, 2e-3, 1e-3], [2e-3, 4e-3, 2e-3], [0.0, 5e-4, 5e-4], 6)
    png = plot_plan(tl, STAGES, tmp_path / "plan.png")
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
    svg = plot_plan(tl, STAGES, tmp_path / "sub" / "plan.SVG", title="my plan")
    text = svg.read_text(encoding="utf-8")
    assert "<svg" in text and "my plan" in text
    # the title says K, the bottleneck, the throughput and the bubble; the bars carry their numbers
    assert "3 stages, bottleneck" in text and "micro-batches/s" in text and "bubble" in text
    assert "transfer: activations" in text and "bottleneck 2.5 ms" in text


def _axes() -> Any:
    from matplotlib.figure import Figure

    return Figure().add_subplot()


def test_memory_far_below_the_device_is_drawn_on_a_log_scale() -> None:
    pytest.importorskip("matplotlib")
    from onnxpipe.planning.draw import _draw_memory

    small = [StageSummary("gpu", 1e-3, 0.0, 11 * 2**20, 2**20, 8 * 2**30)]  # 12 MiB against 8 GiB
    ax = _axes()
    _draw_memory(ax, small)
    assert ax.get_yscale() == "log"
    assert any("12 MiB (0.15%)" in t.get_text() for t in ax.texts)
    ax = _axes()
    _draw_memory(ax, STAGES)  # use and capacity alike: linear
    assert ax.get_yscale() == "linear"


def test_transfer_stacks_on_compute_where_the_two_add() -> None:
    pytest.importorskip("matplotlib")
    from onnxpipe.planning.draw import _draw_times

    stages = [StageSummary("a", 2e-3, 1e-3, 0, 0), StageSummary("b", 1e-3, 0.0, 0, 0)]
    ax = _axes()
    _draw_times(ax, stages, overlapped=False, bottleneck=3e-3)
    transfer = [r for r in ax.patches if r.get_facecolor()[:3] != ax.patches[0].get_facecolor()[:3]]
    assert transfer and transfer[0].get_y() == pytest.approx(2.0)  # on top of stage a's 2 ms of compute
    assert [t.get_text() for t in ax.texts] == ["3", "1"]  # each stage's total on its bar
    assert any(line.get_linestyle() == "--" for line in ax.get_lines())  # the bottleneck line


def test_stream_plan(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    tl = simulate("stream", [1.0, 2.0], None, [0.0, 0.0], 4)
    stages = [StageSummary("a", 1.0, 0.0, 0, 10, math.inf), StageSummary("b", 2.0, 0.0, 0, 10, math.inf)]
    out = plot_plan(tl, stages, tmp_path / "stream.png")
    assert out.stat().st_size > 0


def test_refusals(tmp_path: Path) -> None:
    tl = simulate("stream", [1.0], None, [0.0], 1)
    with pytest.raises(UsageError, match=r"\.png or \.svg"):
        plot_plan(tl, STAGES[:1], tmp_path / "plan.pdf")
    with pytest.raises(ValueError, match="stage summaries"):
        plot_plan(tl, STAGES, tmp_path / "plan.png")


HINT = "pip install 'onnxpipe[plot]' (or '.[plot]' in a source checkout)"


def test_missing_matplotlib_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    tl = simulate("stream", [1.0], None, [0.0], 1)
    with pytest.raises(UsageError, match=re.escape(f"needs matplotlib, which is not installed; {HINT}")):
        plot_plan(tl, STAGES[:1], tmp_path / "plan.png")
    assert not (tmp_path / "plan.png").exists()
