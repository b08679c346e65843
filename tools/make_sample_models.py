"""Write the small sample models that onnxpipe's tests, docs and examples use.

    python tools/make_sample_models.py [--out sample_models]

Every model is built with ``onnx.helper`` from seeded numpy weights (no torch), so a run writes the same
bytes every time: ``tests/test_sample_models.py`` regenerates them and compares with the committed files.
Each model has a dynamic batch dimension named ``batch`` on its inputs and outputs, passes
``onnx.checker.check_model(full_check=True)`` and runs in onnxruntime.

- ``resnet_tiny.onnx``: a CIFAR-sized ResNet (Conv + BatchNormalization + Relu blocks, Add skips, two
  downsampling blocks with 1x1 projection skips, GlobalAveragePool, Flatten, Gemm).
- ``transformer_tiny.onnx``: a 2-block pre-LN causal transformer LM built from primitive ops (Gather
  embeddings, LayerNormalization, MatMul/Add, Reshape/Transpose heads fed by Shape/Gather/Concat
  subgraphs, Softmax attention with a causal mask, Erf-based GELU), symbolic ``seq``.
- ``mlp.onnx``: five dense layers mixing Gemm and MatMul + Add.

Two more models need what random inputs at guessed sizes cannot give (:data:`REAL_INPUT_BUILDERS`):

- ``vad_like.onnx``: shaped like a voice-activity detector: ``input`` ``[?, ?]`` and ``state``
  ``[2, ?, 128]`` with unnamed dims (the state's rows must equal the input's batch: a ``Concat``
  joins them), and an ``sr`` scalar whose value picks an ``If`` branch: 16000 reflect-pads the audio by
  64 samples, any other rate reads sample 1000000 and fails.  It runs only on real inputs (``--inputs``).
- ``reflect_pad.onnx``: ``x`` ``[batch, seq]`` reflect-padded by 64 samples, which fails at the guessed
  sequence size of 16 and runs at 512 (a measured profile's retry).

Change a model only on purpose: tests and recorded benchmark results refer to these files.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17; pinned so newer onnx releases write the same bytes
PRODUCER_NAME = "onnxpipe-tools"
PRODUCER_VERSION = "1"
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "sample_models"


class GraphBuilder:
    """Collects nodes and initializers under readable, unique names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._tensor_names: set[str] = set()
        self._node_names: set[str] = set()

    def _unique(self, name: str, seen: set[str] | None = None) -> str:
        seen = self._tensor_names if seen is None else seen
        if name in seen:
            raise ValueError(f"duplicate name {name!r}")
        seen.add(name)
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        """Add an initializer and return its name."""
        self.initializers.append(numpy_helper.from_array(np.asarray(value, order="C"), self._unique(name)))
        return name

    def normal(self, name: str, shape: Sequence[int], std: float) -> str:
        return self.const(name, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def op(self, op_type: str, name: str, inputs: Sequence[str], output: str = "", **attrs: Any) -> str:
        """Add node ``name`` with one output, named ``output`` or else after the node; return it."""
        return self.op_n(op_type, name, inputs, [output or name], **attrs)[0]

    def op_n(
        self, op_type: str, name: str, inputs: Sequence[str], outputs: Sequence[str], **attrs: Any
    ) -> list[str]:
        """Add node ``name`` with the given outputs; return them."""
        for out in outputs:
            self._unique(out)
        self._unique(name, self._node_names)
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs), name=name, **attrs))
        return list(outputs)

    def model(
        self,
        graph_name: str,
        inputs: Sequence[onnx.ValueInfoProto],
        outputs: Sequence[onnx.ValueInfoProto],
        doc: str,
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, graph_name, list(inputs), list(outputs), self.initializers)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name=PRODUCER_NAME,
            producer_version=PRODUCER_VERSION,
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        model.model_version = 1
        return model


# ---------------------------------------------------------------------------------------------- resnet


