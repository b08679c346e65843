"""The ONNX conformance cases split: every multi-node node case of the installed onnx package that
onnxruntime passes whole passes split into min(3, compute nodes) stages and chained, on its own inputs,
against its own expected outputs and tolerances (``tools/conformance.py``)."""

from __future__ import annotations

import pytest

from tools import conformance

MIN_CASES = 300
"""The onnx releases the project supports hold about 390 such cases: far fewer means the loader broke."""


@pytest.mark.slow
def test_every_case_onnxruntime_passes_whole_passes_split() -> None:
    outcomes = conformance.run_all()
    counted = [o for o in outcomes if o.status != "skip"]
    failed = [f"{o.name}: {o.detail}" for o in counted if o.status == "fail"]
    assert len(counted) >= MIN_CASES, f"only {len(counted)} conformance cases were found"
    assert not failed, f"{len(failed)} of {len(counted)} cases fail split:\n" + "\n".join(failed)
