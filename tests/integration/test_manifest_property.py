"""A property of the manifest: any plan the planner makes, written to ``manifest.json`` and read back,
is the same manifest.

The models are generated (a chain of MatMul and Relu nodes of random widths, some with a model input
passed through or a tensor that skips a stage), the plans made by the planner itself on static costs
(any stage count it can make, with or without a bandwidth, identical or interleaved workers), and the
stages written by the exporter; so every field the export fills (boundary contracts, required opsets,
workers, the schedule) goes through the codec both ways.
"""

from __future__ import annotations

import itertools
import math
import tempfile
from pathlib import Path

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.core.choices import ExternalData
from onnxpipe.core.errors import PartitionError
from onnxpipe.cost.static import static_profile
from onnxpipe.export.options import ExportOptions
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import Manifest, load_manifest
from onnxpipe.planning.planner import plan
from onnxpipe.planning.request import PlanRequest


@st.composite
def chain_models(draw: st.DrawFn) -> onnx.ModelProto:
    """A chain of 2 to 6 MatMuls of widths 2 to 16, each maybe followed by a Relu; its input maybe also an
    output (passed through), and its first tensor maybe also read by the last node (a skip)."""
    widths = draw(st.lists(st.integers(2, 16), min_size=3, max_size=7))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    nodes, weights, prev = [], [], "x"
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        weights.append(numpy_helper.from_array(rng.standard_normal((a, b)).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"mm{i}"))
        prev = f"m{i}"
        if draw(st.booleans()):
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"], name=f"relu{i}"))
            prev = f"r{i}"
    outputs = [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["n", widths[-1]])]
    if widths[1] == widths[-1] and len(nodes) > 2 and draw(st.booleans()):
        nodes.append(helper.make_node("Add", [prev, "m0"], ["skip"], name="skip"))
        outputs = [helper.make_tensor_value_info("skip", TensorProto.FLOAT, ["n", widths[-1]])]
    if draw(st.booleans()):
        outputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", widths[0]]))
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", widths[0]])],
        outputs,
        initializer=weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=chain_models(),
    k=st.integers(1, 4),
    interleaved=st.booleans(),
    bandwidth=st.sampled_from([math.inf, 1e6, 1e9]),
)
def test_any_plan_survives_manifest_write_and_read(
    model: onnx.ModelProto, k: int, interleaved: bool, bandwidth: float
) -> None:
    with tempfile.TemporaryDirectory(prefix="i36-manifest-") as tmp:
        path = Path(tmp) / "chain.onnx"
        onnx.save_model(model, str(path))
        view = load_model(path)
        workers = 2 if interleaved and k % 2 == 0 else None
        request = PlanRequest(stages=k, bandwidth_bytes_per_s=bandwidth, workers=workers)
        try:
            made = plan(view, static_profile(view), request)
        except PartitionError:  # more stages than the model has places to cut: no plan to write
            return
        written = export_stages(
            view, made, Path(tmp) / "out", ExportOptions(external_data=ExternalData.NEVER)
        )
        assert Manifest.from_json(written.to_json()) == written
        assert load_manifest(Path(tmp) / "out") == written
        assert written.k == made.k and written.plan.workers == made.workers
