"""Exact contiguous K-way partitioning of a cost sequence (the pipeline-stage balancer).

Items ``0..n-1`` (nodes in a fixed topological order) carry non-negative compute costs.  A partition into
exactly ``K`` contiguous, non-empty stages is a tuple ``bounds = (0 = b_0 < b_1 < ... < b_K = n)``; stage
``s`` holds items ``[b_s, b_{s+1})``.  ``cut_bytes[p]`` is what a stage *starting* at position ``p`` must
receive; stage 0 receives nothing (``cut_bytes[0]`` is ignored).  This module knows nothing about ONNX: it
balances plain numbers, so it can be tested exhaustively and reused for any sequential workload.

Objective
---------
Stage ``s`` running on a device of speed ``speed[s]`` fed by a link of ``bandwidth[s]`` and ``latency[s]``::

    compute_s  = (P_s[b_{s+1}] - P_s[b_s]) / speed[s]       P_s = prefix sums of stage s's item costs
    transfer_s = cut_bytes[b_s] / bandwidth[s] + latency[s]  (0 for s = 0)
    cost_s     = compute_s + transfer_s        when transfers do not overlap compute
               = max(compute_s, transfer_s)    when they do (the link is its own pipeline resource)

and the bottleneck ``max_s cost_s`` is minimised *exactly*.  The item costs are one row shared by every
stage (``costs``, with ``speeds``), or one row per stage (``device_costs``: item ``i``'s time on the device
of stage ``s``; speeds are then 1).  The homogeneous issue (:func:`solve`) is the special case of one row,
``speed = 1``, one bandwidth, no latency, no overlap.  Optional memory limits require
``sum(item_mem in stage) + act_factor[s] * sum(item_act in stage) + cut_mem_factor[s] * cut_bytes[b_s]
<= mem_cap[s]`` (the first two summed per item, as prefix sums of ``item_mem + act_factor[s] * item_act``).

Tie-break: among splits whose bottleneck is within ``TIE_RTOL`` (relative 1e-9) of the optimum, the one
with the fewest bytes crossing cuts wins; when the tolerance saves no byte, an exactly optimal split is
returned.  Equal byte counts are settled deterministically: going from the last stage backwards, each
stage starts at the earliest position that keeps the choice optimal.

Second level: the stages below the bottleneck are balanced among themselves.  The stages within
``TIE_RTOL`` of the bottleneck stay; every run of two or more stages between them is solved again (the
bottleneck and the bytes, not a level of its own) over the items it holds (its ends fixed), and kept when
that makes its stage costs, sorted largest first, lexicographically smaller.  Without it, a dominating
item (GPT-2's LM head) makes every split of the rest optimal, and the fewest-bytes rule picks stages of a
few cheap nodes that idle.

Why this algorithm
------------------
It is the bisection-with-exact-probe method for 1-D partitioning (Nicol, "Rectilinear partitioning of
irregular data parallel computations", JPDC 1994; Pinar & Aykanat, "Fast optimal load balancing algorithms
for 1D partitioning", JPDC 2004), adapted to stage costs that depend on where a stage *starts*:

* **Probe** ("is there a split with every stage ``<= B``?").  Stage ``s`` may run from ``a`` to ``b`` iff
  ``cost(s, a, b) <= B`` and its memory fits.  Costs are non-negative, so ``cost`` is non-decreasing in
  ``b`` and the feasible ends of a start form an interval ``(a, r_s(a)]``; ``r_s`` comes for all starts at
  once from ``numpy.searchsorted`` on the prefix sums.  The classic greedy probe (make every stage as long
  as possible) is **not** exact here: a shorter stage may end where the cut is far cheaper.  So the probe
  carries the whole *set* of positions reachable after ``s`` stages, layer by layer (a running maximum of
  ``r`` over the reachable starts marks the union of their intervals), and ``B`` is feasible iff ``n`` is
  reachable after ``K`` layers.  That is exact by induction over the layers.
* **Exactness in floating point.**  ``searchsorted`` only *proposes* ``r``: every proposal is checked
  with the one canonical cost formula (the one used to report stage costs) and repaired by a vectorised
  binary search where rounding made it wrong.  Prefix sums are correctly rounded (summed as integers),
  so ``cost`` is monotone in ``b`` and accurate to an ulp of the prefix sums.
* **Search.**  The optimum ``opt`` is always a realised stage cost.  After a feasible probe ``hi`` snaps
  down to the bottleneck of the split found (``<= B``).  After an infeasible probe ``lo`` snaps up to the
  smallest cost that would let some reachable start end one item later: below that value every
  reachable set, hence the verdict, is unchanged, so ``opt`` cannot lie there.  Hence ``lo <= opt <= hi``
  always, every probe moves ``lo`` above ``B`` or ``hi`` to at most ``B``, and the loop stops only at
  ``lo == hi``, which *is* the optimum: no tolerance is involved.  The first probes gallop upward from
  the lower bound; then ``B`` bisects ``[lo, hi]``, except that once the interval spans only a few snap
  distances the next probe asks directly "anything below ``hi``?", which usually ends the search.
* **Pruning.**  A start ``a`` of stage ``s`` is dropped when even perfect balancing could not fit the
  rest, ``P[n] - P[a] > B * sum(speed[s:])`` (with a 1e-12 margin against rounding); with per-stage rows,
  when the weighted work bound of the fractional-assignment LP over the stages left exceeds ``B``
  (:attr:`_Model.relaxation`).  Dropped starts feed the lower-bound snap with the ``B`` at which they
  would come back, which keeps the argument above valid.  When the optimum is close to the average load
  only a narrow band of positions survives per layer; when one huge item dictates the optimum the bands
  stay wide (every split is nearly as good).
* **Tie-break.**  A second layered pass minimises total cut bytes over splits whose stages all cost
  ``<= threshold``: each layer is a "minimum over the intervals covering each position" problem, solved
  with a sparse-table decomposition over packed ``(bytes, position)`` keys, ``O(n log n)`` per layer.
* **Memory.**  Memory limits only shorten ``r`` (a stage's memory grows with its end, whatever the
  per-stage factors).  Minimising the largest stage memory is the same problem (per-stage rows
  ``item_mem + act_factor[s] * item_act``, "transfer" ``cut_mem_factor * cut_bytes``), so when no split
  fits the caps the same engine computes the smallest uniform cap that would, exactly, for the error.

Cost: ``O(K w log n)`` per probe where ``w <= n`` is the band width, and a dozen or two probes.  Stages
with identical parameters (equal cost rows included: they are detected and stored once) share their ``r``
arrays, so the homogeneous mode pays ``searchsorted`` once per probe, not ``K`` times.  A plain
``O(K n^2)`` dynamic programme with the same cost formula and tie rules is the test oracle
(``benchmarks/reference_dp.py``: the package never runs it).

Layout: one responsibility per module, each read and tested on its own (``numeric`` prefix sums,
``costmodel`` the one cost formula, ``inputs`` validation and bounds, ``engine`` its array searches and
the probe, search and tie-break, ``result`` the :class:`Partition`).  This module holds the public entry
points and re-exports the private names tests and benchmarks reach for; no name here equals a
submodule's name (importing the submodule would overwrite it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from onnxpipe.core.choices import Objective
from onnxpipe.core.errors import PartitionError
from onnxpipe.partition.costmodel import _Model as _Model
from onnxpipe.partition.engine import _Engine as _Engine
from onnxpipe.partition.engine import _finish, latency_bounds
from onnxpipe.partition.inputs import HeterogeneousRequest as HeterogeneousRequest
from onnxpipe.partition.inputs import (
    _check_bounds,
    _check_split,
    _heterogeneous_model,
    _homogeneous_model,
    _item_count,
    _vector,
)
from onnxpipe.partition.result import TIE_RTOL, Partition, _partition_of

__all__ = ["TIE_RTOL", "Partition", "evaluate", "evaluate_heterogeneous", "solve", "solve_heterogeneous"]


def solve(
    costs: Sequence[float],
    k: int,
    *,
    cut_bytes: Sequence[float] | None = None,
    bandwidth: float = math.inf,
    allowed_cuts: Sequence[bool] | None = None,
    tie_rtol: float = TIE_RTOL,
    start_seconds: Sequence[float] | None = None,
) -> Partition:
    """Split ``costs`` into ``k`` contiguous stages minimising the slowest stage, exactly.

    Stage cost = its compute (sum of item costs) + ``cut_bytes[start] / bandwidth`` (the time to receive
    its inputs; nothing for stage 0).  ``allowed_cuts[p] = False`` forbids a boundary at ``p`` (e.g. inside
    a fused group).  Among optimal splits (within ``tie_rtol``, relative; default ``TIE_RTOL``) the one
    moving the fewest bytes wins: measured costs carry noise, and a ``tie_rtol`` as wide as that noise
    makes near-ties resolve by the bytes (fixed by the graph) the same way on every measurement.
    ``start_seconds[p]`` (``n + 1`` entries, entry 0 ignored) is added to a stage starting at ``p``, with
    its transfer: the work a stage adds for where it starts (the copies of values it would receive).

    Raises :class:`PartitionError` for impossible requests (``k`` outside ``1..n``, too few allowed cuts)
    and malformed inputs (negative or NaN costs, wrong lengths).
    """
    model, lower = _homogeneous_model(costs, k, cut_bytes, bandwidth, allowed_cuts)
    if not 0.0 <= tie_rtol < 1.0:  # also refuses NaN
        raise PartitionError(f"tie_rtol = {tie_rtol!r} is invalid: give a relative tolerance in [0, 1)")
    start = None if start_seconds is None else _vector("start_seconds", start_seconds, model.n + 1, 0.0)
    return _finish(dataclasses.replace(model, tie_rtol=float(tie_rtol), start=start), lower)


def solve_heterogeneous(request: HeterogeneousRequest, k: int) -> Partition:
    """Split the items over ``k`` different devices in a fixed order, minimising the pipeline bottleneck
    (or, ``request.objective`` ``latency``, the sum of every stage's compute and transfer:
    :func:`onnxpipe.partition.engine.latency_bounds`).

    ``request`` (:class:`HeterogeneousRequest`, whose fields say what each means) holds everything but
    ``k``.  ``device_costs`` entries must be finite: like every stage sum here a stage's time is a
    difference of correctly rounded prefix sums, exact to an ulp of ``sum(device_costs[s][:b])``, so a
    huge placeholder for "cannot run" would blur that device's later sums.  If no split fits the memory
    caps, :class:`MemoryFitError` names (and carries as ``smallest_fit_bytes``) the smallest cap that
    would fit every stage if all stages had it, computed with the very formula the caps are checked by.

    ``lower_bound`` of the result: the largest of the work bound, the largest item on its fastest device,
    and the largest latency.  The work bound is the total work over the total speed, or with
    ``device_costs`` the fractional-assignment bound ``sum_i min_s w_s d[s][i] / sum_s w_s``, valid for
    any weights ``w >= 0`` (weak LP duality), with weights searched for the LP optimum: exact for two
    kinds of device, close for more (see ``_dual_weights``).
    """
    model, lower = _heterogeneous_model(request, k)
    if request.objective == Objective.LATENCY:
        return _partition_of(model, lower, latency_bounds(model))
    return _finish(model, lower)


def evaluate(
    costs: Sequence[float],
    bounds: Sequence[int],
    *,
    cut_bytes: Sequence[float] | None = None,
    bandwidth: float = math.inf,
) -> Partition:
    """Score a given split under :func:`solve`'s objective (a baseline, a hand-made or a saved split).

    Uses the very same cost formula as the solver, so ``evaluate(c, solve(c, k).bounds)`` reproduces the
    solver's numbers exactly and any other split can be compared with it fairly.
    """
    b = _check_bounds(bounds, len(costs))
    model, lower = _homogeneous_model(costs, len(b) - 1, cut_bytes, bandwidth, None)
    return _partition_of(model, lower, b)


def evaluate_heterogeneous(request: HeterogeneousRequest, bounds: Sequence[int]) -> Partition:
    """Score a given split under :func:`solve_heterogeneous`'s objective (``k = len(bounds) - 1``).

    Same request, same cost formula and same ``lower_bound``, so
    ``evaluate_heterogeneous(request, solve_heterogeneous(request, k).bounds)`` reproduces the solver's
    result exactly and a baseline split can be compared with it fairly.  A split the solver could not return
    is refused
    with :class:`PartitionError`: a cut that ``allowed_cuts`` forbids, or a stage over its memory cap.
    """
    b = _check_bounds(bounds, _item_count(request))
    model, lower = _heterogeneous_model(request, len(b) - 1)
    _check_split(model, b)
    return _partition_of(model, lower, b)
