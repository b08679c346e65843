"""Builders of the small models the export tests split: control flow, odd graphs, quantized ops.

Every builder returns an :class:`onnx.ModelProto` that passes ``onnx.checker`` and runs in onnxruntime;
each docstring says what in it a splitter could get wrong.  Tests save them with :func:`save`, feed
them :func:`feeds_for` inputs, and cut them anywhere with :func:`plan_for` and :func:`all_bounds`.
Nothing here is committed as a file: the models are rebuilt every run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.ir.decoder import DecoderInfo
from onnxpipe.ir.load import view_from_proto
from onnxpipe.ir.model import ModelView
from onnxpipe.planning.stages import assign_stages
from onnxpipe.planning.types import Plan, StageSpec

OPSET = 17
FLOAT = TensorProto.FLOAT


def vi(name: str, dims: Sequence[int | str] | None, elem: int = FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, None if dims is None else list(dims))


def const(name: str, value: np.ndarray | float, dtype: type = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def make(
    nodes: Iterable[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
    *,
    name: str = "graph",
    opset: int = OPSET,
    domains: Sequence[tuple[str, int]] = (),
    functions: Sequence[onnx.FunctionProto] = (),
    ir_version: int = 8,
) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), initializer=list(initializers))
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in domains]
    model = helper.make_model(graph, opset_imports=imports, functions=list(functions))
    model.ir_version = ir_version
    return model


def view_of(
    nodes: Iterable[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
) -> ModelView:
    """The view of a one-graph model of ``nodes`` (what unit tests of one node's cost build)."""
    return view_from_proto(make(nodes, inputs, outputs, initializers))


def save(model: onnx.ModelProto, path: Path, *, check: bool = True) -> Path:
    if check:
        onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path


def feeds_for(model: onnx.ModelProto, seed: int = 0, **dims: int) -> dict[str, np.ndarray]:
    """Random inputs: symbolic dims take ``dims[name]`` (default 3); floats normal, ints small."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        tt = inp.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, 3) for d in tt.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[inp.name] = rng.random(shape) < 0.5
        else:
            feeds[inp.name] = rng.integers(0, 3, size=shape).astype(dtype)
    return feeds


def plan_for(view: ModelView, bounds: Sequence[int]) -> Plan:
    """A plan cutting ``view``'s compute nodes at ``bounds`` (made-up costs), as the partitioner would."""
    k = len(bounds) - 1
    sizes = {name: t.nbytes() for name, t in view.tensors.items()}
    stages = assign_stages(view, bounds, sizes, [0.001] * k, [0.0] * k)
    return Plan(
        model_sha256=view.sha256,
        stages=stages,
        bottleneck_seconds=0.001,
        lower_bound_seconds=0.001,
        cost_source="test",
        threads=1,
        bandwidth_bytes_per_s=math.inf,
        input_shapes={},
        tensor_bytes=sizes,
    )


def all_bounds(m: int, max_k: int) -> Iterator[list[int]]:
    """Every way to cut ``m`` nodes into 1 to ``max_k`` non-empty contiguous stages."""
    for k in range(1, min(m, max_k) + 1):
        for cuts in itertools.combinations(range(1, m), k - 1):
            yield [0, *cuts, m]


# --------------------------------------------------------------------------------------------------
# control flow


def _branch(name: str, nodes: list[onnx.NodeProto], out: str) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [vi(out, ["N", 4])])


