"""Decoder LLMs with a KV cache, exported to ONNX by torch's dynamo exporter, with random weights.

    python tools/export_decoders.py --out DIR [NAME...]   # write models (default: the tiny ones) into DIR

- ``llama_gqa``: ``LlamaForCausalLM`` with grouped-query attention (4 layers, 32 wide, 4 heads, 2 KV heads);
- ``qwen2``: ``Qwen2ForCausalLM`` (the same sizes, biased q/k/v);
- ``gpt2``: ``GPT2LMHeadModel`` (4 layers, 32 wide, 4 heads);
- ``<name>_small``: the same families 256 wide with 8 layers, for the benchmarks (built in the cache).

    python tools/export_decoders.py --out sample_models/decoders   # the committed tiny ones

Every one takes ``input_ids`` [batch, seq], ``attention_mask`` [batch, past + seq], ``position_ids``
[batch, seq] (not GPT-2's export: it has learned positions that transformers derives from the mask's
length) and ``past_key_values.N.key/value`` [batch, kv_heads, past, head_dim], and returns ``logits`` and
``present.N.key/value`` [batch, kv_heads, past + seq, head_dim]: the names optimum's exporter writes.

The weights are drawn with an initializer range of 0.08: at transformers' default 0.02 greedy decoding of
a random model repeats one token, and a test that the split model decodes the same tokens proves little.

:func:`builder_style` rewrites an export the way ONNX Runtime GenAI's model builder writes a model:
``SimplifiedLayerNormalization`` (an onnxruntime contrib op) in the *default* domain in place of each RMS
norm's subgraph, which ``onnx.checker`` refuses and onnxruntime runs.

:func:`exclude_embeds` writes ``<name>_embeds.onnx``, the decoder taking ``inputs_embeds`` with its head size
symbolic, and ``<name>_embedding.onnx``, its embedding model, as GenAI's builder writes a vision-language
model's text part with ``exclude_embeds=true``.

:func:`merged_decoder` writes ``<name>_merged.onnx`` (committed for ``llama_gqa``) as optimum ships a decoder
in ``decoder_model_merged.onnx``: the export without a cache and the one with it (``export(past=False)``
and ``export()``) joined by :func:`merge_decoders` under one ``If`` on ``use_cache_branch``.

Exports are cached in the corpus cache (``tools/corpus.py``) under ``decoders/<name>-<key>/``, keyed by the
configuration and the versions of torch, transformers, onnxscript and onnx.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

try:
    from tools.corpus import build_once, cache_dir
except ModuleNotFoundError:  # run as a script: python tools/export_decoders.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tools.corpus import build_once, cache_dir

if TYPE_CHECKING:
    import onnx
    import torch

SCOPE_KEY = "pkg.torch.onnx.name_scopes"
EXPORT_REVISION = 1  # bump to invalidate every cached export after changing how models are built
SEED = 0
INIT_RANGE = 0.08


@dataclass(frozen=True)
class DecoderSpec:
    name: str
    family: str  # llama, qwen2, gpt2
    config: dict[str, Any]

    @property
    def layers(self) -> int:
        return int(self.config.get("num_hidden_layers") or self.config["n_layer"])

    @property
    def kv_heads(self) -> int:
        c = self.config
        return int(c.get("num_key_value_heads") or c.get("num_attention_heads") or c["n_head"])

    @property
    def head_dim(self) -> int:
        c = self.config
        hidden = int(c.get("hidden_size") or c["n_embd"])
        heads = int(c.get("num_attention_heads") or c["n_head"])
        return hidden // heads

    @property
    def vocab(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def positions(self) -> bool:
        """Whether the export takes ``position_ids``."""
        return self.family != "gpt2"

    @property
    def input_names(self) -> tuple[str, ...]:
        head = ("input_ids", "attention_mask") + (("position_ids",) if self.positions else ())
        return head + tuple(
            f"past_key_values.{i}.{kv}" for i in range(self.layers) for kv in ("key", "value")
        )

    @property
    def output_names(self) -> tuple[str, ...]:
        return ("logits", *(f"present.{i}.{kv}" for i in range(self.layers) for kv in ("key", "value")))


def _llama(
    hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int, tied: bool = False
) -> dict[str, Any]:
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": 1024,
        "initializer_range": INIT_RANGE,
        "tie_word_embeddings": tied,
        "bos_token_id": 0,
        "eos_token_id": 1,
    }


def _gpt2(hidden: int, layers: int, heads: int, vocab: int) -> dict[str, Any]:
    return {
        "vocab_size": vocab,
        "n_positions": 1024,
        "n_embd": hidden,
        "n_layer": layers,
        "n_head": heads,
        "initializer_range": INIT_RANGE,
        "bos_token_id": 0,
        "eos_token_id": 1,
    }


SPECS: dict[str, DecoderSpec] = {
    # tiny: committed in sample_models/decoders/ for the tests (a few hundred KB each)
    "llama_gqa": DecoderSpec("llama_gqa", "llama", _llama(32, 4, 4, 2, 64, 128)),
    "qwen2": DecoderSpec("qwen2", "qwen2", _llama(32, 4, 4, 2, 64, 128)),
    "gpt2": DecoderSpec("gpt2", "gpt2", _gpt2(32, 4, 4, 128)),
    # the LM head reads the token embedding's table (tie_word_embeddings), held once in the file
    "llama_tied": DecoderSpec("llama_tied", "llama", _llama(32, 4, 4, 2, 64, 128, tied=True)),
    # small: built in the cache for the benchmarks (compute, not per-node overhead, dominates)
    "llama_gqa_small": DecoderSpec("llama_gqa_small", "llama", _llama(256, 8, 8, 2, 704, 1024)),
    "qwen2_small": DecoderSpec("qwen2_small", "qwen2", _llama(256, 8, 8, 2, 704, 1024)),
    "gpt2_small": DecoderSpec("gpt2_small", "gpt2", _gpt2(256, 8, 8, 1024)),
    # medium: its weights (about 25 MB a layer, 250 MB in all) cannot stay in a CPU's cache, as a real
    # LLM's cannot; the small ones (25 MB) can when run back to back, and a generation step's costs change
    "llama_gqa_medium": DecoderSpec("llama_gqa_medium", "llama", _llama(768, 8, 12, 4, 2048, 8192)),
}
TINY = ("llama_gqa", "qwen2", "gpt2", "llama_tied")
"""The models :func:`main` writes by default (into ``sample_models/decoders/``)."""
BUILDER_STYLE = ("llama_gqa",)
"""The models also written in the builder's style (``<name>_builder.onnx``): an RMS-norm model."""
MERGED = ("llama_gqa",)
"""The models also written as optimum's merged decoder (``<name>_merged.onnx``, :func:`merge_decoders`)."""


