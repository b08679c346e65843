"""Tests of onnxpipe.manifest: JSON round trips and one asserted message per validation failure."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.api import ExportOptions
from onnxpipe.core.errors import ManifestError
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import (
    load_manifest,
)
from onnxpipe.planning.stages import assign_stages
from onnxpipe.planning.types import Plan


@pytest.fixture
def exported(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    w = [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), f"w{i}") for i in range(3)]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w0"], ["a"], name="mm0"),
            helper.make_node("MatMul", ["a", "w1"], ["b"], name="mm1"),
            helper.make_node("MatMul", ["b", "w2"], ["y"], name="mm2"),
        ],
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 16])],
        initializer=w,
    )
    path = tmp_path / "chain.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    view = load_model(path)
    sizes = {n: t.nbytes() for n, t in view.tensors.items()}
    stages = assign_stages(view, [0, 1, 2, 3], sizes, [1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    plan = Plan(
        model_sha256=view.sha256,
        stages=stages,
        bottleneck_seconds=1.0,
        lower_bound_seconds=1.0,
        cost_source="test",
        threads=1,
        bandwidth_bytes_per_s=math.inf,
        input_shapes={"x": (1, 16)},
        tensor_bytes=sizes,
    )
    out = tmp_path / "out"
    export_stages(view, plan, out, ExportOptions(external_data="always"))
    return out


def test_exported_manifest_loads_with_file_checks(exported: Path) -> None:
    m = load_manifest(exported)
    assert m.k == 3 and all(s.external_data == f"stage_{s.index}.onnx.data" for s in m.stages)
    assert m.source.path == "../chain.onnx"
    assert m.plan.profiled_input_shapes == {"x": (1, 16)}


def test_changed_stage_file_is_refused(exported: Path) -> None:
    with (exported / "stage_2.onnx").open("ab") as f:
        f.write(b"\0")
    assert load_manifest(exported, check_files=False).k == 3
    with pytest.raises(ManifestError) as info:
        load_manifest(exported)
    assert str(info.value) == (
        f"{exported}/manifest.json: stage 2 file stage_2.onnx changed after export (sha256 mismatch); "
        "re-run onnxpipe split"
    )


def test_changed_external_data_is_refused(exported: Path) -> None:
    data = exported / "stage_1.onnx.data"
    data.write_bytes(b"\1" + data.read_bytes()[1:])
    with pytest.raises(ManifestError) as info:
        load_manifest(exported)
    assert str(info.value) == (
        f"{exported}/manifest.json: stage 1 file stage_1.onnx.data changed after export (sha256 mismatch); "
        "re-run onnxpipe split"
    )


def test_missing_stage_file_is_refused(exported: Path) -> None:
    (exported / "stage_0.onnx").unlink()
    with pytest.raises(ManifestError) as info:
        load_manifest(exported)
    assert str(info.value) == (
        f"{exported}/manifest.json: stage 0 file stage_0.onnx is missing; re-run onnxpipe split"
    )
