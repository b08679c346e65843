"""The ONNX conformance cases split: every multi-node node case of the installed onnx package that
onnxruntime passes whole passes split into min(3, compute nodes) stages and chained, on its own inputs,
against its own expected outputs and tolerances (``tools/conformance.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO_ROOT

from onnxpipe.core.errors import ExportError
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.source import get_profile
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.load import view_from_proto
from onnxpipe.planning.planner import plan
from onnxpipe.planning.request import PlanRequest
from tools import conformance

MIN_CASES = 300
"""The onnx releases the project supports hold about 390 such cases: far fewer means the loader broke."""


@pytest.fixture(scope="module")
def every_case() -> list[conformance.Case]:
    return list(conformance.cases())


@pytest.mark.slow
@pytest.mark.exhaustive
def test_every_case_onnxruntime_passes_whole_passes_split(every_case: list[conformance.Case]) -> None:
    outcomes = conformance.run_all(among=every_case)
    counted = [o for o in outcomes if o.status != "skip"]
    failed = [f"{o.name}: {o.detail}" for o in counted if o.status == "fail"]
    assert len(counted) >= MIN_CASES, f"only {len(counted)} conformance cases were found"
    assert not failed, f"{len(failed)} of {len(counted)} cases fail split:\n" + "\n".join(failed)


@pytest.mark.parametrize(
    "name",
    [
        "test_sequence_map_identity_2_sequences_expanded",
        "test_sequence_map_identity_1_sequence_1_tensor_expanded",
    ],
)
def test_a_stage_copying_a_value_it_also_receives_under_another_name(name: str, tmp_path: Path) -> None:
    """Two ``SequenceEmpty`` in different stages make one value; the last stage copied the later one's
    node and received the value under that node's output name too, which then was an input and a node's
    output at once (the checker's SSA error): now it receives the earlier stage's tensor under its own
    name.  Seen once the stages below the bottleneck were balanced (issue 39)."""
    (case,) = [c for c in conformance.cases(name, "sequence_map") if c.name == name]
    assert conformance.run_case(case, tmp_path).status == "pass"


@pytest.mark.slow
@pytest.mark.exhaustive
def test_a_rank_no_run_confirmed_is_never_written(every_case: list[conformance.Case], tmp_path: Path) -> None:
    """affine_grid's stage 0 once declared a rank-3 tensor as a scalar and did not load: its random
    ``size`` input makes the source fail, so no run shows the rank.  The export now stops naming the
    tensor and ``--inputs``; with the case's own inputs it splits (the test above)."""
    (case,) = [c for c in every_case if c.name == "test_affine_grid_2d_expanded"]
    view = view_from_proto(case.model)
    shapes = {n: tuple(v.shape) for n, v in case.inputs.items()}
    the_plan = plan(view, get_profile(view, ProfileOptions(cost="static", shapes=shapes)), PlanRequest(3))
    with pytest.raises(
        ExportError, match=r"the rank of tensor '\S+' at the stage boundary is unknown.*`input_files=FILE`"
    ):
        export_stages(view, the_plan, tmp_path / "stages")
    assert not (tmp_path / "stages").exists()


@pytest.mark.exhaustive
def test_one_module_s_cases_are_those_of_the_whole_load(every_case: list[conformance.Case]) -> None:
    """``cases(pattern, module)`` (what a test collects at import, in well under a second), in a process
    that has loaded no other case, gives the cases the whole load gives for that pattern."""
    alone_cases = "c.cases('sequence_map', 'sequence_map')"
    code = f"from tools import conformance as c; print(*(x.name for x in {alone_cases}))"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    alone = proc.stdout.split()
    assert alone and alone == [c.name for c in every_case if "sequence_map" in c.name]