# ------------------------------------------------------------------------------------------ torch side


def build_torch_model(name: str, *, past: bool = True) -> torch.nn.Module:
    """The eval-mode module exported as ``name``: flat tensors in and out, the same weights every call;
    ``past=False``: the first step's decoder (optimum's ``decoder_model``), which takes no cache."""
    import torch
    import transformers
    from transformers.cache_utils import DynamicCache

    spec = SPECS[name]
    torch.manual_seed(SEED)
    if spec.family == "llama":
        lm: Any = transformers.LlamaForCausalLM(transformers.LlamaConfig(**spec.config))
    elif spec.family == "qwen2":
        lm = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**spec.config))
    else:
        lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(**spec.config))
    n = spec.layers
    positions = spec.positions

    class FlatDecoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = lm

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *rest: torch.Tensor) -> Any:
            position_ids = rest[0] if positions else None
            cached = rest[1:] if positions else rest
            cache = DynamicCache(config=lm.config)
            for i in range(n if past else 0):
                cache.update(cached[2 * i], cached[2 * i + 1], i)
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            )
            present = out.past_key_values
            flat = []
            for i in range(n):
                layer = present.layers[i]
                flat += [layer.keys, layer.values]
            return (out.logits, *flat)

    return FlatDecoder().eval()


def example_inputs(
    name: str, batch: int = 1, seq: int = 4, past: int = 3, seed: int = 0
) -> dict[str, np.ndarray]:
    """Feeds for one step of ``name``: ``seq`` new tokens after ``past`` cached ones (random cache)."""
    spec = SPECS[name]
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {
        "input_ids": rng.integers(0, spec.vocab, (batch, seq), dtype=np.int64),
        "attention_mask": np.ones((batch, past + seq), dtype=np.int64),
    }
    if spec.positions:
        feeds["position_ids"] = np.tile(np.arange(past, past + seq, dtype=np.int64), (batch, 1))
    for i in range(spec.layers):
        for kv in ("key", "value"):
            feeds[f"past_key_values.{i}.{kv}"] = rng.standard_normal(
                (batch, spec.kv_heads, past, spec.head_dim)
            ).astype(np.float32)
    return feeds


