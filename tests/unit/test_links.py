"""One link, one number: rate spellings on the command line, and the link model named and recorded."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from cli_runner import one_line_error, run

from onnxpipe.cli.arguments import bandwidth
from onnxpipe.cost.static import static_profile
from onnxpipe.ir.load import load_model
from onnxpipe.planning.planner import plan
from onnxpipe.planning.request import PlanRequest


def test_bandwidth_takes_the_devices_file_spellings() -> None:
    assert bandwidth("125000000") == 125e6
    assert bandwidth("1 Gbit/s") == pytest.approx(125e6)
    assert bandwidth("100 MB/s") == pytest.approx(100e6)
    for bad in ("fast", "0", "-1 Gbit/s", "inf"):
        with pytest.raises(argparse.ArgumentTypeError):
            bandwidth(bad)


def test_the_two_link_models_differ_and_are_named(resnet: Path) -> None:
    view = load_model(resnet)
    prof = static_profile(view)
    serial = plan(view, prof, PlanRequest(3, bandwidth_bytes_per_s=125e6))
    overlap = plan(view, prof, PlanRequest(3, bandwidth_bytes_per_s=125e6, link_model="overlap"))
    assert (serial.link_model, overlap.link_model) == ("serial", "overlap")
    # serial adds a stage's transfer to its compute, overlap takes the larger: never slower
    assert overlap.bottleneck_seconds <= serial.bottleneck_seconds * (1 + 1e-9)
    s = max(serial.stages, key=lambda st: st.compute_seconds + st.transfer_seconds)
    assert serial.bottleneck_seconds == pytest.approx(s.compute_seconds + s.transfer_seconds)


def test_cli_names_the_link_model(resnet: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["plan", resnet, "-k", "2", "--cost", "static", "--bandwidth", "1 Gbit/s"], capfd)
    assert code == 0, err
    assert "links: serial (a stage's transfer in adds to its compute)" in out
    code, out, err = run(
        ["plan", resnet, "-k", "2", "--cost", "static", "--link-model", "overlap", "--json"], capfd
    )
    assert code == 0, err
    assert json.loads(out)["plan"]["link_model"] == "overlap"
    code, _, err = run(
        ["plan", resnet, "-k", "2", "--cost", "static", "--schedule", "1f1b", "--link-model", "serial"], capfd
    )
    assert code == 2 and "--link-model serial is planned for streaming" in one_line_error(err, "plan")
