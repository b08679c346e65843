"""A decoder's KV cache pairs: each layer's past inputs and the present outputs grown from them.

Found two ways, the first that gives a complete set:

1. **by name**, the exporters' conventions (``past_key_values.N.key`` with ``present.N.key``,
   ``past.N.value``, ``past_key_N``, ``key_cache.N``...): a past and a present of each kind for every
   layer ``0 .. L-1``;
2. **by the graph**, for names that follow none: the attention nodes that take a past and give a present,
   by their input and output slots (onnxruntime's ``GroupQueryAttention``, ``MultiHeadAttention``,
   ``DecoderMaskedMultiHeadAttention`` and ``Attention``, ONNX's ``Attention``), else the ``Concat`` that
   grows a past input into a present output (a plain export's attention).  Layers are numbered by the one
   number their tensors' names carry where they all carry one, else in the order the graph computes them.

Either way each present must be computed from its own past, which is checked through the graph: a name
alone never makes a cache.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from onnxpipe.core.kv import KVPair
from onnxpipe.ir.model import FLOAT_TYPES, ModelView

PAST_NAME = re.compile(r"past|cache", re.IGNORECASE)
"""What names a cache input (a past): the word ``past`` or ``cache``."""
_PRESENT = re.compile(r"present|cache", re.IGNORECASE)
_CROSS = re.compile(r"[._](?:encoder|cross)(?:[._]|$)")

ATTENTION_SLOTS: Mapping[tuple[str, bool], tuple[tuple[int, int], ...]] = {
    ("GroupQueryAttention", False): ((3, 1), (4, 2)),
    ("MultiHeadAttention", False): ((6, 1), (7, 2)),
    ("DecoderMaskedMultiHeadAttention", False): ((5, 1), (6, 2)),
    ("Attention", False): ((4, 1),),
    ("Attention", True): ((4, 1), (5, 2)),
}
"""(op, in ONNX's own domain) -> (past input slot, present output slot) of the key, then of the value
(onnxruntime's ``Attention`` keeps both in one ``past`` tensor)."""

_PASS = frozenset({"Identity", "Cast"})
"""Ops a cache tensor may pass through between the graph's edge and the node that reads or makes it."""


def find_pairs(view: ModelView) -> tuple[KVPair, ...] | None:
    """The cache pairs of ``view`` by name, else by the graph; None when neither finds a complete set
    whose presents are each computed from their past."""
    for found in (pairs_by_name(view), pairs_by_graph(view)):
        if found and all(
            past in ancestors(view, present)
            for p in found
            for past, present in zip(p.pasts, p.presents, strict=True)
        ):
            return found
    return None


def ancestors(view: ModelView, tensor: str) -> set[str]:
    """Every tensor ``tensor`` is computed from (graph inputs included)."""
    seen: set[str] = set()
    stack = [tensor]
    while stack:
        t = stack.pop()
        pos = view.producer.get(t)
        if pos is None:
            continue
        for r in view.nodes[pos].reads:
            if r not in seen:
                seen.add(r)
                stack.append(r)
    return seen


# ------------------------------------------------------------------------------------------- by name


def kv_name(name: str, role: re.Pattern[str]) -> tuple[int, str] | None:
    """``(layer, "key" | "value" | "kv")`` when ``name`` looks like a cache tensor of ``role``."""
    if not role.search(name):
        return None
    numbers = re.findall(r"\d+", name)
    if len(numbers) != 1:
        return None
    return int(numbers[0]), _kind(name)


def _kind(name: str) -> str:
    """``key``, ``value`` or ``kv`` (both, or neither said) from a cache tensor's name; ``cross_`` before
    it for an encoder-decoder's cross-attention cache (optimum's ``present.N.encoder.key``)."""
    rest = re.sub(r"key_values|key_value", "", name.lower())
    if _CROSS.search(rest):
        return "cross_" + _kind(_CROSS.sub(".", rest))
    if "key" in rest:
        return "key"
    if "value" in rest:
        return "value"
    if re.search(r"(?:^|[._])k(?:$|[._])", rest):
        return "key"
    if re.search(r"(?:^|[._])v(?:$|[._])", rest):
        return "value"
    return "kv"


def pairs_by_name(view: ModelView) -> tuple[KVPair, ...] | None:
    """The pairs the names give: a past (a floating-point input) and a present output of each kind for
    every layer ``0 .. L-1``, key and value apart or in one tensor each."""
    pasts: dict[tuple[int, str], str] = {}
    for t in view.inputs:
        got = kv_name(t, PAST_NAME)
        if got is not None and got not in pasts and view.tensor(t).elem_type in FLOAT_TYPES:
            pasts[got] = t
    presents: dict[tuple[int, str], str] = {}
    for t in view.outputs:
        got = kv_name(t, _PRESENT)
        if got is not None and got not in presents and t not in view.inputs:
            presents[got] = t
    if not pasts or set(pasts) != set(presents):
        return None
    layers = sorted({n for n, _ in pasts})
    kinds = {kind for _, kind in pasts}
    cross = {"cross_key", "cross_value"} & kinds
    if layers != list(range(len(layers))) or kinds - cross not in ({"key", "value"}, {"kv"}):
        return None
    if "kv" in kinds:
        return tuple(KVPair(n, pasts[(n, "kv")], None, presents[(n, "kv")], None) for n in layers)
    prefixes = ("", "cross_") if cross else ("",)
    if any((n, p + kind) not in pasts for n in layers for p in prefixes for kind in ("key", "value")):
        return None
    return tuple(  # the self-attention pairs first, by layer: ``kv[layer]`` is layer's own cache
        KVPair(
            n,
            pasts[(n, p + "key")],
            pasts[(n, p + "value")],
            presents[(n, p + "key")],
            presents[(n, p + "value")],
            bool(p),
        )
        for p in prefixes
        for n in layers
    )


# ------------------------------------------------------------------------------------------ by graph


def pairs_by_graph(view: ModelView) -> tuple[KVPair, ...] | None:
    """The pairs the attention nodes' slots give, else those the ``Concat`` nodes that grow a past into
    a present give (two per layer, key first, in the order of the inputs)."""
    groups = _attention_groups(view) or _concat_groups(view)
    if not groups:
        return None
    if len({t for g in groups for pair in g for t in pair}) != 2 * sum(len(g) for g in groups):
        return None  # a tensor in two places: no consistent cache
    return tuple(  # a group of one pair: key and value in one tensor
        KVPair(layer, g[0][0], g[1][0] if len(g) > 1 else None, g[0][1], g[1][1] if len(g) > 1 else None)
        for layer, g in enumerate(_numbered(view, groups))
    )


Group = Sequence[tuple[str, str]]
"""One layer's (past, present) pairs: key then value, or one tensor holding both."""


def _attention_groups(view: ModelView) -> list[Group]:
    """Per attention node that takes pasts and gives presents (in the graph's order): its pairs."""
    groups: list[Group] = []
    for node in view.nodes:
        slots = ATTENTION_SLOTS.get((node.op_type, node.domain in ("", "ai.onnx")))
        if slots is None:
            continue
        proto = view.proto.graph.node[node.index]  # by position: with the empty names of absent inputs
        group = []
        for i, o in slots:
            past = _graph_input(view, proto.input[i]) if i < len(proto.input) and proto.input[i] else None
            present = _graph_output(view, proto.output[o]) if o < len(proto.output) else None
            if past is not None and present is not None:
                group.append((past, present))
        if group and len(group) == len(slots):
            groups.append(group)
    return groups


def _concat_groups(view: ModelView) -> list[Group]:
    """The ``Concat`` nodes (not on the batch axis) that join a floating-point input of rank 3 or more
    with new entries into an output: two per layer, paired in the order of their pasts among the inputs."""
    found: list[tuple[str, str]] = []
    for present in view.outputs:
        pos = view.producer.get(_through(view, present))
        if pos is None or view.nodes[pos].op_type != "Concat":
            continue
        node = view.nodes[pos]
        axis = view.int_attributes(node).get("axis", 0)
        pasts = [p for p in (_graph_input(view, t) for t in node.inputs) if p is not None]
        shape = view.tensor(pasts[0]).shape if len(pasts) == 1 else None
        if shape is not None and len(shape) >= 3 and axis % len(shape) != 0:
            found.append((pasts[0], present))
    found.sort(key=lambda pair: view.inputs.index(pair[0]))
    if len(found) % 2:
        return []
    return [found[i : i + 2] for i in range(0, len(found), 2)]


def _graph_input(view: ModelView, tensor: str) -> str | None:
    """The floating-point graph input ``tensor`` is, through :data:`_PASS` nodes; else None."""
    tensor = _through(view, tensor)
    return tensor if tensor in view.inputs and view.tensor(tensor).elem_type in FLOAT_TYPES else None


def _graph_output(view: ModelView, tensor: str) -> str | None:
    """The graph output ``tensor`` becomes, through single :data:`_PASS` readers; else None."""
    while tensor not in view.outputs:
        readers = [view.nodes[q] for q in view.consumers.get(tensor, ())]
        passing = [n for n in readers if n.op_type in _PASS]
        if len(passing) != 1:
            return None
        tensor = passing[0].outputs[0]
    return tensor


def _through(view: ModelView, output: str) -> str:
    """The tensor ``output`` copies through :data:`_PASS` nodes (itself where no such node makes it)."""
    pos = view.producer.get(output)
    while pos is not None and view.nodes[pos].op_type in _PASS:
        output = view.nodes[pos].inputs[0]
        pos = view.producer.get(output)
    return output


def _numbered(view: ModelView, groups: list[Group]) -> list[Group]:
    """``groups`` in layer order: by the one number all of a group's names carry when every group's do
    and they count ``0 .. L-1``; else in the order the graph makes their presents."""
    numbers: list[int] = []
    for g in groups:
        found = {n for pair in g for t in pair for n in re.findall(r"\d+", t)}
        if len(found) != 1:
            break
        numbers.append(int(next(iter(found))))
    if len(numbers) == len(groups) and sorted(numbers) == list(range(len(groups))):
        return [groups[numbers.index(layer)] for layer in range(len(groups))]
    made = [min(view.producer.get(present, len(view.nodes)) for _, present in g) for g in groups]
    return [g for _, g in sorted(zip(made, groups, strict=True), key=lambda x: x[0])]