def nested_if_model() -> onnx.ModelProto:
    """If nodes nested three deep; every level reads main-graph tensors that only the bodies read.

    Level 3 reads ``a`` (an activation made far earlier), ``w`` (an initializer), ``k`` (a Constant),
    ``cond3`` (its own condition, from the main graph) and ``t1``, which the level-1 body defines: ``t1``
    is *not* an outer read of the main-graph node.  The If sits late, so most cuts put ``a``, ``b`` and
    the conditions in earlier stages.
    """
    level3 = helper.make_node(
        "If",
        ["cond3"],
        ["l3"],
        name="if3",
        then_branch=_branch("then3", [helper.make_node("Add", ["a", "w"], ["t3"])], "t3"),
        else_branch=_branch(
            "else3",
            [helper.make_node("Mul", ["t1", "k"], ["e3a"]), helper.make_node("Sub", ["e3a", "b"], ["e3"])],
            "e3",
        ),
    )
    level2 = helper.make_node(
        "If",
        ["cond2"],
        ["l2"],
        name="if2",
        then_branch=_branch("then2", [level3, helper.make_node("Add", ["l3", "t1"], ["t2"])], "t2"),
        else_branch=_branch("else2", [helper.make_node("Mul", ["b", "w"], ["e2"])], "e2"),
    )
    level1 = helper.make_node(
        "If",
        ["cond1"],
        ["l1"],
        name="if1",
        then_branch=_branch(
            "then1",
            [helper.make_node("Neg", ["c"], ["t1"]), level2, helper.make_node("Identity", ["l2"], ["t1o"])],
            "t1o",
        ),
        else_branch=_branch("else1", [helper.make_node("Sub", ["a", "c"], ["e1"])], "e1"),
    )
    nodes = [
        helper.make_node("Constant", [], ["k"], name="k_const", value=const("", np.full(4, 3.0))),
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Sigmoid", ["x"], ["b"], name="sigmoid"),
        helper.make_node("Tanh", ["b"], ["c"], name="tanh"),
        helper.make_node("ReduceSum", ["x"], ["sx"], name="sum_x", keepdims=0),
        helper.make_node("Greater", ["sx", "zero"], ["cond1"], name="cond1"),
        helper.make_node("ReduceMax", ["a"], ["ma"], name="max_a", keepdims=0),
        helper.make_node("Greater", ["ma", "one"], ["cond2"], name="cond2"),
        helper.make_node("ReduceMin", ["x"], ["mx"], name="min_x", keepdims=0),
        helper.make_node("Less", ["mx", "minus_one"], ["cond3"], name="cond3"),
        helper.make_node("Abs", ["c"], ["d"], name="abs"),
        level1,
        helper.make_node("Add", ["l1", "d"], ["y"], name="out"),
    ]
    inits = [const("zero", 0.0), const("one", 1.0), const("minus_one", -1.0), const("w", np.arange(4.0))]
    return make(nodes, [vi("x", ["N", 4])], [vi("y", ["N", 4])], inits, name="nested_if")


def loop_model() -> onnx.ModelProto:
    """A Loop whose body reads ``a`` (made by an earlier node) and ``w`` (an initializer) from outside,
    and has an initializer of its own (``bias``, which savers with external data move out too).

    Outputs: the final loop-carried value and the scan output stacked over iterations (``[3, N, 4]``).
    """
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["v_in", "a"], ["v_sum"]),
            helper.make_node("Mul", ["v_sum", "w"], ["v_out"]),
            helper.make_node("Add", ["v_out", "bias"], ["v_biased"]),
            helper.make_node("Relu", ["v_biased"], ["s_out"]),
        ],
        "body",
        [vi("i", [], TensorProto.INT64), vi("cond_in", [], TensorProto.BOOL), vi("v_in", ["N", 4])],
        [vi("cond_out", [], TensorProto.BOOL), vi("v_out", ["N", 4]), vi("s_out", ["N", 4])],
        initializer=[const("bias", np.array([0.1, -0.1, 0.2, -0.2]))],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Tanh", ["x"], ["v0"], name="tanh"),
        helper.make_node("Neg", ["v0"], ["v0n"], name="neg"),
        helper.make_node(
            "Loop", ["trip", "keep_going", "v0n"], ["v_final", "stacked"], name="loop", body=body
        ),
        helper.make_node("Sigmoid", ["v_final"], ["y"], name="sigmoid"),
        helper.make_node("Abs", ["stacked"], ["z"], name="abs"),
    ]
    inits = [
        const("trip", 3, np.int64),
        const("keep_going", True, np.bool_),
        const("w", np.linspace(0.5, 0.8, 4)),
    ]
    return make(nodes, [vi("x", ["N", 4])], [vi("y", ["N", 4]), vi("z", [3, "N", 4])], inits, name="loop")


