"""Unit tests of decoder support: KV names, layers, derived input sizes, onnxruntime's default-domain ops,
the layer-ordered sequence and the layer-aligned partition, on a hand-built two-layer decoder."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from models import kv_split_layers
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.core.choices import Ends, Phase
from onnxpipe.core.errors import PartitionError
from onnxpipe.cost.phases import phase_overrides
from onnxpipe.cost.profile import Profile
from onnxpipe.cost.static import static_profile
from onnxpipe.ir.decoder import find_decoder, scope_group
from onnxpipe.ir.decoder_dims import decoder_roles, expression_size, kv_bytes_per_token
from onnxpipe.ir.decoder_kinds import phase_shape
from onnxpipe.ir.kv_pairs import PAST_NAME
from onnxpipe.ir.kv_pairs import kv_name as _kv_name
from onnxpipe.ir.load import check_model, view_from_proto
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapes import resolve_input_shapes
from onnxpipe.partition.phases import solve_two_phases, solve_weighted
from onnxpipe.planning.decoder import coarse_allowed, layer_sequences
from onnxpipe.planning.decoder_kinds import DecoderOptions
from onnxpipe.planning.decoder_plan import layer_plan, split_layers

HEADS, HEAD_DIM, WIDTH, VOCAB = 2, 4, 8, 16


def test_a_phase_keeps_the_users_batch_and_other_dims_but_sets_its_own() -> None:
    """A ``--shape`` of a cache input gives way to each phase on its token axes only: the batch (and a
    head size a builder left symbolic) stay as given."""
    view = view_from_proto(_decoder(2))
    given = {"past_key_values.0.key": (3, HEADS, 40, HEAD_DIM), "input_ids": (3, 1)}
    prefill = phase_overrides(view, given, phase_shape(Phase.PREFILL, prefill_tokens=8))
    assert prefill == {"past_key_values.0.key": (3, HEADS, 0, HEAD_DIM), "input_ids": (3, 8)}
    decode = phase_overrides(view, given, phase_shape(Phase.DECODE, decode_past=10))
    assert decode == {"past_key_values.0.key": (3, HEADS, 10, HEAD_DIM), "input_ids": (3, 1)}


def _decoder(layers: int = 2, *, present_from_past: bool = True, scopes: bool = True) -> onnx.ModelProto:
    """``input_ids`` -> embedding -> per layer: k, v = x W, present = Concat(past, k/v), x += x Wo ->
    logits; node names carry optimum's scopes (``/model/layers.N/...``) when ``scopes``."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((VOCAB, WIDTH)).astype(np.float32), "embed"),
        numpy_helper.from_array(rng.standard_normal((WIDTH, VOCAB)).astype(np.float32), "lm_w"),
        numpy_helper.from_array(np.array([0, 0, HEADS, HEAD_DIM], dtype=np.int64), "split_shape"),
    ]
    cache = ["batch", HEADS, "past_sequence_length", HEAD_DIM]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence_length"]),
        helper.make_tensor_value_info(
            "attention_mask", TensorProto.INT64, ["batch", "total_sequence_length"]
        ),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)]

    def name(layer: str, op: str) -> str:
        return f"/model/{layer}/{op}" if scopes else f"{layer}_{op}".replace("/", "_")

    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["x0"], name=name("embed_tokens", "Gather"))]
    for i in range(layers):
        x = f"x{i}"
        scope = f"layers.{i}"
        for kind in ("key", "value"):
            w = f"w{kind[0]}{i}"
            inits.append(numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), w))
            past = f"past_key_values.{i}.{kind}"
            inputs.append(helper.make_tensor_value_info(past, TensorProto.FLOAT, cache))
            present = f"present.{i}.{kind}"
            outputs.append(helper.make_tensor_value_info(present, TensorProto.FLOAT, None))
            nodes += [
                helper.make_node("MatMul", [x, w], [f"{kind}{i}_flat"], name=name(scope, f"{kind}/MatMul")),
                helper.make_node(
                    "Reshape",
                    [f"{kind}{i}_flat", "split_shape"],
                    [f"{kind}{i}_4d"],
                    name=name(scope, f"{kind}/R"),
                ),
                helper.make_node(
                    "Transpose",
                    [f"{kind}{i}_4d"],
                    [f"{kind}{i}_new"],
                    perm=[0, 2, 1, 3],
                    name=name(scope, f"{kind}/T"),
                ),
                helper.make_node(
                    "Concat",
                    [past if present_from_past else f"{kind}{i}_new", f"{kind}{i}_new"],
                    [present],
                    axis=2,
                    name=name(scope, f"{kind}/Concat"),
                ),
            ]
        wo = f"wo{i}"
        inits.append(numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), wo))
        nodes += [  # the layer's output depends on its cache, as attention's does
            helper.make_node("MatMul", [x, wo], [f"o{i}"], name=name(scope, "o_proj/MatMul")),
            helper.make_node(
                "ReduceMean", [f"present.{i}.value"], [f"s{i}"], keepdims=0, name=name(scope, "attn/Mean")
            ),
            helper.make_node("Mul", [f"o{i}", f"s{i}"], [f"a{i}"], name=name(scope, "attn/Mul")),
            helper.make_node("Add", [x, f"a{i}"], [f"x{i + 1}"], name=name(scope, "Add")),
        ]
    nodes.append(
        helper.make_node("MatMul", [f"x{layers}", "lm_w"], ["logits"], name=name("lm_head", "MatMul"))
    )
    graph = helper.make_graph(nodes, "decoder", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _profile(view: ModelView, seconds: dict[str, float] | None = None) -> Profile:
    """The static profile of ``view`` with every node at 1 ms, or at ``seconds``."""
    costs = {n.name: (seconds or {}).get(n.name, 1e-3) for n in view.compute_nodes}
    return dataclasses.replace(static_profile(view), node_seconds=costs)


def test_cache_names_of_the_exporters() -> None:
    assert _kv_name("past_key_values.3.key", PAST_NAME) == (3, "key")
    assert _kv_name("past_key_values.12.value", PAST_NAME) == (12, "value")
    assert _kv_name("past.2.value", PAST_NAME) == (2, "value")
    assert _kv_name("past_key_5", PAST_NAME) == (5, "key")
    assert _kv_name("key_cache.4", PAST_NAME) == (4, "key")
    assert _kv_name("past.1", PAST_NAME) == (1, "kv")
    assert _kv_name("input_ids", PAST_NAME) is None
    assert _kv_name("past_1_layer_2", PAST_NAME) is None  # two numbers: no layer can be told


def test_scopes_give_layers_head_and_embedding() -> None:
    assert scope_group(["", "model", "model.model.layers.3", "model.model.layers.3.mlp"], 4) == 3
    assert scope_group(["model", "model.lm_head"], 4) == 4
    assert scope_group(["model", "model.model.norm"], 4) == 4
    assert scope_group(["model", "model.model.embed_tokens"], 4) == -1
    assert scope_group(["model", "transformer.h.1.attn"], 4) == 1
    assert scope_group(["model", "model.rotary_emb"], 4) is None
    assert scope_group(["model", "model.layers.9"], 4) is None  # no such layer


@pytest.mark.parametrize("scopes", [True, False])
def test_finds_the_pairs_and_each_nodes_layer(scopes: bool) -> None:
    view = view_from_proto(_decoder(3, scopes=scopes))
    dec = find_decoder(view)
    assert dec is not None
    assert dec.layers == 3 and dec.scoped == scopes
    assert [p.past_key for p in dec.kv] == [f"past_key_values.{i}.key" for i in range(3)]
    assert [p.present_value for p in dec.kv] == [f"present.{i}.value" for i in range(3)]
    groups = dec.node_layer
    for n in view.compute_nodes:
        if "layers.1/" in n.name:  # from the scopes
            assert groups[n.name] == 1
        if n.name.startswith("layers.1_") and ("Concat" in n.name or "attn" in n.name):
            assert groups[n.name] == 1  # from the cache the node reads or makes
    head = next(n.name for n in view.compute_nodes if "lm_head" in n.name)
    assert groups[head] == (3 if scopes else 2)  # without scopes the head stays with the last layer
    assert dec.ids_input == "input_ids" and dec.mask_input == "attention_mask"
    assert kv_bytes_per_token(view, dec.kv[0]) == 2 * HEADS * HEAD_DIM * 4


def test_a_present_not_made_from_its_past_is_no_decoder() -> None:
    assert find_decoder(view_from_proto(_decoder(2, present_from_past=False))) is None


def test_decoder_sizes_agree_for_each_phase() -> None:
    view = view_from_proto(_decoder(2))
    roles = decoder_roles(view)
    assert (
        roles is not None and roles.past == "past_sequence_length" and roles.total == "total_sequence_length"
    )
    decode = resolve_input_shapes(view)
    assert decode["input_ids"] == (1, 1)
    assert decode["attention_mask"] == (1, 256)
    assert decode["past_key_values.1.value"] == (1, HEADS, 255, HEAD_DIM)
    prefill = resolve_input_shapes(view, phase=phase_shape(Phase.PREFILL, prefill_tokens=20))
    assert prefill["input_ids"] == (1, 20) and prefill["attention_mask"] == (1, 20)
    assert prefill["past_key_values.0.key"] == (1, HEADS, 0, HEAD_DIM)
    given = resolve_input_shapes(
        view, {"input_ids": (2, 5), "past_key_values.0.key": (2, HEADS, 7, HEAD_DIM)}
    )
    assert given["attention_mask"] == (2, 12)
    assert given["past_key_values.1.key"] == (2, HEADS, 7, HEAD_DIM)
    assert expression_size("past_sequence_length + 1", {"past_sequence_length": 9}) == 10
    assert expression_size("seq", {"seq": 9}) is None


def test_layer_sequence_cuts_between_layers_and_charges_no_cache() -> None:
    view = view_from_proto(_decoder(3))
    dec = find_decoder(view)
    assert dec is not None
    layers = layer_sequences(view, _profile(view), dec)
    assert layers.groups == (-1, 0, 1, 2, 3)
    seq = layers.seq
    assert [p for p, ok in enumerate(seq.allowed) if ok] == list(layers.starts)
    # a stage starting at layer 1 receives the residual stream only: no past crosses a link
    assert seq.cut_bytes[layers.starts[2]] == WIDTH * 4  # x1 at the decode shape: one token, float32
    assert coarse_allowed(layers, dec, Ends.ATTACHED) == [True, False, True, True, False, True]


def test_layer_aligned_partition_is_exact_and_keeps_each_cache_whole() -> None:
    view = view_from_proto(_decoder(4))
    dec = find_decoder(view)
    assert dec is not None
    # layer 2 is slow: the best 3-stage split isolates it
    slow = {n.name: (1.0 if "layers.2" in n.name else 1e-3) for n in view.compute_nodes}
    prof = _profile(view, slow)
    plan = layer_plan(view, [(Phase.DECODE, prof)], 3, dec, DecoderOptions(max_context=100))
    assert [st.kv_layers for st in plan.stages] == [(0, 1), (2,), (3,)]
    assert kv_split_layers(view, dec, plan.stages) == []
    per_token = kv_bytes_per_token(view, dec.kv[0])
    assert [st.kv_cache_bytes for st in plan.stages] == [
        2 * 100 * per_token,
        100 * per_token,
        100 * per_token,
    ]
    # brute force over every layer-aligned split agrees with the solver's bottleneck
    layers = layer_sequences(view, prof, dec)
    costs = layers.coarse_costs
    best = min(
        max(sum(costs[:a]), sum(costs[a:b]), sum(costs[b:]))
        for a in range(1, len(costs))
        for b in range(a + 1, len(costs))
    )
    assert plan.bottleneck_seconds == pytest.approx(best)


def test_own_ends_need_enough_stages() -> None:
    view = view_from_proto(_decoder(2))
    dec = find_decoder(view)
    assert dec is not None
    prof = _profile(view)
    layers = layer_sequences(view, prof, dec)

    def split(k: int, ends: Ends) -> tuple[int, ...]:
        options = DecoderOptions(ends=ends, copy_inputs=False)
        return split_layers(view, [(Phase.DECODE, prof)], k, dec, options, float("inf"))[0].parts[0].bounds

    assert split(3, Ends.OWN) == (layers.starts[0], layers.starts[1], layers.starts[3], layers.starts[4])
    with pytest.raises(PartitionError, match="`ends=own`"):
        split(2, Ends.OWN)
    with pytest.raises(PartitionError, match="`layer_cuts=False`"):
        split(6, Ends.FREE)


def _rms_model(op: str) -> onnx.ModelProto:
    node = helper.make_node(op, ["x", "scale"], ["y"], epsilon=1e-5)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[numpy_helper.from_array(np.ones(4, dtype=np.float32), "scale")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_onnxruntimes_default_domain_ops_pass_with_a_note() -> None:
    note = check_model(_rms_model("SimplifiedLayerNormalization"))
    assert note is not None and "SimplifiedLayerNormalization" in note and "onnx.checker refuses" in note
    assert check_model(_rms_model("LayerNormalization")) is None  # ONNX's own at opset 20
    with pytest.raises(onnx.checker.ValidationError):
        check_model(_rms_model("NoSuchNormalization"))


def test_default_domain_ops_pass_with_external_weights_checked_from_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GenAI's builder keeps the weights in ``model.onnx.data``: the copy checked in memory must not look
    for that file in the current folder (it did: "should be stored in model.onnx.data, but it is not
    regular file")."""
    path = tmp_path / "model" / "model.onnx"
    path.parent.mkdir()
    onnx.save_model(
        _rms_model("SimplifiedLayerNormalization"),
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    monkeypatch.chdir(tmp_path)
    note = check_model(path)
    assert note is not None and "SimplifiedLayerNormalization" in note
    with pytest.raises(onnx.checker.ValidationError):  # a real fault still refuses
        model = _rms_model("NoSuchNormalization")
        onnx.save_model(
            model, str(path), save_as_external_data=True, location="model.onnx.data", size_threshold=0
        )
        check_model(path)


def _brute_two_phase(a: list[float], b: list[float], k: int, wa: float, wb: float) -> float:
    n = len(a)
    best = math.inf
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        worst = max(max(wa * sum(a[x:y]), wb * sum(b[x:y])) for x, y in itertools.pairwise(bounds))
        best = min(best, worst)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_two_phase_split_is_exact(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(3, 8)), int(rng.integers(1, 4))
    k = min(k, n)
    a = [float(x) for x in rng.random(n)]
    b = [float(x) for x in rng.random(n) * 3]
    got = solve_weighted(a, b, k, weights=(1.0, 0.5))
    assert got.objective == pytest.approx(_brute_two_phase(a, b, k, 1.0, 0.5))
    both = solve_two_phases(a, b, k)
    best_a = _brute_two_phase(a, [0.0] * n, k, 1.0, 0.0)
    best_b = _brute_two_phase([0.0] * n, b, k, 0.0, 1.0)
    assert both.objective == pytest.approx(_brute_two_phase(a, b, k, 1 / best_a, 1 / best_b))
    assert max(max(both.stage_a) / best_a, max(both.stage_b) / best_b) == pytest.approx(both.objective)


def test_two_phase_split_is_no_worse_than_either_phases_own() -> None:
    """Phase A's work is early, B's late: the joint split's worse phase is no further from its own best
    than with the split balanced for either phase alone."""
    a = [4.0, 4.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    b = [1.0, 1.0, 1.0, 1.0, 1.0, 4.0, 4.0]
    only_a = solve_weighted(a, [0.0] * 7, 3, weights=(1.0, 0.0))
    only_b = solve_weighted([0.0] * 7, b, 3, weights=(0.0, 1.0))
    both = solve_two_phases(a, b, 3)

    def worse(bounds: tuple[int, ...]) -> float:
        return max(max(_sums(a, bounds)) / only_a.objective, max(_sums(b, bounds)) / only_b.objective)

    assert both.objective == pytest.approx(worse(both.bounds))
    assert both.objective <= worse(only_a.bounds) and both.objective <= worse(only_b.bounds)
    assert both.objective < max(worse(only_a.bounds), worse(only_b.bounds))
    with pytest.raises(PartitionError):
        solve_weighted(a, b, 8)
    with pytest.raises(PartitionError):
        solve_weighted(a, b, 2, allowed_cuts=[True] + [False] * 6 + [True])


def _sums(costs: list[float], bounds: tuple[int, ...]) -> list[float]:
    return [sum(costs[x:y]) for x, y in itertools.pairwise(bounds)]


def test_a_decoder_taking_inputs_embeds_is_not_fed_through_its_mask() -> None:
    """GenAI's ``exclude_embeds`` text model has one integer input, the attention mask: the token input is
    its ``inputs_embeds``, not the mask (which indexes no table), and its phases size it."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    past = [
        helper.make_tensor_value_info(f"past_key_values.0.{kv}", f, ["b", 1, "p", 4])
        for kv in ("key", "value")
    ]
    nodes = [
        helper.make_node(
            "Unsqueeze", ["inputs_embeds", "one"], ["new"], name="/model/layers.0/attn/Unsqueeze"
        ),
        *(
            helper.make_node(
                "Concat",
                [f"past_key_values.0.{kv}", "new"],
                [f"present.0.{kv}"],
                axis=2,
                name=f"/model/layers.0/{kv}",
            )
            for kv in ("key", "value")
        ),
        helper.make_node("MatMul", ["inputs_embeds", "head"], ["logits"], name="/lm_head/MatMul"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("inputs_embeds", f, ["b", "s", 4]),
            helper.make_tensor_value_info("attention_mask", i64, ["b", "t"]),
            *past,
        ],
        [
            helper.make_tensor_value_info("logits", f, ["b", "s", 8]),
            *(
                helper.make_tensor_value_info(f"present.0.{kv}", f, ["b", 1, "p + s", 4])
                for kv in ("key", "value")
            ),
        ],
        [
            numpy_helper.from_array(np.ones(1, np.int64), "one"),
            numpy_helper.from_array(np.ones((4, 8), np.float32), "head"),
        ],
    )
    view = view_from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    dec = find_decoder(view)
    assert dec is not None and dec.ids_input == "inputs_embeds" and dec.mask_input == "attention_mask"
    roles = decoder_roles(view)
    assert roles is not None and (roles.sequence, roles.past, roles.total) == ("s", "p", "t")


def test_multihead_attention_head_size_is_read_off_its_past_slots() -> None:
    """onnxruntime's ``MultiHeadAttention`` takes its past key and value at slots 6 and 7 (slots 3 and 4
    are its bias and padding mask): a symbolic head dim there is sized from the query's width."""
    from onnxpipe.ir.decoder_dims import attention_head_sizes
    from onnxpipe.ir.load import view_from_proto

    past = ["batch", 2, "past", "kv_cache_dim"]
    node = helper.make_node(
        "MultiHeadAttention",
        ["q", "k", "v", "", "", "", "past_key", "past_value"],
        ["out", "present_key", "present_value"],
        domain="com.microsoft",
        num_heads=2,
    )
    graph = helper.make_graph(
        [node],
        "mha",
        [
            *(helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 1, 64]) for n in ("q", "k", "v")),
            *(helper.make_tensor_value_info(n, TensorProto.FLOAT, past) for n in ("past_key", "past_value")),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in node.output],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    view = view_from_proto(helper.make_model(graph, opset_imports=opsets))
    assert attention_head_sizes(view) == {"kv_cache_dim": 32}
