"""Generate very large ONNX graphs for scale tests and benchmarks.

Two kinds:

* ``make_many_nodes(n)``: about ``n`` nodes in repeated blocks that are deep (long chains), wide (parallel
  branches joined by Concat/Add) and residual (skips over a block), on tiny tensors, so 100,000 nodes
  load, partition, export and run in seconds.
* ``make_big_weights(path, total_bytes)``: a chain of MatMul layers whose weights add up to
  ``total_bytes`` (over 2 GB if asked), saved with external data, for the memory benchmark of export.
  Weights are written layer by layer, so generating it never holds the whole model in memory.

    python tools/make_large_graph.py nodes 100000 --out big_graph.onnx
    python tools/make_large_graph.py weights 2500000000 --out big_weights.onnx
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WIDTH = 8


def _block(i: int, x: str, nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], branches: int) -> str:
    """One block: a residual branch fan-out of ``branches`` short chains, joined and added to ``x``."""
    w = f"b{i}_w"
    inits.append(numpy_helper.from_array(np.full((WIDTH, WIDTH), 0.05 + (i % 7) * 0.01, np.float32), w))
    heads = []
    for b in range(branches):
        a = f"b{i}_r{b}_mm"
        nodes.append(helper.make_node("MatMul", [x, w], [a], name=f"b{i}_r{b}_matmul"))
        c = f"b{i}_r{b}_act"
        op = ("Relu", "Tanh", "Sigmoid")[b % 3]
        nodes.append(helper.make_node(op, [a], [c], name=f"b{i}_r{b}_{op.lower()}"))
        heads.append(c)
    s = heads[0]
    for j, h in enumerate(heads[1:]):
        out = f"b{i}_sum{j}"
        nodes.append(helper.make_node("Add", [s, h], [out], name=f"b{i}_join{j}"))
        s = out
    y = f"b{i}_out"
    nodes.append(helper.make_node("Add", [x, s], [y], name=f"b{i}_residual"))
    norm = f"b{i}_norm"
    scale = f"b{i}_scale"
    inits.append(numpy_helper.from_array(np.array(0.5, np.float32), scale))
    nodes.append(helper.make_node("Mul", [y, scale], [norm], name=f"b{i}_mul"))
    return norm


def make_many_nodes(n: int, seed: int = 0) -> onnx.ModelProto:
    """A model with about ``n`` nodes (within one block) of deep, wide and residual blocks."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    x = "x"
    i = 0
    while len(nodes) < n - 1:
        branches = int(rng.integers(1, 4))
        x = _block(i, x, nodes, inits, branches)
        i += 1
    nodes.append(helper.make_node("Identity", [x], ["y"], name="output"))
    graph = helper.make_graph(
        nodes,
        f"many_nodes_{n}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])],
        initializer=inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="onnxpipe-tools"
    )
    model.ir_version = 8
    return model


def make_big_weights(path: Path, total_bytes: int, layers: int = 16, width: int = 64) -> Path:
    """Write a MatMul chain whose weights total about ``total_bytes`` to ``path`` with external data.

    Layer ``i`` maps ``[batch, width]`` through a ``[width, hidden]`` and a ``[hidden, width]`` weight, so
    activations stay small while weights are huge.  Each weight is written straight to the data file.
    """
    path = Path(path)
    data_name = path.name + ".data"
    data_path = path.parent / data_name
    per_layer = total_bytes // layers
    hidden = max(1, per_layer // (2 * width * 4))
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    offset = 0
    x = "x"
    with data_path.open("wb") as f:
        for i in range(layers):
            for j, shape in enumerate(((width, hidden), (hidden, width))):
                name = f"layer{i}_w{j}"
                arr = np.full(shape, 1.0 / (shape[0] * 4), dtype=np.float32)
                raw = arr.tobytes()
                f.write(raw)
                t = onnx.TensorProto()
                t.name = name
                t.data_type = TensorProto.FLOAT
                t.dims.extend(shape)
                t.data_location = TensorProto.EXTERNAL
                for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(len(raw)))):
                    entry = t.external_data.add()
                    entry.key, entry.value = k, v
                offset += len(raw)
                inits.append(t)
                del arr, raw
            h = f"layer{i}_h"
            y = f"layer{i}_y"
            nodes.append(helper.make_node("MatMul", [x, f"layer{i}_w0"], [h], name=f"layer{i}_up"))
            nodes.append(helper.make_node("MatMul", [h, f"layer{i}_w1"], [y], name=f"layer{i}_down"))
            x = y
    nodes.append(helper.make_node("Identity", [x], ["y"], name="output"))
    graph = helper.make_graph(
        nodes,
        "big_weights",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        initializer=inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="onnxpipe-tools"
    )
    model.ir_version = 8
    with path.open("wb") as f:
        f.write(model.SerializeToString())
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("nodes", "weights"))
    parser.add_argument("size", type=int, help="node count, or total weight bytes")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.kind == "nodes":
        onnx.save(make_many_nodes(args.size), str(args.out))
    else:
        make_big_weights(args.out, args.size)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
