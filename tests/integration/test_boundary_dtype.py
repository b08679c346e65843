"""``split --boundary-dtype``: float32 activations crossing a cut cast to float16 or quantized to int8
inside the stage files, counted at their compressed bytes, verified at the dtype's tolerance
(issue 38, item 4)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import OPSET, const, make, save, vi, view_of
from onnx import helper
from paths import REPO_ROOT

import onnxpipe
from onnxpipe.api.options import PlanOptions, PlanRequest, ProfileOptions, SplitOptions
from onnxpipe.cli import main
from onnxpipe.core.choices import BoundaryDtype
from onnxpipe.core.errors import UsageError, VerificationError
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import load_model
from onnxpipe.ir.shapes import resolve_input_shapes
from onnxpipe.manifest import load_manifest
from onnxpipe.planning.planner import compressible
from onnxpipe.verification.options import BY_BOUNDARY, VerifyOptions

RESNET = REPO_ROOT / "sample_models" / "resnet_tiny.onnx"


def _split(model: Path, out: Path, dtype: str, devices: Path | None = None) -> onnxpipe.SplitResult:
    request = PlanRequest(stages=2, boundary_dtype=BoundaryDtype(dtype), devices=devices)
    return onnxpipe.split(model, SplitOptions(out, request, profile=ProfileOptions(cost="static")))


def _chain(folder: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The stages run one after the other in onnxruntime, joined by the names the manifest records."""
    manifest = load_manifest(folder)
    values = dict(feeds)
    for st in manifest.stages:
        session = ort.InferenceSession(str(folder / st.file), providers=["CPUExecutionProvider"])
        names = [o.name for o in st.outputs]
        values.update(
            zip(names, session.run(names, {i.name: values[i.name] for i in st.inputs}), strict=True)
        )
    return {o.name: values[o.name] for o in manifest.model_outputs}


def _crossing_bytes(folder: Path) -> int:
    return sum(i.bytes_per_sample for i in load_manifest(folder).stages[1].inputs)


@pytest.fixture(scope="module")
def float32_split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("f32") / "split"
    _split(RESNET, out, "float32")
    return out


@pytest.mark.parametrize(("dtype", "ratio"), [("float16", 2), ("int8", 4)])
def test_a_compressed_split_checks_runs_matches_and_sends_fewer_bytes(
    tmp_path: Path, float32_split: Path, dtype: str, ratio: int
) -> None:
    result = _split(RESNET, tmp_path / "split", dtype)
    out = result.out_dir
    assert result.report is not None and result.report.ok
    manifest = load_manifest(out)
    assert [st.boundary_dtype for st in manifest.stages] == ["float32", dtype]
    for st in manifest.stages:
        onnx.checker.check_model(str(out / st.file), full_check=True)
    sent = manifest.stages[1].inputs
    assert sent and all(i.name.endswith(("/onnxpipe_" + dtype, "/onnxpipe_scale")) for i in sent)
    assert {o.name for o in manifest.stages[0].outputs} == {i.name for i in sent}
    before, after = _crossing_bytes(float32_split), _crossing_bytes(out)
    scales = 4 * sum(i.name.endswith("/onnxpipe_scale") for i in sent)
    assert after == before // ratio + scales
    assert manifest.stages[1].link_bytes_in == after  # the planner counted what crosses
    view = load_model(RESNET)
    feeds = random_feeds(view, resolve_input_shapes(view, None), seed=3)
    want = ort.InferenceSession(str(RESNET), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = _chain(out, feeds)[view.outputs[0]]
    tol = BY_BOUNDARY[dtype]
    error = float(np.max(np.abs(got - want)))
    assert 0 < error <= tol.atol + tol.rtol * float(np.max(np.abs(want)))
    print(f"{dtype}: boundary bytes {before} -> {after}, max abs error {error:.3g}")
    again = onnxpipe.verify(out, VerifyOptions())
    assert again.ok and again.boundary_dtype == dtype


def outlier_model() -> onnx.ModelProto:
    """A boundary tensor whose one huge element sets the int8 scale, so that every other element, which
    alone makes the output, rounds to 0."""
    spread = np.ones(64, dtype=np.float32)
    spread[0] = 1e4
    keep = np.ones(64, dtype=np.float32)
    keep[0] = 0.0
    nodes = [helper.make_node("Mul", ["x", "spread"], ["h"]), helper.make_node("Mul", ["h", "keep"], ["y"])]
    return make(nodes, [vi("x", [1, 64])], [vi("y", [1, 64])], [const("spread", spread), const("keep", keep)])


def test_a_compression_that_breaks_the_tolerance_is_refused(tmp_path: Path) -> None:
    model = save(outlier_model(), tmp_path / "outlier.onnx")
    out = tmp_path / "split"
    with pytest.raises(VerificationError, match="int8 boundaries move output 'y'"):
        _split(model, out, "int8")
    assert not out.exists()
    assert _split(model, tmp_path / "f16", "float16").report.ok  # float16 keeps those values


def test_an_all_zero_tensor_crosses_int8_without_nan(tmp_path: Path) -> None:
    """Its scale would be 0 (``0 / 0`` when dequantized): the floor at float32's tiniest keeps it 0."""
    nodes = [helper.make_node("Mul", ["x", "zero"], ["h"]), helper.make_node("Add", ["h", "x"], ["y"])]
    model = make(nodes, [vi("x", [1, 8])], [vi("y", [1, 8])], [const("zero", np.zeros(8))])
    out = _split(save(model, tmp_path / "zero.onnx"), tmp_path / "split", "int8").out_dir
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)
    np.testing.assert_array_equal(_chain(out, {"x": x})["y"], x)


