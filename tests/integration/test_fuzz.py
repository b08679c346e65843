"""Random valid models, random cuts: the chained stages always equal the model.

Hypothesis builds a model from a safe op set (elementwise, MatMul, Cast), with random skip connections
(any earlier tensor of the right type may be read), exact repeats of earlier nodes (equal values that a
stage receives once, :func:`onnxpipe.ir.shapevalues.value_classes`), random If nodes whose branches read
outer tensors (sometimes nested), random element types (float32, float64, int32; Cast moves values between
them), and symbolic or fixed dims.  It then draws K and the cut positions, exports with
:func:`onnxpipe.planning.stages.assign_stages` on those bounds (so every cut is reachable, not only the ones a
cost model would choose), and compares the chain with the model at two batch sizes.

300 examples take about 10 s; ``ONNXPIPE_FUZZ_EXAMPLES=3000 pytest tests/test_fuzz.py`` searches longer.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.export.stages import export_stages
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import load_manifest
from onnxpipe.planning.stages import assign_stages
from onnxpipe.planning.types import Plan
from onnxpipe.verification.chain import StageChain

WIDTH = 4
FLOATS = (TensorProto.FLOAT, TensorProto.DOUBLE)
NP = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.INT32: np.int32}
UNARY = {
    TensorProto.FLOAT: ("Relu", "Tanh", "Sigmoid", "Abs", "Neg", "Identity", "Softsign"),
    TensorProto.DOUBLE: ("Relu", "Tanh", "Sigmoid", "Abs", "Neg", "Identity"),
    TensorProto.INT32: ("Abs", "Neg", "Identity"),
}
BINARY = ("Add", "Sub", "Mul", "Max", "Min")


@dataclass
class Builder:
    """Grows a graph; ``pools[dtype]`` lists the tensors of that element type, all of one shape."""

    dims: list[int | str]
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    pools: dict[int, list[str]] = field(default_factory=dict)
    casts: set[str] = field(default_factory=set)
    count: int = 0

    def outer(self, elem: int) -> list[str]:
        """Tensors of ``elem`` a body may read: not a Cast's output.

        onnxruntime 1.32 at ORT_ENABLE_ALL removes a Cast round trip (float -> double -> float) without
        telling the If bodies that read its output: "Missing Input: t15" from the *original* model.  The
        same holds for an ``Identity`` of such an output (the optimizer folds it into the round trip).
        """
        return [t for t in self.pools.get(elem, []) if t not in self.casts]

    def fresh(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def add(self, op: str, inputs: list[str], elem: int, **attrs: object) -> str:
        out = self.fresh("t")
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.fresh(op.lower()), **attrs))
        self.pools.setdefault(elem, []).append(out)
        return out

    def weight(self, elem: int, rng: np.random.Generator) -> str:
        name = self.fresh("w")
        value = rng.standard_normal((WIDTH, WIDTH)) / math.sqrt(WIDTH)
        self.inits.append(numpy_helper.from_array(value.astype(NP[elem]), name))
        return name

    def scalar(self, value: float, elem: int) -> str:
        name = self.fresh("c")
        self.inits.append(numpy_helper.from_array(np.array(value, dtype=NP[elem]), name))
        return name


def branch(b: Builder, draw: st.DrawFn, elem: int, depth: int) -> onnx.GraphProto:
    """A body that reads one or two outer tensors of ``elem``; may hold a nested If (outer cond)."""
    pool = b.outer(elem)
    a = draw(st.sampled_from(pool))
    c = draw(st.sampled_from(pool))
    out = b.fresh("br")
    nodes = [helper.make_node(draw(st.sampled_from(BINARY)), [a, c], [out])]
    if depth < 2 and TensorProto.BOOL in b.pools and draw(st.booleans()):
        cond = draw(st.sampled_from(b.pools[TensorProto.BOOL]))
        inner = b.fresh("nested")
        nodes.append(
            helper.make_node(
                "If",
                [cond],
                [inner],
                then_branch=branch(b, draw, elem, depth + 1),
                else_branch=branch(b, draw, elem, depth + 1),
            )
        )
        final = b.fresh("br")
        nodes.append(helper.make_node("Add", [out, inner], [final]))
        out = final
    return helper.make_graph(nodes, b.fresh("body"), [], [helper.make_tensor_value_info(out, elem, b.dims)])


@st.composite
def random_models(draw: st.DrawFn) -> tuple[onnx.ModelProto, dict[str, int]]:
    """A random valid model and the sizes of its symbolic dims at which to compare."""
    batch = draw(st.sampled_from(["N", 2]))
    rank3 = draw(st.booleans())
    dims: list[int | str] = [batch, draw(st.sampled_from(["S", 3])), WIDTH] if rank3 else [batch, WIDTH]
    b = Builder(dims)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)]
    b.pools[TensorProto.FLOAT] = ["x"]
    if draw(st.booleans()):
        inputs.append(helper.make_tensor_value_info("xi", TensorProto.INT32, dims))
        b.pools[TensorProto.INT32] = ["xi"]

    for _ in range(draw(st.integers(3, 18))):
        kinds = ["unary", "binary", "cast"]
        float_pools = [e for e in FLOATS if e in b.pools]
        if float_pools:
            kinds += ["matmul", "cond"]
        if TensorProto.BOOL in b.pools:
            kinds += ["if", "if"]
        repeatable = [
            n for n in b.nodes if n.op_type != "If" and any(n.output[0] in q for q in b.pools.values())
        ]
        if repeatable:
            kinds += ["repeat"]
        kind = draw(st.sampled_from(kinds))
        if kind == "repeat":  # an exact repeat of an earlier node: an equal value under a new name
            node = onnx.NodeProto()
            node.CopyFrom(draw(st.sampled_from(repeatable)))
            elem = next(e for e, q in b.pools.items() if node.output[0] in q)
            node.name, node.output[0] = b.fresh("repeat"), b.fresh("t")
            b.nodes.append(node)
            b.pools[elem].append(node.output[0])
            if node.op_type == "Cast":
                b.casts.add(node.output[0])
            continue
        elem = draw(st.sampled_from(sorted(e for e in b.pools if e != TensorProto.BOOL)))
        pool = b.pools[elem]
        if kind == "unary":
            src = draw(st.sampled_from(pool))
            made = b.add(draw(st.sampled_from(UNARY[elem])), [src], elem)
            if src in b.casts and b.nodes[-1].op_type == "Identity":  # onnxruntime removes it with the Cast
                b.casts.add(made)
        elif kind == "binary":  # any two earlier tensors: random skip connections
            b.add(draw(st.sampled_from(BINARY)), [draw(st.sampled_from(pool)) for _ in range(2)], elem)
        elif kind == "cast":
            src = draw(st.sampled_from(pool))
            to = draw(st.sampled_from([TensorProto.FLOAT, TensorProto.DOUBLE]))
            if elem in FLOATS:  # float -> int only through Tanh * 8: no overflow, no NaN
                to = draw(st.sampled_from([TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32]))
                if to == TensorProto.INT32:
                    src = b.add("Mul", [b.add("Tanh", [src], elem), b.scalar(8.0, elem)], elem)
            b.casts.add(b.add("Cast", [src], to, to=to))
        elif kind == "matmul":
            felem = draw(st.sampled_from(float_pools))
            b.add("MatMul", [draw(st.sampled_from(b.pools[felem])), b.weight(felem, rng)], felem)
        elif kind == "cond":
            felem = draw(st.sampled_from(float_pools))
            total = b.fresh("sum")
            b.nodes.append(
                helper.make_node(
                    "ReduceSum", [draw(st.sampled_from(b.pools[felem]))], [total], name=total, keepdims=0
                )
            )
            b.add("Greater", [total, b.scalar(0.0, felem)], TensorProto.BOOL)
        elif b.outer(elem):  # an If whose branches read outer tensors, maybe nested
            cond = draw(st.sampled_from(b.pools[TensorProto.BOOL]))
            then_g, else_g = branch(b, draw, elem, 0), branch(b, draw, elem, 0)
            b.add("If", [cond], elem, then_branch=then_g, else_branch=else_g)

    outputs: list[str] = []
    for elem, pool in b.pools.items():
        if elem != TensorProto.BOOL and pool[-1] not in outputs:
            outputs.append(pool[-1])
    extra = [t for pool in b.pools.values() for t in pool if t not in outputs and t != "xi"]
    if extra and draw(st.booleans()):  # an intermediate that is also a model output
        outputs.append(draw(st.sampled_from(extra)))
    types = {t: e for e, pool in b.pools.items() for t in pool}
    graph = helper.make_graph(
        b.nodes,
        "fuzz",
        inputs,
        [
            helper.make_tensor_value_info(t, types[t], [] if types[t] == TensorProto.BOOL else dims)
            for t in outputs
        ],
        initializer=b.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model, {"N": draw(st.sampled_from([1, 3])), "S": 5}


def feeds_at(model: onnx.ModelProto, sizes: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for inp in model.graph.input:
        tt = inp.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else sizes[d.dim_param] for d in tt.shape.dim]
        if tt.elem_type == TensorProto.INT32:
            feeds[inp.name] = rng.integers(-5, 6, size=shape).astype(np.int32)
        else:
            feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def assert_close(got: np.ndarray, want: np.ndarray, name: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, name
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want, err_msg=name)
    else:
        scale = float(np.max(np.abs(want[np.isfinite(want)]), initial=1.0))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale, err_msg=name)


@pytest.mark.exhaustive
@settings(
    max_examples=int(os.environ.get("ONNXPIPE_FUZZ_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=random_models(), data=st.data())
def test_any_cut_of_a_random_model_chains_back(
    case: tuple[onnx.ModelProto, dict[str, int]], data: st.DataObject
) -> None:
    model, sizes = case
    tmp = Path(tempfile.mkdtemp(prefix="onnxpipe-fuzz-"))
    try:
        path = tmp / "m.onnx"
        onnx.save_model(model, str(path))
        view = load_model(path)
        m = len(view.compute_nodes)
        k = data.draw(st.integers(1, min(m, 5)), label="k")
        cuts = sorted(data.draw(st.sets(st.integers(1, m - 1), min_size=k - 1, max_size=k - 1), label="cuts"))
        bounds = [0, *cuts, m]
        table = {name: t.nbytes() for name, t in view.tensors.items()}
        stages = assign_stages(view, bounds, table, [0.001] * k, [0.0] * k)
        plan = Plan(
            model_sha256=view.sha256,
            stages=stages,
            bottleneck_seconds=0.001,
            lower_bound_seconds=0.001,
            cost_source="fuzz",
            threads=1,
            bandwidth_bytes_per_s=math.inf,
            input_shapes={},
            tensor_bytes=table,
        )
        manifest = export_stages(view, plan, tmp / "out")
        assert manifest == load_manifest(tmp / "out")
        assert sum(s.node_count + s.skipped_node_count for s in manifest.stages) == m
        for entry in manifest.stages:  # symbolic dims stay symbolic on every boundary
            for t in entry.inputs + entry.outputs:
                if t.shape is not None and len(t.shape) > 1:
                    assert list(t.shape) == list(view.tensor(t.name).shape or ()), t

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        with StageChain.from_manifest(tmp / "out") as chain:
            for seed, batch in ((0, sizes["N"]), (1, 4)):
                feeds = feeds_at(model, {**sizes, "N": batch}, seed)
                want = dict(zip(names, session.run(names, feeds), strict=True))
                got = chain.run(feeds)
                for n in names:
                    assert_close(np.asarray(got[n]), want[n], n)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
