"""What a stage adds for where it starts: the nodes it copies to make values it would otherwise receive.

A stage makes again the values of shapes or weights alone that it reads from earlier stages
(:mod:`onnxpipe.planning.recompute`): a causal mask, position ids, shape arithmetic.  Those copies run on
every call of the stage, yet the partitioner saw each node once, at its place in the model, so a stage
that starts after them was estimated without them (GPT-2 tiny in 3 stages: about 0.12 ms of 0.42 ms in
each later stage).  :func:`start_seconds` gives the partitioner, for every position a stage may start
at, the profiled seconds of the nodes that make the recomputable values crossing that position (the
union of their producers, back to data, inputs and weights), so that it balances the stages with their
copies; :func:`counting_copies` counts what each stage of a plan really copies (its
:attr:`~onnxpipe.planning.types.StageSpec.recomputed_nodes`), for the estimates.
"""

from __future__ import annotations

from collections.abc import Sequence

from onnxpipe.cost.profile import Profile
from onnxpipe.ir.model import ModelView, NodeInfo
from onnxpipe.ir.shapevalues import ValueKinds
from onnxpipe.partition import Partition
from onnxpipe.planning.decoder_recompute import with_copy_costs
from onnxpipe.planning.types import StageSpec


def start_seconds(
    view: ModelView, compute: Sequence[NodeInfo], kinds: ValueKinds, profile: Profile
) -> tuple[float, ...]:
    """Per position ``0..n`` of ``compute``: the seconds of the nodes a stage starting there copies to
    make the recomputable values that cross it (0 at position 0: the first stage receives nothing)."""
    n = len(compute)
    pos = {node.name: p for p, node in enumerate(compute)}
    closure: dict[str, frozenset[str]] = {}
    enter: list[list[str]] = [[] for _ in range(n + 1)]
    leave: list[list[str]] = [[] for _ in range(n + 2)]
    for p, node in enumerate(compute):
        for t in node.outputs:
            readers = [
                pos[view.nodes[r].name] for r in view.consumers.get(t, ()) if view.nodes[r].name in pos
            ]
            last = max((r for r in readers if r > p), default=-1)
            if last < 0 or not kinds.recomputable(t):
                continue
            enter[p + 1].append(t)  # crosses every start p + 1 .. last
            leave[last + 1].append(t)
    count: dict[str, int] = {}
    held = 0.0
    out = [0.0]
    for a in range(1, n + 1):
        for t, sign in [*((t, -1) for t in leave[a]), *((t, 1) for t in enter[a])]:
            for name in _makers(view, kinds, t, closure):
                before = count.get(name, 0)
                count[name] = before + sign
                if (before == 0) != (count[name] == 0):
                    held += sign * max(0.0, float(profile.node_seconds.get(name, 0.0)))
        out.append(max(held, 0.0))
    return tuple(out)


def _makers(
    view: ModelView, kinds: ValueKinds, tensor: str, memo: dict[str, frozenset[str]]
) -> frozenset[str]:
    """The nodes that make ``tensor`` from data, inputs and weights: its producer and, through the inputs
    that are themselves recomputable, theirs."""
    if tensor in memo:
        return memo[tensor]
    memo[tensor] = frozenset()  # a cycle cannot occur in a graph; guards the recursion anyway
    producer = view.producer.get(tensor)
    if producer is None:
        return memo[tensor]
    node = view.nodes[producer]
    found = {node.name}
    for t in node.inputs:
        if t and kinds.recomputable(t):
            found |= _makers(view, kinds, t, memo)
    memo[tensor] = frozenset(found)
    return memo[tensor]


def counting_copies(
    stages: tuple[StageSpec, ...],
    part: Partition,
    extra: Sequence[float],
    profile: Profile,
    per_call: float = 0.0,
) -> tuple[tuple[StageSpec, ...], Partition]:
    """``stages`` and ``part`` with each stage's copies in its compute (what it really copies, not the
    estimate :func:`start_seconds` gave the partitioner, which ``part`` counted with the transfer), and
    ``per_call`` seconds each (one session call's fixed cost: the same for every stage, so it moves no
    cut)."""
    copied = [
        sum(max(0.0, float(profile.node_seconds.get(n, 0.0))) for n in st.recomputed_nodes) for st in stages
    ]
    compute = tuple(c + x + per_call for c, x in zip(part.compute, copied, strict=True))
    transfer = tuple(
        max(0.0, t - (extra[a] if s > 0 else 0.0))
        for s, (t, a) in enumerate(zip(part.transfer, part.bounds[:-1], strict=True))
    )
    if compute == part.compute and transfer == part.transfer:
        return stages, part
    counted = part.recosted(compute, transfer)
    return with_copy_costs(stages, counted), counted
