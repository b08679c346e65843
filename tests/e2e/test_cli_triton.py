"""``onnxpipe split --static`` then ``onnxpipe export-triton``: the CLI end to end (issue 18)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import run

from onnxpipe.manifest import load_manifest


def test_static_split_then_triton_repository(
    mlp: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        ["split", mlp, "--stages", "2", "--out", "s", "--cost", "static", "--static", "-q"], capfd
    )
    assert code == 0, err
    assert all(
        isinstance(d, int)
        for st in load_manifest(work / "s").stages
        for t in st.inputs
        for d in t.shape or ()
    )
    code, out, err = run(["export-triton", "s", "--out", "repo", "--name", "mlp"], capfd)
    assert code == 0, err
    assert "ensemble 'mlp' over 2 stage model(s), max_batch_size 0" in out
    assert "no server was started" in out
    assert sorted(p.name for p in (work / "repo").iterdir()) == ["mlp", "mlp_stage0", "mlp_stage1"]
    code, out, err = run(["export-triton", "s", "--out", "repo"], capfd)
    assert code == 6 and err.count("\n") == 1 and "pass --force" in err
    code, out, err = run(["export-triton", "s", "--out", "repo2", "--max-batch-size", "0"], capfd)
    assert code == 2 and "--max-batch-size" in err