def _conv_bn(
    g: GraphBuilder, prefix: str, x: str, c_in: int, c_out: int, kernel: int, stride: int, relu: bool
) -> str:
    """Conv (no bias) + BatchNormalization (+ Relu), as exported from a PyTorch ResNet before folding."""
    fan_in = c_in * kernel * kernel
    w = g.normal(f"{prefix}.conv.weight", (c_out, c_in, kernel, kernel), math.sqrt(2.0 / fan_in))
    pad = kernel // 2
    y = g.op(
        "Conv",
        f"{prefix}.conv",
        [x, w],
        kernel_shape=[kernel, kernel],
        strides=[stride, stride],
        pads=[pad, pad, pad, pad],
    )
    scale = g.const(f"{prefix}.bn.weight", (1.0 + 0.1 * g.rng.standard_normal(c_out)).astype(np.float32))
    bias = g.const(f"{prefix}.bn.bias", (0.1 * g.rng.standard_normal(c_out)).astype(np.float32))
    mean = g.const(f"{prefix}.bn.running_mean", (0.1 * g.rng.standard_normal(c_out)).astype(np.float32))
    var = g.const(f"{prefix}.bn.running_var", g.rng.uniform(0.5, 1.5, c_out).astype(np.float32))
    y = g.op("BatchNormalization", f"{prefix}.bn", [y, scale, bias, mean, var], epsilon=1e-5)
    if relu:
        y = g.op("Relu", f"{prefix}.relu", [y])
    return y


def _basic_block(g: GraphBuilder, prefix: str, x: str, c_in: int, c_out: int, stride: int) -> str:
    y = _conv_bn(g, f"{prefix}.conv1", x, c_in, c_out, 3, stride, relu=True)
    y = _conv_bn(g, f"{prefix}.conv2", y, c_out, c_out, 3, 1, relu=False)
    skip = x
    if stride != 1 or c_in != c_out:
        skip = _conv_bn(g, f"{prefix}.downsample", x, c_in, c_out, 1, stride, relu=False)
    y = g.op("Add", f"{prefix}.add", [y, skip])
    return g.op("Relu", f"{prefix}.relu", [y])


def build_resnet_tiny() -> onnx.ModelProto:
    g = GraphBuilder(seed=1)
    x = _conv_bn(g, "stem", "image", 3, 16, 3, 1, relu=True)
    x = _basic_block(g, "layer1.0", x, 16, 16, 1)
    x = _basic_block(g, "layer2.0", x, 16, 32, 2)
    x = _basic_block(g, "layer3.0", x, 32, 64, 2)
    x = _basic_block(g, "layer3.1", x, 64, 64, 1)
    x = g.op("GlobalAveragePool", "avgpool", [x])
    x = g.op("Flatten", "flatten", [x], axis=1)
    w = g.normal("fc.weight", (10, 64), 1.0 / math.sqrt(64))
    b = g.normal("fc.bias", (10,), 0.01)
    g.op("Gemm", "fc", [x, w, b], output="logits", transB=1)
    return g.model(
        "resnet_tiny",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        "A tiny CIFAR-sized ResNet with random weights (tools/make_sample_models.py).",
    )


# ----------------------------------------------------------------------------------------- transformer

VOCAB = 256
D_MODEL = 64
N_HEAD = 4
HEAD_DIM = D_MODEL // N_HEAD
D_MLP = 4 * D_MODEL
N_LAYER = 2
MAX_POS = 128


def _layer_norm(g: GraphBuilder, prefix: str, x: str) -> str:
    gamma = g.const(f"{prefix}.weight", (1.0 + 0.05 * g.rng.standard_normal(D_MODEL)).astype(np.float32))
    beta = g.const(f"{prefix}.bias", (0.05 * g.rng.standard_normal(D_MODEL)).astype(np.float32))
    return g.op("LayerNormalization", prefix, [x, gamma, beta], axis=-1, epsilon=1e-5)


def _linear(g: GraphBuilder, prefix: str, x: str, d_in: int, d_out: int) -> str:
    """MatMul + Add with a [d_in, d_out] weight, as torch exports ``nn.Linear`` on 3-D inputs."""
    w = g.normal(f"{prefix}.weight", (d_in, d_out), 1.0 / math.sqrt(d_in))
    b = g.normal(f"{prefix}.bias", (d_out,), 0.02)
    y = g.op("MatMul", f"{prefix}.matmul", [x, w])
    return g.op("Add", f"{prefix}.add", [y, b])


def _gelu(g: GraphBuilder, prefix: str, x: str) -> str:
    """0.5 * x * (1 + erf(x / sqrt(2))), the exact GELU as opset-17 exporters write it."""
    y = g.op("Div", f"{prefix}.div", [x, "sqrt2"])
    y = g.op("Erf", f"{prefix}.erf", [y])
    y = g.op("Add", f"{prefix}.add_one", [y, "one"])
    y = g.op("Mul", f"{prefix}.mul_x", [x, y])
    return g.op("Mul", f"{prefix}.mul_half", [y, "half"])