def scan_model() -> onnx.ModelProto:
    """A Scan over the time axis of ``x`` (``[T, 4]``) whose body reads ``g``, computed outside it."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "x_t"], ["s_sum"]),
            helper.make_node("Mul", ["s_sum", "g"], ["s_out"]),
            helper.make_node("Tanh", ["s_out"], ["y_t"]),
        ],
        "scan_body",
        [vi("s_in", [4]), vi("x_t", [4])],
        [vi("s_out", [4]), vi("y_t", [4])],
    )
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], name="mean", axes=[0], keepdims=0),
        helper.make_node("Sigmoid", ["m"], ["g"], name="gate"),
        helper.make_node("Relu", ["x"], ["xr"], name="relu"),
        helper.make_node("Scan", ["s0", "xr"], ["s_final", "ys"], name="scan", body=body, num_scan_inputs=1),
        helper.make_node("Neg", ["ys"], ["y"], name="neg"),
    ]
    return make(
        nodes,
        [vi("x", ["T", 4])],
        [vi("y", ["T", 4]), vi("s_final", [4])],
        [const("s0", np.zeros(4))],
        name="scan",
    )


# --------------------------------------------------------------------------------------------------
# functions, domains, quantization


def functions_model() -> onnx.ModelProto:
    """Local functions: ``local.Outer`` calls ``local.Inner`` (which uses ``com.microsoft``), and
    ``local.Unused`` is called by no node.  The stage holding ``outer`` needs both functions and the
    ``local`` and ``com.microsoft`` imports; the others need neither."""
    inner = helper.make_function(
        "local",
        "Inner",
        ["X"],
        ["Z"],
        [
            helper.make_node("Gelu", ["X"], ["T"], domain="com.microsoft"),
            helper.make_node("Mul", ["T", "X"], ["Z"]),
        ],
        [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)],
    )
    outer = helper.make_function(
        "local",
        "Outer",
        ["A"],
        ["B"],
        [helper.make_node("Inner", ["A"], ["T"], domain="local"), helper.make_node("Relu", ["T"], ["B"])],
        [helper.make_opsetid("", OPSET), helper.make_opsetid("local", 1)],
    )
    unused = helper.make_function(
        "local",
        "Unused",
        ["A"],
        ["B"],
        [helper.make_node("Neg", ["A"], ["B"])],
        [helper.make_opsetid("", OPSET)],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
        helper.make_node("Tanh", ["h"], ["h2"], name="tanh"),
        helper.make_node("Outer", ["h2"], ["o"], name="outer", domain="local"),
        helper.make_node("Neg", ["o"], ["y"], name="neg"),
    ]
    return make(
        nodes,
        [vi("x", ["N", 6])],
        [vi("y", ["N", 6])],
        name="functions",
        domains=[("local", 1), ("com.microsoft", 1)],
        functions=[inner, outer, unused],
    )


def quantized_model() -> onnx.ModelProto:
    """QuantizeLinear -> QLinearConv -> DequantizeLinear -> QuantizeLinear -> QLinearMatMul ->
    MatMulInteger -> Cast, with scales and zero points as initializers, some shared by several nodes.

    ``x`` is ``[N, 2, 5, 5]``; the integer tensors crossing cuts are uint8 and int32.
    """
    rng = np.random.default_rng(7)
    w_conv = rng.integers(0, 255, size=(3, 2, 3, 3)).astype(np.uint8)
    w_mm = rng.integers(0, 255, size=(27, 6)).astype(np.uint8)
    w_int = rng.integers(0, 255, size=(6, 5)).astype(np.uint8)
    inits = [
        const("x_scale", 0.05),
        const("x_zero", 128, np.uint8),
        const("wc", w_conv, np.uint8),
        const("wc_scale", 0.01),
        const("wc_zero", 127, np.uint8),
        const("c_scale", 0.1),
        const("c_zero", 100, np.uint8),
        const("bc", np.array([10, -20, 30]), np.int32),
        const("flat_shape", np.array([0, 27]), np.int64),
        const("wm", w_mm, np.uint8),
        const("wm_scale", 0.02),
        const("m_scale", 0.2),
        const("wi", w_int, np.uint8),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"], name="quant_x"),
        helper.make_node(
            "QLinearConv",
            ["xq", "x_scale", "x_zero", "wc", "wc_scale", "wc_zero", "c_scale", "c_zero", "bc"],
            ["cq"],
            name="qconv",
        ),
        helper.make_node("DequantizeLinear", ["cq", "c_scale", "c_zero"], ["cf"], name="dequant_c"),
        helper.make_node("Relu", ["cf"], ["cr"], name="relu"),
        helper.make_node("Reshape", ["cr", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node("QuantizeLinear", ["flat", "c_scale", "c_zero"], ["fq"], name="quant_flat"),
        helper.make_node(
            "QLinearMatMul",
            ["fq", "c_scale", "c_zero", "wm", "wm_scale", "x_zero", "m_scale", "c_zero"],
            ["mq"],
            name="qmatmul",
        ),
        helper.make_node("MatMulInteger", ["mq", "wi", "c_zero", "x_zero"], ["mi"], name="matmul_int"),
        helper.make_node("Cast", ["mi"], ["mf"], name="cast", to=FLOAT),
        helper.make_node("Mul", ["mf", "wc_scale"], ["y"], name="rescale"),
    ]
    return make(nodes, [vi("x", ["N", 2, 5, 5])], [vi("y", ["N", 5])], inits, name="quantized")


def contrib_model() -> onnx.ModelProto:
    """``com.microsoft`` ops (unknown to ONNX shape inference) between standard ones."""
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
        helper.make_node("Gelu", ["h"], ["g"], name="gelu", domain="com.microsoft"),
        helper.make_node("FastGelu", ["g", "bias"], ["f"], name="fastgelu", domain="com.microsoft"),
        helper.make_node("Tanh", ["f"], ["y"], name="tanh"),
    ]
    return make(
        nodes,
        [vi("x", ["N", 6])],
        [vi("y", ["N", 6])],
        [const("bias", np.linspace(-1, 1, 6))],
        name="contrib",
        domains=[("com.microsoft", 1)],
    )


# --------------------------------------------------------------------------------------------------
# weights


def shared_weights_model(width: int = 16) -> onnx.ModelProto:
    """Four MatMuls that all read ``w_shared`` (1 KiB), each also with its own weight: any K-way cut
    copies ``w_shared`` into every stage, and the manifest must count the copies."""
    rng = np.random.default_rng(3)
    inits = [const("w_shared", rng.standard_normal((width, width)) * 0.2)]
    nodes = []
    x = "x"
    for i in range(4):
        inits.append(const(f"w{i}", rng.standard_normal((width, width)) * 0.2))
        nodes += [
            helper.make_node("MatMul", [x, "w_shared"], [f"s{i}"], name=f"shared_mm{i}"),
            helper.make_node("MatMul", [f"s{i}", f"w{i}"], [f"o{i}"], name=f"own_mm{i}"),
            helper.make_node("Tanh", [f"o{i}"], [f"t{i}"], name=f"tanh{i}"),
        ]
        x = f"t{i}"
    nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    return make(nodes, [vi("x", ["N", width])], [vi("y", ["N", width])], inits, name="shared")


def ir3_model() -> onnx.ModelProto:
    """IR version 3, opset 8: every initializer is also listed as a graph input (old exporters did so)."""
    inits = [const("w", np.eye(4) * 2), const("b", np.ones(4))]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b"], ["hb"], name="add"),
        helper.make_node("Relu", ["hb"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w"], ["y"], name="mm2"),
    ]
    model = make(
        nodes,
        [vi("x", [2, 4]), vi("w", [4, 4]), vi("b", [4])],
        [vi("y", [2, 4])],
        inits,
        name="ir3",
        opset=8,
        ir_version=3,
    )
    return model


# --------------------------------------------------------------------------------------------------
# odd graphs


def optional_io_model() -> onnx.ModelProto:
    """Nodes with empty-name optional inputs and outputs.

    ``Clip`` has no ``min`` (``""``) but a ``max``; ``LayerNormalization`` lists an empty middle output and
    a named last one (its inverse std dev) that a later stage reads; ``Resize`` has an empty ``roi``.
    """
    nodes = [
        helper.make_node("Clip", ["x", "", "hi"], ["c"], name="clip"),
        helper.make_node("LayerNormalization", ["c", "gamma"], ["ln", "", "inv_std"], name="ln", axis=-1),
        helper.make_node("Relu", ["ln"], ["r"], name="relu"),
        helper.make_node("Unsqueeze", ["r", "axes"], ["r4"], name="unsq"),
        helper.make_node("Resize", ["r4", "", "scales"], ["up"], name="resize", mode="nearest"),
        helper.make_node("ReduceMean", ["up", "axes"], ["down"], name="squeeze_mean", keepdims=0),
        helper.make_node("ReduceMean", ["down", "last"], ["dm"], name="mean", keepdims=1),
        helper.make_node("Mul", ["dm", "inv_std"], ["y"], name="mul"),
    ]
    inits = [
        const("hi", 0.7),
        const("gamma", np.linspace(0.5, 1.5, 6)),
        const("axes", np.array([1]), np.int64),
        const("last", np.array([-1]), np.int64),
        const("scales", np.array([1.0, 2.0, 1.0])),
    ]
    return make(nodes, [vi("x", ["N", 6])], [vi("y", ["N", 1])], inits, name="optional_io", opset=18)


def fanout_model() -> onnx.ModelProto:
    """One node with several outputs read by different stages, and model outputs of every odd kind.

    ``split`` makes ``p0, p1, p2``, read by nodes far apart; ``h`` is a graph output that later nodes also
    read; ``x`` (a model input) and ``w_out`` (an initializer) are model outputs as they are; ``k_out`` is
    a model output that a Constant node makes.
    """
    nodes = [
        helper.make_node("Constant", [], ["k_out"], name="k_const", value=const("", np.array([1.0, 2.0]))),
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
        helper.make_node("Split", ["h"], ["p0", "p1", "p2"], name="split", axis=1, num_outputs=3),
        helper.make_node("Tanh", ["p0"], ["q0"], name="tanh"),
        helper.make_node("Sigmoid", ["q0"], ["q1"], name="sigmoid"),
        helper.make_node("Add", ["q1", "p1"], ["q2"], name="add_p1"),
        helper.make_node("Neg", ["q2"], ["q3"], name="neg"),
        helper.make_node("Mul", ["q3", "p2"], ["q4"], name="mul_p2"),
        helper.make_node("Concat", ["q4", "h"], ["y"], name="concat_h", axis=1),
    ]
    return make(
        nodes,
        [vi("x", ["N", 6])],
        [vi("y", ["N", 8]), vi("h", ["N", 6]), vi("x", ["N", 6]), vi("w_out", [3]), vi("k_out", [2])],
        [const("w_out", np.array([1.0, -1.0, 0.5]))],
        name="fanout",
        opset=18,
    )


def annotated_model() -> onnx.ModelProto:
    """A quantized chain with ``graph.quantization_annotation`` entries for ``a`` and ``y``."""
    model = make(
        [
            helper.make_node("Relu", ["x"], ["a"], name="relu"),
            helper.make_node("Tanh", ["a"], ["b"], name="tanh"),
            helper.make_node("Mul", ["b", "s"], ["y"], name="mul"),
        ],
        [vi("x", ["N", 4])],
        [vi("y", ["N", 4])],
        [const("s", 0.5), const("a_scale", 0.1), const("a_zero", 3, np.uint8)],
        name="annotated",
    )
    for tensor in ("a", "y"):
        ann = model.graph.quantization_annotation.add()
        ann.tensor_name = tensor
        for key, value in (("SCALE_TENSOR", "a_scale"), ("ZERO_POINT_TENSOR", "a_zero")):
            entry = ann.quant_parameter_tensor_names.add()
            entry.key, entry.value = key, value
    return model


def training_model() -> onnx.ModelProto:
    """A model that carries ``training_info`` (an algorithm updating its weight ``w``)."""
    model = make(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Relu", ["h"], ["y"], name="relu"),
        ],
        [vi("x", ["N", 4])],
        [vi("y", ["N", 4])],
        [const("w", np.eye(4))],
        name="trainable",
    )
    algorithm = helper.make_graph(
        [helper.make_node("Mul", ["w", "lr"], ["w_new"])],
        "update",
        [],
        [vi("w_new", [4, 4])],
        initializer=[const("lr", 0.9)],
    )
    info = model.training_info.add()
    info.algorithm.CopyFrom(algorithm)
    binding = info.update_binding.add()
    binding.key, binding.value = "w", "w_new"
    return model


def shape_arithmetic_model() -> onnx.ModelProto:
    """What torch exporters write for position ids: ``pos[:, :seq] + arange(seq)``, the length taken
    from the input's shape at run time (ONNX's inference leaves ``seq`` there as ``unk__``)."""
    ints = {"one": 1, "zero": 0, "step": 1}
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items()]
    inits += [
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array([0], np.int64), "start"),
        numpy_helper.from_array(np.arange(512, dtype=np.int64)[None], "pos"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "one"], ["n"], axis=0, name="len"),
        helper.make_node("Range", ["zero", "n", "step"], ["r"], name="range"),
        helper.make_node("Unsqueeze", ["r", "axis0"], ["ru"], name="ru"),
        helper.make_node("Unsqueeze", ["n", "axis0"], ["end"], name="end"),
        helper.make_node("Slice", ["pos", "start", "end", "axis1"], ["p"], name="slice"),
        helper.make_node("Add", ["p", "ru"], ["q"], name="add"),
        helper.make_node("Cast", ["q"], ["qf"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Mul", ["x", "qf"], ["y"], name="mul"),
    ]
    graph = helper.make_graph(nodes, "g", [vi("x", ["batch", "seq"])], [vi("y", ["batch", "seq"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def dominated_head_model(width: int = 128, vocab: int = 4096, layers: int = 4) -> onnx.ModelProto:
    """An MLP whose last MatMul (with a bias Add) holds most of the time: an LM head in small.

    ``x`` [batch, width] -> ``logits`` [batch, vocab]; what node splitting exists for."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        inits.append(const(f"w{i}", rng.standard_normal((width, width)) * 0.05))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"relu{i}"))
        x = f"r{i}"
    inits += [
        const("head", rng.standard_normal((width, vocab)) * 0.05),
        const("bias", rng.standard_normal(vocab)),
    ]
    nodes.append(helper.make_node("MatMul", [x, "head"], ["pre"], name="head_mm"))
    nodes.append(helper.make_node("Add", ["pre", "bias"], ["logits"], name="head_bias"))
    return make(nodes, [vi("x", ["batch", width])], [vi("logits", ["batch", vocab])], inits)