def test_the_cli_refuses_it_in_one_line_with_exit_code_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = save(outlier_model(), tmp_path / "outlier.onnx")
    out = tmp_path / "split"
    argv = [
        "split",
        str(model),
        "-k",
        "2",
        "--cost",
        "static",
        "-o",
        str(out),
        "--boundary-dtype",
        "int8",
        "-q",
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--boundary-dtype" in err and "Traceback" not in err
    assert not out.exists()


def _devices(tmp_path: Path, rate: str) -> Path:
    device = {"provider": "CPUExecutionProvider", "threads": 1, "memory_bytes": None}
    path = tmp_path / f"devices_{rate.split()[0]}.json"
    doc = {
        "devices": [{"name": "a", **device}, {"name": "b", **device}],
        "links": [{"bandwidth_bytes_per_s": rate, "latency_s": 0}],
    }
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(("rate", "compressed"), [("1 Mbit/s", True), ("100 GB/s", False)])
def test_auto_compresses_only_a_cut_whose_link_bounds_the_pipeline(
    tmp_path: Path, rate: str, compressed: bool
) -> None:
    result = _split(RESNET, tmp_path / "split", "auto", _devices(tmp_path, rate))
    manifest = result.manifest
    assert manifest.stages[1].boundary_dtype == ("float16" if compressed else "float32")
    assert bool(result.plan.boundary_dtypes) == compressed
    assert any("boundary_dtype" in n for n in manifest.plan.notes) != compressed


def test_auto_weighs_a_bandwidth_given_without_devices() -> None:
    request = PlanRequest(stages=2, boundary_dtype=BoundaryDtype.AUTO, bandwidth_bytes_per_s=1e5)
    slow = onnxpipe.plan(RESNET, PlanOptions(request, ProfileOptions(cost="static"))).plan
    assert set(slow.boundary_dtypes.values()) == {BoundaryDtype.FLOAT16}
    assert set(slow.boundary_dtypes) <= set(slow.stages[1].inputs)


def test_auto_without_links_compresses_nothing_and_says_so(tmp_path: Path) -> None:
    result = _split(RESNET, tmp_path / "split", "auto")
    assert not result.plan.boundary_dtypes
    assert any("no links" in n for n in result.plan.notes)


def test_an_old_opset_cannot_carry_int8(tmp_path: Path) -> None:
    model = outlier_model()
    model.opset_import[0].version = 9
    with pytest.raises(onnxpipe.ExportError, match="opset 10"):
        _split(save(model, tmp_path / "old.onnx"), tmp_path / "split", "int8")
    assert OPSET >= 10


def test_bfloat16_and_split_nodes_are_refused_with_the_reason() -> None:
    with pytest.raises(UsageError, match="float16"):
        PlanRequest(stages=2, boundary_dtype="bfloat16").check()
    with pytest.raises(UsageError, match="split_nodes"):
        PlanRequest(stages=2, boundary_dtype="float16", split_nodes="auto").check()


def test_a_bad_value_is_a_one_line_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["split", str(RESNET), "-k", "2", "-o", str(tmp_path / "x"), "--boundary-dtype", "fp8"]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--boundary-dtype" in err and "float16" in err


def test_plan_counts_the_compressed_bytes_and_says_which_cut(capsys: pytest.CaptureFixture[str]) -> None:
    def stages(dtype: str) -> list[dict[str, object]]:
        main(["plan", str(RESNET), "-k", "2", "--cost", "static", "--boundary-dtype", dtype, "--json", "-q"])
        return list(json.loads(capsys.readouterr().out)["plan"]["stages"])

    wide, narrow = stages("float32"), stages("float16")
    assert "boundary_dtype" not in wide[1] and narrow[1]["boundary_dtype"] == "float16"
    assert narrow[1]["link_bytes_in"] * 2 == wide[1]["link_bytes_in"] > 0


def test_only_float32_activations_are_compressible() -> None:
    """Not the inputs, outputs, weights, integers, nor a float made of a shape alone (its value is exact
    and may be read as sizes or scales)."""
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["h"]),
        helper.make_node("Shape", ["x"], ["dims"]),
        helper.make_node("Cast", ["dims"], ["size"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Mul", ["h", "size"], ["y"]),
    ]
    view = view_of(nodes, [vi("x", [2, 4])], [vi("y", [2, 4])], [const("w", np.ones(4))])
    assert compressible(view) == {"h"}