def _attention(g: GraphBuilder, prefix: str, x: str, mask: str) -> str:
    # Reshape targets come from the block's own input shape, as in traced exports.
    shape = g.op("Shape", f"{prefix}.shape", [x])
    batch = g.op("Gather", f"{prefix}.shape.batch", [shape, "idx0"], axis=0)
    seq = g.op("Gather", f"{prefix}.shape.seq", [shape, "idx1"], axis=0)
    batch_1d = g.op("Unsqueeze", f"{prefix}.shape.batch_1d", [batch, "axes0"])
    seq_1d = g.op("Unsqueeze", f"{prefix}.shape.seq_1d", [seq, "axes0"])
    heads_shape = g.op(
        "Concat", f"{prefix}.shape.heads", [batch_1d, seq_1d, "n_head_1d", "head_dim_1d"], axis=0
    )
    merged_shape = g.op("Concat", f"{prefix}.shape.merged", [batch_1d, seq_1d, "d_model_1d"], axis=0)

    qkv = _linear(g, f"{prefix}.qkv", x, D_MODEL, 3 * D_MODEL)
    q, k, v = g.op_n(
        "Split", f"{prefix}.split", [qkv, "qkv_split"], [f"{prefix}.{t}" for t in "qkv"], axis=-1
    )
    q = g.op("Reshape", f"{prefix}.q.reshape", [q, heads_shape])
    k = g.op("Reshape", f"{prefix}.k.reshape", [k, heads_shape])
    v = g.op("Reshape", f"{prefix}.v.reshape", [v, heads_shape])
    q = g.op("Transpose", f"{prefix}.q.transpose", [q], perm=[0, 2, 1, 3])  # [b, h, s, d]
    k = g.op("Transpose", f"{prefix}.k.transpose", [k], perm=[0, 2, 3, 1])  # [b, h, d, s]
    v = g.op("Transpose", f"{prefix}.v.transpose", [v], perm=[0, 2, 1, 3])  # [b, h, s, d]

    scores = g.op("MatMul", f"{prefix}.scores", [q, k])
    scores = g.op("Mul", f"{prefix}.scale", [scores, "attn_scale"])
    # causal mask: the top-left [seq, seq] corner of a [MAX_POS, MAX_POS] additive mask
    mask_ends = g.op("Concat", f"{prefix}.mask.ends", [seq_1d, seq_1d], axis=0)
    causal = g.op("Slice", f"{prefix}.mask.slice", [mask, "zeros_2", mask_ends, "axes_01"])
    scores = g.op("Add", f"{prefix}.mask.add", [scores, causal])
    probs = g.op("Softmax", f"{prefix}.softmax", [scores], axis=-1)

    ctx = g.op("MatMul", f"{prefix}.context", [probs, v])
    ctx = g.op("Transpose", f"{prefix}.context.transpose", [ctx], perm=[0, 2, 1, 3])
    ctx = g.op("Reshape", f"{prefix}.context.reshape", [ctx, merged_shape])
    return _linear(g, f"{prefix}.out_proj", ctx, D_MODEL, D_MODEL)


def _block(g: GraphBuilder, prefix: str, x: str, mask: str) -> str:
    h = _layer_norm(g, f"{prefix}.ln_1", x)
    h = _attention(g, f"{prefix}.attn", h, mask)
    x = g.op("Add", f"{prefix}.attn.residual", [x, h])
    h = _layer_norm(g, f"{prefix}.ln_2", x)
    h = _linear(g, f"{prefix}.mlp.fc_in", h, D_MODEL, D_MLP)
    h = _gelu(g, f"{prefix}.mlp.gelu", h)
    h = _linear(g, f"{prefix}.mlp.fc_out", h, D_MLP, D_MODEL)
    return g.op("Add", f"{prefix}.mlp.residual", [x, h])


