"""Baseline pipeline-split heuristics that onnxpipe's exact partitioner is compared against.

Each takes plain numbers and returns ``bounds = (0 = b_0 < ... < b_K = n)`` in the convention of
:mod:`onnxpipe.partition` (stage ``s`` holds items ``[b_s, b_{s+1})``), so any of them can be scored with
:func:`onnxpipe.partition.evaluate` under exactly the same objective as the exact solver.

* :func:`equal_count` — the same number of nodes per stage (DeepSpeed's ``partition_method="uniform"``).
* :func:`parameter_balanced` — DeepSpeed's default ``partition_method="parameters"``: per-layer parameter
  counts fed to ``deepspeed.runtime.utils.partition_balanced``.
* :func:`torchgpipe_block` — torchgpipe's ``balance_by_time``/``balance_by_size`` core,
  ``torchgpipe.balance.blockpartition.solve`` (Bárány & Grinberg, "Block partitions of sequences",
  Israel J. Math. 2015, arXiv:1308.2452).

They are re-implemented from the upstream algorithms (no DeepSpeed/torch dependency) and kept faithful,
including their tie rules; the few deliberate deviations are marked in each docstring.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _check(n: int, k: int) -> None:
    if not 1 <= k <= n:
        raise ValueError(f"cannot split {n} items into {k} non-empty stages: use 1 <= k <= {n}")


def equal_count(n: int, k: int) -> tuple[int, ...]:
    """``k`` stages of ``n // k`` items, the first ``n % k`` stages one item longer.

    This is DeepSpeed's ``partition_uniform`` (``partition_method="uniform"``): it looks at nothing but
    the node count.
    """
    _check(n, k)
    chunk, residual = divmod(n, k)
    bounds = [0]
    for s in range(k):
        bounds.append(bounds[-1] + chunk + (1 if s < residual else 0))
    return tuple(bounds)


def parameter_balanced(param_bytes: Sequence[float], k: int) -> tuple[int, ...]:
    """DeepSpeed's default split: balance the parameters held by each stage.

    ``PipelineModule._partition_layers`` with ``partition_method="parameters"`` (the default) calls
    ``ds_utils.partition_balanced(weights=param_counts, num_parts=num_stages)``.  Since DeepSpeed 0.9
    that function is a dynamic programme over prefix sums that, for every prefix and part count, keeps
    the split minimising ``max(part) - min(part)`` (the *spread* of the part weights, not the largest
    part), breaking ties towards the *last* candidate start (``if dp_cost[i, j] >= cost``).  Earlier
    versions bisected on the heaviest part with a greedy probe (``_lprobe``, ``eps=1e-3``).  This is the
    current DP, with the innermost loop vectorised (same candidates, same order, same tie rule);
    ``O(n^2 k)``.  Weights are scale-free here, so bytes or counts give the same split.

    The objective ignores compute time entirely: layers without parameters (activations, reshapes,
    attention math) cost nothing to it, which is exactly why it can be far from the time-optimal split.
    """
    w = np.asarray(param_bytes, dtype=np.float64)
    n = int(w.size)
    _check(n, k)
    if n <= k:  # DeepSpeed: partition_uniform(n, k); with n == k that is one item per stage
        return tuple(range(n + 1))
    dp_max = np.full((n + 1, k + 1), np.inf)
    dp_min = np.full((n + 1, k + 1), np.inf)
    dp_cost = np.full((n + 1, k + 1), np.inf)
    position = np.zeros((n + 1, k + 1), dtype=np.int64)
    prefix = np.zeros(n + 1)
    prefix[1:] = np.cumsum(w)
    dp_max[0, 0] = 0.0
    dp_cost[0, 0] = 0.0
    for i in range(1, n + 1):
        seg = prefix[i] - prefix[:i]  # weight of the last part [kk, i) for kk = 0..i-1
        for j in range(1, min(i, k) + 1):
            max_sum = np.maximum(dp_max[:i, j - 1], seg)
            min_sum = np.minimum(dp_min[:i, j - 1], seg)
            cost = max_sum - min_sum
            # Sequential `if dp_cost >= cost: take kk` keeps the last kk that attains the minimum.
            best = cost.min()
            kk = i - 1 - int(np.argmax(cost[::-1] == best))
            dp_cost[i, j] = cost[kk]
            dp_max[i, j] = max_sum[kk]
            dp_min[i, j] = min_sum[kk]
            position[i, j] = kk
    parts = [n]
    for j in range(k, 0, -1):
        parts.append(int(position[parts[-1], j]))
    return tuple(reversed(parts))


def torchgpipe_block(costs: Sequence[float], k: int, *, max_moves: int | None = None) -> tuple[int, ...]:
    """torchgpipe's balancer: ``blockpartition.solve`` (Bárány & Grinberg's block partition).

    Faithful to ``torchgpipe/balance/blockpartition.py``: costs are min-max normalised to ``[0, 1]``; the
    split starts from ``n // k`` items per block (the remainder in the last block); then ``p`` is a
    heaviest block and, while the lightest block ``q`` weighs less than ``M - 1`` (normalised units), one
    boundary element of the block next to ``q`` on the side of ``p`` moves into ``q``; ``p`` is re-chosen
    only when the block that gave an element was ``p`` itself.  Python's ``max``/``min`` over
    ``(block_size, index)`` tuples send ties to the highest index for ``p`` and the lowest for ``q``, which
    this port reproduces (it is a line-by-line port).  The stopping rule only guarantees that block sums
    differ by at most one *largest item*, and the normalisation subtracts the smallest cost from every
    item, so stages with many cheap items are under-weighted: this is a heuristic, not an optimiser.

    Deviations, so that a benchmark never hangs or gets an invalid split: upstream can loop forever (a
    cycle of element moves; it happens with many equal minimal costs, e.g. ``[0, 2, 0, 0, 0, 0, 2000, 4]``
    into 6 blocks), so this port stops as soon as a state repeats or after ``max_moves`` moves (default
    ``4 * n * k + 1000``; converging runs need far fewer); and empty blocks, which upstream can leave
    behind and ``torchgpipe.GPipe`` would reject, are repaired by shifting boundaries the minimum amount.
    torchgpipe feeds it integer microseconds (``profile_times``); the normalisation makes the unit
    irrelevant, so seconds are used as they are.
    """
    seq = [float(x) for x in costs]
    n = len(seq)
    _check(n, k)
    minimum = min(seq)
    maximum = max(seq) - minimum
    normal = [0.0 for _ in seq] if maximum == 0 else [(x - minimum) / maximum for x in seq]
    splits = [n // k * (x + 1) for x in range(k - 1)] + [n]

    def block_size(i: int) -> float:
        start = splits[i - 1] if i > 0 else 0
        return sum(normal[start : splits[i]])

    def leaderboard() -> list[tuple[float, int]]:
        return [(block_size(i), i) for i in range(k)]

    budget = 4 * n * k + 1000 if max_moves is None else max_moves
    seen: set[tuple[tuple[int, ...], int, float]] = set()
    moves = 0
    done = False
    while not done and moves < budget:
        max_size, p = max(leaderboard())  # (1) a maximal block
        while moves < budget:
            state = (tuple(splits), p, max_size)
            if state in seen:  # upstream would cycle forever from here
                done = True
                break
            seen.add(state)
            min_size, q = min(leaderboard())  # (2) stop when M(P) <= m(P) + 1
            if max_size <= min_size + 1:
                done = True
                break
            if p < q:  # (3) move the last element of B_{q-1} into B_q ...
                h = q - 1
                splits[h] -= 1
            else:  # ... or the first element of B_{q+1} into B_q
                h = q + 1
                splits[q] += 1
            moves += 1
            if p == h:  # the maximal block changed: back to (1)
                break
    bounds = [0, *splits]
    for s in range(1, k):  # repair empty blocks (see docstring)
        bounds[s] = max(bounds[s], bounds[s - 1] + 1)
    for s in range(k - 1, 0, -1):
        bounds[s] = min(bounds[s], bounds[s + 1] - 1)
    return tuple(bounds)
