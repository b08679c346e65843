"""Hand-built decoders whose graphs hold what exporters write, each in its own way: the cache grown by a
``Concat`` in each of the layouts exporters use, or by onnxruntime's ``GroupQueryAttention`` behind a
block-quantized, tied embedding (GenAI's builder's int4 layout); names by optimum's convention, or by none
(only the graph tells the cache).  Nothing here is committed as a file: the models are built each run."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HEADS, HEAD_DIM, WIDTH, VOCAB, LAYERS = 2, 4, 8, 24, 2
FLOAT = TensorProto.FLOAT
Names = Callable[[int, str, str], str]
"""``names(layer, "key" | "value" | "kv", "past" | "present")``: a cache tensor's name."""


def optimum_names(layer: int, kind: str, role: str) -> str:
    return f"past_key_values.{layer}.{kind}" if role == "past" else f"present.{layer}.{kind}"


def odd_names(layer: int, kind: str, role: str) -> str:
    """Names no convention knows, and without a number: only the graph tells the cache."""
    return f"{'ab'[layer]}_{kind}_{'in' if role == 'past' else 'out'}"


# ------------------------------------------------------------------------------------ hand-built models


def concat_decoder(
    layout: str = "bnsh", names: Names = optimum_names, *, symbolic_head: bool = False
) -> onnx.ModelProto:
    """``input_ids`` -> embedding -> per layer: k, v = x W grown onto the past by a ``Concat`` -> logits.

    ``layout``: ``bnsh`` ([batch, heads, past, head]), ``bsnh`` ([batch, past, heads, head]) or ``packed``
    (key and value in one [2, batch, heads, past, head] tensor); ``symbolic_head``: the past's head size
    a symbol (as GenAI's builder writes ``kv_cache_dim``)."""
    rng = np.random.default_rng(0)
    head: int | str = "kv_cache_dim" if symbolic_head else HEAD_DIM
    inits = [
        numpy_helper.from_array(rng.standard_normal((VOCAB, WIDTH)).astype(np.float32), "embed"),
        numpy_helper.from_array(rng.standard_normal((WIDTH, VOCAB)).astype(np.float32), "lm_w"),
        numpy_helper.from_array(np.array([0, 0, HEADS, HEAD_DIM], dtype=np.int64), "split_shape"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "axis0"),
    ]
    shapes = {
        "bnsh": (
            ["batch", HEADS, "past_sequence_length", head],
            ["batch", HEADS, "total_sequence_length", head],
        ),
        "bsnh": (
            ["batch", "past_sequence_length", HEADS, head],
            ["batch", "total_sequence_length", HEADS, head],
        ),
        "packed": (
            [2, "batch", HEADS, "past_sequence_length", head],
            [2, "batch", HEADS, "total_sequence_length", head],
        ),
    }[layout]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence_length"]),
        helper.make_tensor_value_info(
            "attention_mask", TensorProto.INT64, ["batch", "total_sequence_length"]
        ),
    ]
    outputs = [helper.make_tensor_value_info("logits", FLOAT, ["batch", "sequence_length", VOCAB])]
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["x0"], name="/model/embed_tokens/Gather")]
    kinds = ("kv",) if layout == "packed" else ("key", "value")
    for i in range(LAYERS):
        x, scope = f"x{i}", f"/model/layers.{i}"
        new: dict[str, str] = {}
        for kind in ("key", "value"):
            w = f"w{kind[0]}{i}"
            inits.append(numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), w))
            nodes += [
                helper.make_node("MatMul", [x, w], [f"{w}_flat"], name=f"{scope}/{kind}/MatMul"),
                helper.make_node(
                    "Reshape", [f"{w}_flat", "split_shape"], [f"{w}_bsnh"], name=f"{scope}/{kind}/R"
                ),
            ]
            new[kind] = f"{w}_bsnh"
            if layout != "bsnh":
                nodes.append(
                    helper.make_node(
                        "Transpose", [f"{w}_bsnh"], [f"{w}_bnsh"], perm=[0, 2, 1, 3], name=f"{scope}/{kind}/T"
                    )
                )
                new[kind] = f"{w}_bnsh"
        if layout == "packed":
            for kind in ("key", "value"):
                nodes.append(
                    helper.make_node(
                        "Unsqueeze", [new[kind], "axis0"], [f"{new[kind]}_1"], name=f"{scope}/{kind}/U"
                    )
                )
            nodes.append(
                helper.make_node(
                    "Concat",
                    [f"{new['key']}_1", f"{new['value']}_1"],
                    [f"kv{i}_new"],
                    axis=0,
                    name=f"{scope}/kv/Stack",
                )
            )
            new["kv"] = f"kv{i}_new"
        axis = {"bnsh": 2, "bsnh": 1, "packed": 3}[layout]
        for kind in kinds:
            past, present = names(i, kind, "past"), names(i, kind, "present")
            inputs.append(helper.make_tensor_value_info(past, FLOAT, shapes[0]))
            outputs.append(helper.make_tensor_value_info(present, FLOAT, shapes[1]))
            nodes.append(
                helper.make_node(
                    "Concat", [past, new[kind]], [present], axis=axis, name=f"{scope}/{kind}/Concat"
                )
            )
        last = names(i, kinds[-1], "present")
        wo = f"wo{i}"
        inits.append(numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), wo))
        nodes += [  # the layer's output depends on its cache, as attention's does
            helper.make_node("MatMul", [x, wo], [f"o{i}"], name=f"{scope}/o_proj/MatMul"),
            helper.make_node("ReduceMean", [last], [f"s{i}"], keepdims=0, name=f"{scope}/attn/Mean"),
            helper.make_node("Mul", [f"o{i}", f"s{i}"], [f"a{i}"], name=f"{scope}/attn/Mul"),
            helper.make_node("Add", [x, f"a{i}"], [f"x{i + 1}"], name=f"{scope}/Add"),
        ]
    nodes.append(helper.make_node("MatMul", [f"x{LAYERS}", "lm_w"], ["logits"], name="/lm_head/MatMul"))
    graph = helper.make_graph(nodes, "decoder", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def gqa_decoder(names: Names = odd_names, ids: str = "tokens") -> onnx.ModelProto:
    """GenAI's builder's int4 layout, not run: a tied 4-bit embedding read by ``GatherBlockQuantized``
    (through a ``Reshape`` of the LM head's packed weight), a ``GroupQueryAttention`` per layer taking its
    past and giving its present (past and present sharing a buffer), the mask read by ``ReduceSum``."""
    packed = numpy_helper.from_array(np.zeros((VOCAB, 1, WIDTH // 2), dtype=np.uint8), "lm_q4")
    inits = [
        packed,
        numpy_helper.from_array(np.ones((VOCAB, 1), dtype=np.float32), "lm_scales"),
        numpy_helper.from_array(np.array([VOCAB, WIDTH // 2], dtype=np.int64), "table_shape"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "one"),
        numpy_helper.from_array(np.zeros((WIDTH, 3 * WIDTH), dtype=np.float32), "qkv_w"),
    ]
    head = [None, HEADS, "past_sequence_length", "kv_cache_dim"]
    inputs = [
        helper.make_tensor_value_info(ids, TensorProto.INT64, ["batch", "sequence_length"]),
        helper.make_tensor_value_info(
            "attention_mask", TensorProto.INT64, ["batch", "total_sequence_length"]
        ),
    ]
    outputs = [helper.make_tensor_value_info("logits", FLOAT, ["batch", "sequence_length", VOCAB])]
    ms = "com.microsoft"
    nodes = [
        helper.make_node("Reshape", ["lm_q4", "table_shape"], ["table"], name="/model/embed_tokens/Reshape"),
        helper.make_node(
            "GatherBlockQuantized",
            ["table", ids, "lm_scales"],
            ["x0"],
            domain=ms,
            bits=4,
            block_size=WIDTH,
            name="/model/embed_tokens/GatherBlockQuantized",
        ),
        helper.make_node(
            "ReduceSum", ["attention_mask", "one"], ["lengths"], keepdims=0, name="/model/mask/Sum"
        ),
    ]
    for i in range(LAYERS):
        scope = f"/model/layers.{i}"
        pk, pv = names(i, "key", "past"), names(i, "value", "past")
        qk, qv = names(i, "key", "present"), names(i, "value", "present")
        inputs += [helper.make_tensor_value_info(t, FLOAT, ["batch", *head[1:]]) for t in (pk, pv)]
        outputs += [
            helper.make_tensor_value_info(t, FLOAT, ["batch", HEADS, "total", "kv_cache_dim"])
            for t in (qk, qv)
        ]
        nodes += [
            helper.make_node("MatMul", [f"x{i}", "qkv_w"], [f"qkv{i}"], name=f"{scope}/attn/qkv_proj/MatMul"),
            helper.make_node(
                "GroupQueryAttention",
                [f"qkv{i}", "", "", pk, pv, "lengths", "lengths"],
                [f"x{i + 1}", qk, qv],
                domain=ms,
                num_heads=2 * HEADS,
                kv_num_heads=HEADS,
                name=f"{scope}/attn/GroupQueryAttention",
            ),
        ]
    nodes.append(
        helper.make_node(
            "MatMulNBits",
            [f"x{LAYERS}", "lm_q4", "lm_scales"],
            ["logits"],
            domain=ms,
            K=WIDTH,
            N=VOCAB,
            bits=4,
            block_size=WIDTH,
            name="/lm_head/MatMul_Q4",
        )
    )
    graph = helper.make_graph(nodes, "decoder", inputs, outputs, initializer=inits)
    # the builder writes its tensors' shapes (onnx infers none through onnxruntime's ops)
    graph.value_info.extend(
        helper.make_tensor_value_info(f"qkv{i}", FLOAT, ["batch", "sequence_length", 3 * WIDTH])
        for i in range(LAYERS)
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(ms, 1)])