def build_transformer_tiny() -> onnx.ModelProto:
    g = GraphBuilder(seed=2)
    i64 = np.int64
    # small shared constants
    g.const("idx0", np.array(0, i64))
    g.const("idx1", np.array(1, i64))
    g.const("axes0", np.array([0], i64))
    g.const("n_head_1d", np.array([N_HEAD], i64))
    g.const("head_dim_1d", np.array([HEAD_DIM], i64))
    g.const("d_model_1d", np.array([D_MODEL], i64))
    g.const("qkv_split", np.array([D_MODEL] * 3, i64))
    g.const("zeros_2", np.array([0, 0], i64))
    g.const("axes_01", np.array([0, 1], i64))
    g.const("attn_scale", np.array(1.0 / math.sqrt(HEAD_DIM), np.float32))
    g.const("sqrt2", np.array(math.sqrt(2.0), np.float32))
    g.const("one", np.array(1.0, np.float32))
    g.const("half", np.array(0.5, np.float32))
    g.const("pos_start", np.array(0, i64))
    g.const("pos_step", np.array(1, i64))
    mask = g.const("causal_mask", np.triu(np.full((MAX_POS, MAX_POS), -1e4, np.float32), k=1))

    wte = g.normal("wte.weight", (VOCAB, D_MODEL), 0.1)
    wpe = g.normal("wpe.weight", (MAX_POS, D_MODEL), 0.05)
    tok = g.op("Gather", "wte", [wte, "tokens"], axis=0)  # [b, s, d]
    shape = g.op("Shape", "positions.shape", ["tokens"])
    seq = g.op("Gather", "positions.seq", [shape, "idx1"], axis=0)
    pos_ids = g.op("Range", "positions.range", ["pos_start", seq, "pos_step"])
    pos = g.op("Gather", "wpe", [wpe, pos_ids], axis=0)  # [s, d]
    x = g.op("Add", "embeddings.add", [tok, pos])

    for i in range(N_LAYER):
        x = _block(g, f"h.{i}", x, mask)
    x = _layer_norm(g, "ln_f", x)
    w = g.normal("lm_head.weight", (D_MODEL, VOCAB), 1.0 / math.sqrt(D_MODEL))
    g.op("MatMul", "lm_head", [x, w], output="logits")
    return g.model(
        "transformer_tiny",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", VOCAB])],
        f"A tiny {N_LAYER}-block causal transformer LM with random weights (tools/make_sample_models.py); "
        f"tokens < {VOCAB}, seq <= {MAX_POS}.",
    )


# ------------------------------------------------------------------------------------------------- mlp


def build_mlp() -> onnx.ModelProto:
    g = GraphBuilder(seed=3)
    widths = [64, 128, 128, 64, 32, 10]
    x = "x"
    for i, (d_in, d_out) in enumerate(itertools.pairwise(widths)):
        prefix = f"fc{i + 1}"
        last = i == len(widths) - 2
        if i % 2 == 0:  # Gemm with a torch-style [out, in] weight
            w = g.normal(f"{prefix}.weight", (d_out, d_in), math.sqrt(2.0 / d_in))
            b = g.normal(f"{prefix}.bias", (d_out,), 0.02)
            x = g.op("Gemm", f"{prefix}.gemm", [x, w, b], output="y" if last else "", transB=1)
        else:  # MatMul + Add with an [in, out] weight
            w = g.normal(f"{prefix}.weight", (d_in, d_out), math.sqrt(2.0 / d_in))
            b = g.normal(f"{prefix}.bias", (d_out,), 0.02)
            x = g.op("MatMul", f"{prefix}.matmul", [x, w])
            x = g.op("Add", f"{prefix}.add", [x, b], output="y" if last else "")
        if not last:
            x = g.op("Relu", f"{prefix}.relu", [x])
    return g.model(
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", widths[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", widths[-1]])],
        "A five-layer MLP with random weights (tools/make_sample_models.py).",
    )


# ------------------------------------------------------------------------------------------------- CLI

BUILDERS: dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet_tiny": build_resnet_tiny,
    "transformer_tiny": build_transformer_tiny,
    "mlp": build_mlp,
}