def export(name: str, path: Path, *, past: bool = True) -> Path:
    """Export ``name`` to ``path`` (one self-contained file) without caching; return ``path``.

    ``past=False``: the decoder without a cache input (optimum's ``decoder_model``): the mask as long as
    the tokens, the same weights and outputs."""
    import onnx
    import torch

    spec = SPECS[name]
    model = build_torch_model(name, past=past)
    feeds = example_inputs(name, past=3 if past else 0)
    names = [n for n in spec.input_names if past or not n.startswith("past_key_values.")]
    args = tuple(torch.from_numpy(feeds[n]) for n in names)
    batch = torch.export.Dim("batch")
    seq = torch.export.Dim("sequence_length")
    cached = torch.export.Dim("past_sequence_length")
    total = torch.export.Dim("total_sequence_length") if past else seq
    shapes: list[dict[int, Any]] = [{0: batch, 1: seq}, {0: batch, 1: total}]
    if spec.positions:
        shapes.append({0: batch, 1: seq})
    shapes += [{0: batch, 2: cached}] * (2 * spec.layers if past else 0)
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    tmp = path.with_suffix(".raw.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            args,
            str(tmp),
            dynamo=True,
            external_data=False,
            input_names=names,
            output_names=list(spec.output_names),
            dynamic_shapes=(shapes[0], shapes[1], tuple(shapes[2:])),  # forward's *rest is one tuple
            verbose=False,
        )
    proto = onnx.load(str(tmp))
    tmp.unlink()
    strip_metadata(proto)
    if spec.config.get("tie_word_embeddings"):
        tie_lm_head(proto)
    onnx.save(proto, str(path))
    return path


def strip_metadata(proto: onnx.ModelProto) -> None:
    """Drop every node's metadata but its module scope: the exporter's debugging metadata (stack traces,
    FX nodes) is most of a tiny model's bytes; the module scopes are what onnxpipe reads (a node's layer)."""
    for node in proto.graph.node:
        keep = [p for p in node.metadata_props if p.key == SCOPE_KEY]
        del node.metadata_props[:]
        node.metadata_props.extend(keep)


def tie_lm_head(proto: onnx.ModelProto) -> None:
    """Make the LM head read the token embedding's table through a ``Transpose``, as tied files hold it
    (once): the exporter folds ``lm_head.weight.T`` into an initializer of its own, a second copy."""
    from onnx import helper, numpy_helper

    graph = proto.graph
    inits = {t.name: t for t in graph.initializer}
    table = next(n.input[0] for n in graph.node if n.op_type == "Gather" and n.input[0] in inits)
    transposed = numpy_helper.to_array(inits[table]).T
    copy = next(
        t.name
        for t in graph.initializer
        if t.name != table
        and tuple(t.dims) == transposed.shape
        and np.array_equal(numpy_helper.to_array(t), transposed)
    )
    graph.initializer.remove(inits[copy])
    at = next(i for i, n in enumerate(graph.node) if copy in n.input)
    graph.node.insert(at, helper.make_node("Transpose", [table], [copy], name="lm_head_tied", perm=[1, 0]))


