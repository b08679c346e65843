"""The boundary contract in the manifest: normalised shapes, profiled shapes, batch axes, opsets, and
declared shapes checked against a run (issue 18)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
from models import const, make, plan_for, vi
from onnx import TensorProto, helper

from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.source import get_profile
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.load import load_model, view_from_proto
from onnxpipe.manifest import load_manifest
from onnxpipe.planning.planner import plan
from onnxpipe.planning.request import PlanRequest


def test_transformer_contract(sample_models_dir: Path, tmp_path: Path) -> None:
    """Every boundary tensor of the sample transformer: symbols only of the model inputs, a profiled
    shape that is what the stages really pass, the batch axis where the batch symbol is; each stage
    lists the default domain among its required opsets."""
    view = load_model(sample_models_dir / "transformer_tiny.onnx")
    shapes = {name: (3, 7) for name in view.inputs}
    prof = get_profile(view, ProfileOptions(cost="static", shapes=shapes))
    out = tmp_path / "s"
    manifest = export_stages(view, plan(view, prof, PlanRequest(3)), out)
    symbols = {d for t in manifest.model_inputs for d in t.shape or () if isinstance(d, str)}
    assert symbols
    (batch,) = {t.shape[0] for t in manifest.model_inputs if t.shape}
    tensors = [*manifest.model_inputs, *manifest.model_outputs]
    tensors += [t for st in manifest.stages for t in (*st.inputs, *st.outputs)]
    for t in tensors:
        assert t.shape is not None
        assert all(isinstance(d, int) or d is None or d in symbols for d in t.shape), t
        assert t.profiled_shape is not None, t.name
        assert t.batch_axis == (t.shape.index(batch) if batch in t.shape else None)
    assert manifest.model_inputs[0].batch_axis == 0
    for st in manifest.stages:
        assert dict(st.required_opsets)[""] >= 13
    # the profiled shapes are what the stages pass at the profiled input shapes
    rng = np.random.default_rng(0)
    values = {
        t.name: rng.integers(0, 10, size=shapes[t.name]).astype(np.int64) for t in manifest.model_inputs
    }
    for st in manifest.stages:
        sess = ort.InferenceSession(str(out / st.file), providers=["CPUExecutionProvider"])
        got = sess.run(None, {i.name: values[i.name] for i in st.inputs})
        for o, v in zip(st.outputs, got, strict=True):
            assert o.profiled_shape == v.shape, o.name
            values[o.name] = v
    raw = json.loads((out / "manifest.json").read_text())
    assert [o["name"] for o in raw["model_outputs"]] == list(view.outputs)  # output order is normative


def test_a_wrong_declared_shape_is_fixed_and_said(tmp_path: Path) -> None:
    """An output declared ``[1, "seq"]`` that really is (2, 3, 4): the manifest and the stage file no
    longer claim the wrong shape, the profiled shape is the real one, a note says so."""
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
        helper.make_node("Mul", ["h", "w"], ["y"], name="mul"),
    ]
    model = make(
        nodes,
        [vi("x", [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq"])],
        [const("w", np.ones((2, 3, 4), np.float32))],
    )
    view = view_from_proto(model)
    manifest = export_stages(view, plan_for(view, [0, 1, 2]), tmp_path / "s")
    (y,) = manifest.model_outputs
    assert y.profiled_shape == (2, 3, 4)
    assert y.shape == (None, None, None)
    assert any("'y' is declared [1, seq]" in n for n in manifest.plan.notes)
    loaded = load_manifest(tmp_path / "s")
    assert loaded.model_outputs[0].profiled_shape == (2, 3, 4)


def test_a_made_up_symbol_is_named_by_the_input_symbol_it_follows(tmp_path: Path) -> None:
    """``Reshape(x, [-1, 4])`` of an x of ``["batch", 4]``: ONNX's inference makes up dim 0's symbol;
    a second run with the batch grown tells that it is the batch, so the contract names it."""
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
        helper.make_node("Reshape", ["h", "target"], ["r"], name="reshape"),
        helper.make_node("Mul", ["r", "w"], ["y"], name="mul"),
    ]
    model = make(
        nodes,
        [vi("x", ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [const("target", np.array([-1, 4]), np.int64), const("w", np.ones(4, np.float32))],
    )
    view = view_from_proto(model)
    assert not isinstance(view.tensor("r").shape[0], int) and view.tensor("r").shape[0] != "batch"  # type: ignore[index]
    manifest = export_stages(view, plan_for(view, [0, 2, 3]), tmp_path / "s")
    (r,) = manifest.stages[1].inputs
    assert r.name == "r" and r.shape == ("batch", 4) and r.batch_axis == 0 and r.profiled_shape == (1, 4)