def _vad_body(g: GraphBuilder, feat: str) -> tuple[str, str]:
    """The part after the features: state rows and features joined (equal batches), two layers."""
    zero = g.const("idx0", np.array(0, dtype=np.int64))
    one = g.const("idx1", np.array(1, dtype=np.int64))
    s0 = g.op("Gather", "state.h", ["state", zero], axis=0)
    s1 = g.op("Gather", "state.c", ["state", one], axis=0)
    joined = g.op("Concat", "join", [s0, feat], axis=1)  # [B, 129]: the batches must agree
    h = g.op("MatMul", "fc1.matmul", [joined, g.normal("fc1.weight", (129, 128), 0.1)])
    h = g.op("Tanh", "fc1.tanh", [h])
    c = g.op("Add", "cell.add", [h, s1])
    p = g.op("MatMul", "fc2.matmul", [c, g.normal("fc2.weight", (128, 1), 0.1)])
    prob = g.op("Sigmoid", "fc2.sigmoid", [p], output="prob")
    axes = g.const("axes0", np.array([0], dtype=np.int64))
    hu = g.op("Unsqueeze", "state_out.h", [h, axes])
    cu = g.op("Unsqueeze", "state_out.c", [c, axes])
    state_n = g.op("Concat", "state_out", [hu, cu], output="stateN", axis=0)
    return prob, state_n


def build_vad_like() -> onnx.ModelProto:
    g = GraphBuilder(seed=4)
    pads = numpy_helper.from_array(np.array([0, 64, 0, 64], dtype=np.int64), "pads")
    far = numpy_helper.from_array(np.array([1_000_000], dtype=np.int64), "far")
    f32_2d = helper.make_tensor_value_info("feat_branch", TensorProto.FLOAT, [None, 1])
    then_graph = helper.make_graph(
        [
            helper.make_node("Pad", ["input", "pads"], ["padded"], name="pad16k", mode="reflect"),
            helper.make_node("ReduceMean", ["padded"], ["feat_branch"], name="mean16k", axes=[1], keepdims=1),
        ],
        "rate_16k",
        [],
        [f32_2d],
        [pads],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Gather", ["input", "far"], ["feat_branch"], name="other_rate", axis=1)],
        "other_rate",
        [],
        [f32_2d],
        [far],
    )
    rate = g.const("rate16k", np.array(16000, dtype=np.int64))
    is16k = g.op("Equal", "is_16k", ["sr", rate])
    feat = g.op("If", "by_rate", [is16k], then_branch=then_graph, else_branch=else_graph)
    _vad_body(g, feat)
    return g.model(
        "vad_like",
        [
            helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, None]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, None, 128]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info("prob", TensorProto.FLOAT, [None, 1]),
            helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, None, 128]),
        ],
        "Shaped like a voice-activity detector; runs only on real inputs (tools/make_sample_models.py).",
    )


def build_reflect_pad() -> onnx.ModelProto:
    g = GraphBuilder(seed=5)
    pads = g.const("pads", np.array([0, 64, 0, 64], dtype=np.int64))
    x = g.op("Pad", "pad", ["x", pads], mode="reflect")
    x = g.op("Mul", "scale", [x, g.const("two", np.array(2.0, dtype=np.float32))])
    x = g.op("Tanh", "tanh", [x])
    x = g.op("ReduceMean", "mean", [x], axes=[1], keepdims=1)
    g.op("Sigmoid", "sigmoid", [x], output="y")
    return g.model(
        "reflect_pad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        "A reflect pad of 64 samples: runs from 65 samples on (tools/make_sample_models.py).",
    )


REAL_INPUT_BUILDERS: dict[str, Callable[[], onnx.ModelProto]] = {
    "vad_like": build_vad_like,
    "reflect_pad": build_reflect_pad,
}
"""Models that need what random inputs at guessed sizes cannot give (``--inputs``, a larger size)."""


def write_real_input_models(out: Path) -> list[Path]:
    """Build, check and write :data:`REAL_INPUT_BUILDERS`' models into ``out``; return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, build in REAL_INPUT_BUILDERS.items():
        model = build()
        onnx.checker.check_model(model, full_check=True)
        path = out / f"{name}.onnx"
        path.write_bytes(model.SerializeToString(deterministic=True))
        paths.append(path)
    return paths


def write_all(out: Path) -> list[Path]:
    """Build, check and write every sample model into ``out``; return the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, build in BUILDERS.items():
        model = build()
        onnx.checker.check_model(model, full_check=True)
        path = out / f"{name}.onnx"
        path.write_bytes(model.SerializeToString(deterministic=True))
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder to write into")
    args = parser.parse_args(argv)
    for path in [*write_all(args.out), *write_real_input_models(args.out)]:
        print(f"{path}  {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