def runtimes_differ_model() -> onnx.ModelProto:
    """Two resizes on which other runtimes differ from onnxruntime by themselves, whole or split: a cubic
    one with ``exclude_outside`` (OpenVINO), a linear one with ``align_corners`` (tract).  Between them
    and around them, elementwise nodes for a split to cut at: the stages on such a runtime equal the
    whole model there, and both differ from onnxruntime (what ``verify --runtime`` must tell apart)."""
    scales = const("scales", [1.0, 1.0, 1.7, 1.7])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Add", ["r", "x"], ["a"]),
        helper.make_node(
            "Resize", ["a", "", "scales"], ["c"], mode="cubic", exclude_outside=1, cubic_coeff_a=-0.5
        ),
        helper.make_node("Tanh", ["c"], ["t"]),
        helper.make_node(
            "Resize",
            ["t", "", "scales"],
            ["l"],
            mode="linear",
            coordinate_transformation_mode="align_corners",
        ),
        helper.make_node("Sigmoid", ["l"], ["y"]),
    ]
    return make(nodes, [vi("x", [1, 1, 5, 5])], [vi("y", [1, 1, "h", "w"])], [scales])


def fp16_keep_io_model(layers: int = 4, width: int = 16) -> onnx.ModelProto:
    """A float32 MatMul-Tanh chain converted to float16 by onnxruntime's converter with
    ``keep_io_types=True``, as users convert models: float32 inputs and outputs cast around a float16
    graph, and the input's Cast appended after the nodes that read it, so ``onnx.checker`` refuses the
    node order (onnxruntime runs it).  The one builder here whose model the checker refuses."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i in range(layers):
        weights.append(const(f"w{i}", rng.standard_normal((width, width)) * 0.3))
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
            helper.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"tanh{i}"),
        ]
        x = f"t{i}"
    model = make(nodes, [vi("x", ["b", width])], [vi(x, ["b", width])], weights)
    converted: onnx.ModelProto = convert_float_to_float16(model, keep_io_types=True)
    return converted


def constant_weights_model(layers: int = 3, width: int = 16) -> onnx.ModelProto:
    """MatMul-Add-Tanh layers whose biases are ``Constant`` nodes, as optimum's fp32 exports hold some
    weights; saved with :func:`save_external_constants`, their values live in the weights file, read
    relative to the model's folder (never the working directory)."""
    rng = np.random.default_rng(1)
    nodes, weights, x = [], [], "x"
    for i in range(layers):
        weights.append(const(f"w{i}", rng.standard_normal((width, width)) * 0.3))
        bias = const(f"b{i}_value", rng.standard_normal((width,)))
        nodes += [
            helper.make_node("Constant", [], [f"b{i}"], name=f"bias{i}", value=bias),
            helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
            helper.make_node("Tanh", [f"a{i}"], [f"t{i}"], name=f"tanh{i}"),
        ]
        x = f"t{i}"
    return make(nodes, [vi("x", [2, width])], [vi(x, [2, width])], weights)


def save_external_constants(model: onnx.ModelProto, path: Path) -> Path:
    """``model`` saved with every tensor, the ``Constant`` nodes' values too, in ``<name>_data`` beside it."""
    from onnx.external_data_helper import convert_model_to_external_data

    path.parent.mkdir(parents=True, exist_ok=True)
    convert_model_to_external_data(
        model, location=f"{path.name}_data", size_threshold=0, convert_attribute=True
    )
    onnx.save_model(model, str(path))
    return path


def kv_split_layers(view: ModelView, dec: DecoderInfo, stages: Sequence[StageSpec]) -> list[int]:
    """Layers whose cache tensors are read or made by more than one stage (none after layer cuts)."""
    stage_of = {n: st.index for st in stages for n in st.node_names}
    split: list[int] = []
    for p in dec.kv:
        where: set[int] = set()
        for t in p.presents:
            pos = view.producer.get(t)
            if pos is not None:
                where.add(stage_of.get(view.nodes[pos].name, -1))
        for t in p.pasts:
            for q in view.consumers.get(t, ()):
                node = view.nodes[q]
                if node.name in stage_of and node.op_type not in ("Shape", "Size"):
                    where.add(stage_of[node.name])
        if len(where) > 1:
            split.append(p.layer)
    return split
