"""How close to K replicas a perfectly balanced K-stage pipeline could come on the replicas' own CPUs.

Why: a balanced pipeline moves at the pace of its slowest worker, while replicas add their workers'
speeds up.  On a machine whose CPUs run at different speeds, moment by moment (a virtual machine's
vCPUs, each shared with other tenants on the host), no split reaches the replicas, and the pipeline's
``x replicas`` alone cannot tell that apart from a bad split.  The replicas' own timing records say how
fast each of their CPUs ran while they were measured, and so what the best possible pipeline on those
CPUs would have reached, from the same run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np

from onnxpipe.runtime.session import WorkerStats

WINDOW_RUNS = 2.0
"""Windows of :func:`balanced_ceiling`, in replica runs: about as far as a fast stage of a 2-stage
pipeline can run ahead of a slow one through links of 2 slots before it must wait."""

MIN_RUN_S = 1e-3
"""``onnxpipe run --compare`` gives no ceiling for replicas whose runs take less (median): such runs are
mostly Python's per-call cost, which replica threads contend for, not a CPU's speed."""


def balanced_ceiling(stats: Sequence[WorkerStats], min_run_seconds: float = 0.0) -> float:
    """``sum_w K * min_i v_i(w) / sum_w sum_i v_i(w)``: what a perfectly balanced pipeline, a stage of
    ``1/K`` of the model on each replica's CPUs, could reach against the K replicas.

    ``stats`` are the replica workers' records from one run.  ``v_i(w)`` is replica ``i``'s speed over
    window ``w`` of the time all of them were running: runs per second of running (time spent waiting
    for input is not slowness), each run counting for the share of it inside the window.  NaN when the
    records are too few or do not overlap, or their median run is under ``min_run_seconds``.

    The window's length hardly moves the ceiling (from one run to 32 runs per window, on the replicas the
    ``pipeline`` benchmark runs), so it measures lasting differences between the CPUs, which no bounded
    buffer absorbs, not one run's jitter.
    """
    runs = [[(r.run_start, r.run_end) for r in w.records if r.run_end > r.run_start] for w in stats]
    if len(runs) < 2 or not all(runs):
        return math.nan
    t0 = max(r[0][0] for r in runs)
    t1 = min(r[-1][1] for r in runs)
    typical = statistics.median(b - a for r in runs for a, b in r)
    if typical < min_run_seconds:
        return math.nan
    windows = int((t1 - t0) / (WINDOW_RUNS * typical)) if t1 > t0 else 0
    if windows < 1:
        return math.nan
    edges = np.linspace(t0, t1, windows + 1)
    speeds = np.full((len(runs), windows), math.nan)
    for i, worker in enumerate(runs):
        starts, ends = np.array(worker).T
        for w in range(windows):
            overlap = np.clip(np.minimum(ends, edges[w + 1]) - np.maximum(starts, edges[w]), 0.0, None)
            busy = float(overlap.sum())
            if busy > 0:
                speeds[i, w] = float((overlap / (ends - starts)).sum()) / busy
    speeds = speeds[:, ~np.isnan(speeds).any(axis=0)]
    if speeds.size == 0:
        return math.nan
    return float(len(runs) * speeds.min(axis=0).sum() / speeds.sum())