def builder_style(src: Path, dst: Path) -> Path:
    """``src`` with each RMS norm (``Pow, ReduceMean, Add, Sqrt, Reciprocal/Div, Mul, Mul``) replaced by
    one ``SimplifiedLayerNormalization`` node in the default domain, as ORT GenAI's model builder writes
    it; the model then fails ``onnx.checker`` and runs in onnxruntime."""
    import onnx
    from onnx import helper

    proto = onnx.load(str(src))
    graph = proto.graph
    nodes = list(graph.node)
    producer = {o: n for n in nodes for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for t in n.input:
            consumers.setdefault(t, []).append(n)
    replaced: set[int] = set()
    new_nodes: dict[int, onnx.NodeProto] = {}
    eps_of = {i.name: float(onnx.numpy_helper.to_array(i)) for i in graph.initializer if not i.dims}
    for n in nodes:
        if n.op_type != "RMSNormalization" and not (
            n.op_type == "Mul" and _rms_pattern(n, producer) is not None
        ):
            continue
        if n.op_type == "RMSNormalization":
            x, scale = n.input[0], n.input[1]
            eps = next((a.f for a in n.attribute if a.name == "epsilon"), 1e-5)
            chain = [n]
        else:
            found = _rms_pattern(n, producer)
            assert found is not None
            x, scale, eps_name, chain = found
            eps = eps_of.get(eps_name, 1e-6)
        node = helper.make_node(
            "SimplifiedLayerNormalization",
            [x, scale],
            list(n.output),
            name=n.name + "/SimplifiedLayerNorm",
            axis=-1,
            epsilon=eps,
        )
        node.metadata_props.extend(n.metadata_props)  # the exporter's scopes: which layer it is in
        for c in chain:
            replaced.add(id(c))
        new_nodes[id(n)] = node
    out = [new_nodes.get(id(n), n) for n in nodes if id(n) not in replaced or id(n) in new_nodes]
    del graph.node[:]
    graph.node.extend(out)
    # drop intermediate value infos of removed tensors; nothing else reads them
    made = {o for n in out for o in n.output} | {i.name for i in graph.input}
    keep = [vi for vi in graph.value_info if vi.name in made]
    del graph.value_info[:]
    graph.value_info.extend(keep)
    onnx.save(proto, str(dst))
    return dst


def merge_decoders(no_past: onnx.ModelProto, with_past: onnx.ModelProto) -> onnx.ModelProto:
    """optimum's ``decoder_model_merged.onnx`` made from ``no_past`` and ``with_past`` as optimum's
    ``merge_decoders`` writes it: the no-past decoder's outputs take the with-past decoder's shapes; the
    inputs of both, the mask's length renamed ``attention_mask_sequence_length``; every initializer but
    scalars and 1-D integer ones hoisted into the outer graph, one tensor for equal contents (named
    ``<name>_merged_<n>``); one ``If`` on the boolean ``use_cache_branch`` [1], the with-past decoder its
    ``then`` branch and the no-past one its ``else`` branch (branches take no inputs and read the outer
    graph's)."""
    import hashlib as _hashlib

    import onnx
    from onnx import helper, numpy_helper

    models = [copy_model(no_past), copy_model(with_past)]
    for a, b in zip(models[0].graph.output, models[1].graph.output, strict=True):
        if a.name != b.name or a.type.tensor_type.elem_type != b.type.tensor_type.elem_type:
            raise ValueError(f"outputs {a.name} and {b.name} differ: the decoders do not merge")
        a.CopyFrom(b)
    inputs: dict[str, onnx.ValueInfoProto] = {}
    for m in models:
        for vi in m.graph.input:
            inputs.setdefault(vi.name, vi)
    mask = inputs.get("attention_mask")
    if mask is not None and mask.type.tensor_type.shape.dim[1].dim_param == "sequence_length":
        mask.type.tensor_type.shape.dim[1].dim_param = "attention_mask_sequence_length"

    def hoisted(t: onnx.TensorProto) -> bool:
        return len(t.dims) > 1 or (len(t.dims) == 1 and t.data_type not in (6, 7))  # INT32, INT64

    groups: dict[tuple[int, str, tuple[int, ...]], list[tuple[str, int]]] = {}
    for i, m in enumerate(models):
        for t in m.graph.initializer:
            if hoisted(t):
                digest = _hashlib.sha512(numpy_helper.to_array(t).tobytes()).hexdigest()
                groups.setdefault((t.data_type, digest, tuple(t.dims)), []).append((t.name, i))
    shared: dict[tuple[str, int], str] = {}
    used: dict[str, int] = {}
    for members in groups.values():
        common = members[0][0]
        used[common] = used.get(common, 0) + 1
        for k in members:
            shared[k] = f"{common}_merged_{used[common]}"
    outer: dict[str, onnx.TensorProto] = {}
    for i, m in enumerate(models):
        for node in m.graph.node:
            for j, t in enumerate(node.input):
                node.input[j] = shared.get((t, i), t)
        for t in m.graph.initializer:
            new = shared.get((t.name, i))
            if new is not None and new not in outer:
                outer[new] = onnx.TensorProto()
                outer[new].CopyFrom(t)
                outer[new].name = new

    def branch(m: onnx.ModelProto, name: str) -> onnx.GraphProto:
        small = [t for t in m.graph.initializer if not hoisted(t)]
        return helper.make_graph(list(m.graph.node), name, [], list(m.graph.output), initializer=small)

    flag = helper.make_tensor_value_info("use_cache_branch", onnx.TensorProto.BOOL, [1])
    node = helper.make_node(
        "If",
        ["use_cache_branch"],
        [o.name for o in models[0].graph.output],
        name="optimum::if",
        then_branch=branch(models[1], "with_past"),
        else_branch=branch(models[0], "no_past"),
    )
    graph = helper.make_graph(
        [node],
        "merged",
        [*inputs.values(), flag],
        list(models[0].graph.output),
        initializer=list(outer.values()),
    )
    opsets: dict[str, onnx.OperatorSetIdProto] = {}
    for m in models:
        for o in m.opset_import:
            opsets.setdefault(o.domain, o)
    return helper.make_model(graph, opset_imports=list(opsets.values()), ir_version=models[1].ir_version)


def copy_model(proto: onnx.ModelProto) -> onnx.ModelProto:
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(proto)
    return out


def merged_decoder(name: str, path: Path) -> Path:
    """Export ``name`` without and with a cache and write optimum's merged decoder of the two to
    ``path`` (see :func:`merge_decoders`); return ``path``."""
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        no_past = onnx.load(str(export(name, Path(tmp) / "decoder_model.onnx", past=False)))
        with_past = onnx.load(str(export(name, Path(tmp) / "decoder_with_past_model.onnx")))
    onnx.save(merge_decoders(no_past, with_past), str(path))
    return path


def exclude_embeds(src: Path, out: Path) -> tuple[Path, Path]:
    """``src`` split as ONNX Runtime GenAI's builder writes a vision-language model's text part with
    ``exclude_embeds=true``: ``<stem>_embeds.onnx``, the decoder taking ``inputs_embeds`` [batch, seq,
    hidden] in place of ``input_ids``, with its head size symbolic (``kv_cache_dim``, as the builder
    names it); and ``<stem>_embedding.onnx``, the embedding model (``input_ids`` in, ``inputs_embeds``
    out: the Gather on the table).  Returns (decoder, embedding model)."""
    import onnx
    from onnx import helper

    proto = onnx.load(str(src))
    graph = proto.graph
    gather = next(n for n in graph.node if n.op_type == "Gather" and n.input[1] == "input_ids")
    table = next(i for i in graph.initializer if i.name == gather.input[0])
    hidden = table.dims[1]
    ids = next(i for i in graph.input if i.name == "input_ids")
    embeds = helper.make_tensor_value_info(
        "inputs_embeds", onnx.TensorProto.FLOAT, ["batch", "sequence_length", hidden]
    )
    embedding = helper.make_model(
        helper.make_graph(
            [
                helper.make_node(
                    "Gather", [table.name, "input_ids"], ["inputs_embeds"], name="/model/embed_tokens/Gather"
                )
            ],
            "embedding",
            [ids],
            [embeds],
            [table],
        ),
        opset_imports=list(proto.opset_import),
    )
    nodes = []
    for n in graph.node:
        if n is gather:
            continue
        for i, t in enumerate(n.input):
            if t == gather.output[0]:
                n.input[i] = "inputs_embeds"
        if n.op_type == "Shape" and list(n.input) == ["input_ids"]:  # [batch, seq]: the embeddings' first two
            n.input[0] = "inputs_embeds"
            if not any(a.name == "end" for a in n.attribute):
                n.attribute.append(helper.make_attribute("end", 2))
        nodes.append(n)
    assert not any("input_ids" in n.input for n in nodes), "input_ids read by more than the embedding"
    del graph.node[:]
    graph.node.extend(nodes)
    inputs = [embeds if i.name == "input_ids" else i for i in graph.input]
    del graph.input[:]
    graph.input.extend(inputs)
    if not any(n.input[0] == table.name for n in nodes if n.input):  # an untied head keeps its own table
        kept = [i for i in graph.initializer if i.name != table.name]
        del graph.initializer[:]
        graph.initializer.extend(kept)
    for v in (*graph.input, *graph.output):
        if "key" in v.name or "value" in v.name:
            v.type.tensor_type.shape.dim[-1].dim_param = "kv_cache_dim"
    del graph.value_info[:]
    decoder_path, embedding_path = out / f"{src.stem}_embeds.onnx", out / f"{src.stem}_embedding.onnx"
    onnx.save(proto, str(decoder_path))
    onnx.save(embedding, str(embedding_path))
    return decoder_path, embedding_path


def _rms_pattern(
    mul: onnx.NodeProto, producer: dict[str, onnx.NodeProto]
) -> tuple[str, str, str, list[onnx.NodeProto]] | None:
    """``scale * (x * rsqrt(mean(x^2) + eps))`` ending at ``mul``: (x, scale, eps tensor, nodes)."""
    for scale_idx in (0, 1):
        inner = producer.get(mul.input[1 - scale_idx])
        if inner is None or inner.op_type != "Mul":
            continue
        for x_idx in (0, 1):
            x = inner.input[x_idx]
            rsq = producer.get(inner.input[1 - x_idx])
            if rsq is None or rsq.op_type not in ("Rsqrt", "Reciprocal"):
                continue
            chain: list[onnx.NodeProto] = [mul, inner, rsq]
            nxt = producer.get(rsq.input[0])
            if rsq.op_type == "Reciprocal" and nxt is not None and nxt.op_type == "Sqrt":
                chain.append(nxt)
                nxt = producer.get(nxt.input[0])
            if nxt is None or nxt.op_type != "Add":
                continue
            add = nxt
            mean = producer.get(add.input[0])
            if mean is None or mean.op_type != "ReduceMean":
                continue
            powr = producer.get(mean.input[0])
            if powr is None or powr.op_type not in ("Pow", "Mul") or powr.input[0] != x:
                continue
            chain += [add, mean, powr]
            return x, mul.input[scale_idx], add.input[1], chain
    return None


# ------------------------------------------------------------------------------------------------ cache


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "absent"


def cache_key(name: str) -> str:
    parts = {
        "revision": EXPORT_REVISION,
        "name": name,
        "config": SPECS[name].config,
        "versions": {d: _version(d) for d in ("torch", "transformers", "onnx", "onnxscript")},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def cached_export(name: str) -> Path:
    """The cached export of ``name``, made now if missing; concurrent callers are safe."""

    def make(tmp: Path) -> Path:
        export(name, tmp / f"{name}.onnx")
        return tmp

    final = cache_dir() / "decoders" / f"{name}-{cache_key(name)}"
    return build_once(final, f"{name}.onnx", make) / f"{name}.onnx"


def decoder(name: str) -> Path:
    """The cached dynamo export of ``name`` (see the module docstring)."""
    return cached_export(name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="folder to write the models into")
    parser.add_argument("names", nargs="*", default=list(TINY), help="models (default: the tiny ones)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        path = export(name, args.out / f"{name}.onnx")
        print(path)
        if name in BUILDER_STYLE:
            print(builder_style(path, args.out / f"{name}_builder.onnx"))
        if name in MERGED:
            print(merged_decoder(name, args.out / f"{name}_merged.onnx"))
        if name in BUILDER_STYLE:  # the text part of a vision-language layout, beside its embedding model
            print(*exclude_embeds(path, args.out), sep="\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
