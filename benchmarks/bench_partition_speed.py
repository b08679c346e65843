"""How long the exact partitioner takes, against the plain O(K n^2) dynamic programme.

Random instances shaped like profiled ONNX graphs: heavy-tailed node costs (log-normal, with a fifth of
the nodes nearly free), heavy-tailed cut sizes, and a link fast enough that transfers matter without
dominating.  For each ``n`` and ``K`` the best of ``--repeats`` wall-clock times is reported for
:func:`onnxpipe.partition.solve` and, where affordable (``n <= --ref-max-n``), for the reference DP, whose
answer must be identical.  Prints a table and writes ``benchmarks/results/partition_speed.json``.

``--devices`` times :func:`onnxpipe.partition.solve_heterogeneous` on a mixed cluster instead: the first
half of the stages on "GPUs" (MatMul-like nodes 25x faster, the rest 6x: per-device cost rows, equal for
equal devices), the rest on the reference "CPUs", 1F1B activation memory (``min(4, K - s)`` micro-batches
on stage ``s``) under caps 1.5x the smallest that fits; written to ``partition_speed_devices.json``.

    python -m benchmarks partition_speed [--sizes 1000 10000 100000] [--ks 2 4 8] [--repeats 3] [--out DIR]
    python -m benchmarks partition_speed --devices
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import reference_dp
from benchmarks.common import benchmark_parser, params_of, shown, write_result
from onnxpipe import partition
from onnxpipe.core.errors import MemoryFitError
from onnxpipe.partition.inputs import HeterogeneousRequest


def instance(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Costs in seconds, bytes per cut position (n+1), and a bandwidth in bytes/s."""
    rng = np.random.default_rng(seed)
    costs = rng.lognormal(mean=-9.0, sigma=1.5, size=n)  # median ~0.1 ms, long tail
    costs[rng.random(n) < 0.2] *= 1e-3  # reshapes, casts, shape ops...
    cut = np.round(rng.lognormal(mean=11.0, sigma=2.0, size=n + 1))  # median ~60 kB, some many MB
    bandwidth = 10e9  # 10 GB/s: a typical cut costs a few microseconds, a big one milliseconds
    return costs, cut, bandwidth


def device_instance(n: int, k: int, seed: int) -> HeterogeneousRequest:
    """The ``solve_heterogeneous`` request of the ``--devices`` cluster (see the docstring)."""
    costs, cut, bandwidth = instance(n, seed)
    rng = np.random.default_rng(seed + 1)
    matmul = rng.random(n) < 0.3
    gpu = costs * np.where(matmul, 1 / 25, 1 / 6)
    kw: dict[str, Any] = {
        "device_costs": [gpu if s < k // 2 else costs for s in range(k)],
        "cut_bytes": cut,
        "bandwidths": [bandwidth] * k,
        "item_mem": np.round(rng.lognormal(12.0, 2.0, n)),  # parameters: median ~160 kB
        "item_act": np.round(rng.lognormal(10.0, 1.5, n)),  # activations per micro-batch
        "act_factor": [float(min(4, k - s)) for s in range(k)],
        "cut_mem_factor": [float(min(4, k - s)) for s in range(k)],
    }
    try:
        partition.solve_heterogeneous(HeterogeneousRequest(None, **{**kw, "mem_caps": [0.0] * k}), k)
    except MemoryFitError as e:
        kw["mem_caps"] = [e.smallest_fit_bytes * 1.5] * k
    return HeterogeneousRequest(None, **kw)


def best_time(fn: Callable[[], partition.Partition], repeats: int) -> tuple[float, partition.Partition]:
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    assert result is not None
    return best, result


def main(argv: list[str]) -> int:
    ap = benchmark_parser(__name__, __doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ref-max-n", type=int, default=2000, help="largest n for the O(K n^2) reference")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--devices", action="store_true", help="mixed GPU/CPU cluster with per-device costs")
    args = ap.parse_args(argv)

    rows = []
    header = (
        f"{'n':>8} {'K':>3} {'onnxpipe s':>11} {'reference s':>12} {'ref/onnxpipe':>13} {'ratio to LB':>12}"
    )
    print(header)
    print("-" * len(header))
    for n in args.sizes:
        costs, cut, bw = instance(n, args.seed + n)
        for k in args.ks:
            fast_fn: Callable[[], partition.Partition]
            ref_fn: Callable[[], partition.Partition]
            if args.devices:
                request = device_instance(n, k, args.seed + n)
                fast_fn = functools.partial(partition.solve_heterogeneous, request, k)
                ref_fn = functools.partial(reference_dp.reference_solve_heterogeneous, request, k)
            else:
                fast_fn = functools.partial(partition.solve, costs, k, cut_bytes=cut, bandwidth=bw)
                ref_fn = functools.partial(
                    reference_dp.reference_solve, costs, k, cut_bytes=cut, bandwidth=bw
                )
            fast_s, fast = best_time(fast_fn, args.repeats)
            ref_s = None
            if n <= args.ref_max_n:
                ref_s, ref = best_time(ref_fn, 1)
                if ref != fast:
                    raise SystemExit(f"n={n} K={k}: solver and reference disagree: {fast} vs {ref}")
            speedup = None if ref_s is None else ref_s / fast_s
            rows.append(
                {
                    "n": n,
                    "k": k,
                    "onnxpipe_seconds": fast_s,
                    "reference_seconds": ref_s,
                    "reference_over_onnxpipe": speedup,
                    "bottleneck_seconds": fast.bottleneck,
                    "ratio_to_lower_bound": fast.ratio,
                    "cut_bytes_total": fast.cut_bytes_total,
                }
            )
            ref_txt = "-" if ref_s is None else f"{ref_s:.4f}"
            sp_txt = "-" if speedup is None else f"{speedup:.0f}x"
            print(f"{n:>8} {k:>3} {fast_s:>11.4f} {ref_txt:>12} {sp_txt:>13} {fast.ratio:>12.4f}", flush=True)

    solver = "solve_heterogeneous (device_costs, activation memory)" if args.devices else "solve"
    instance_text = "lognormal(-9, 1.5) s node costs (20% scaled by 1e-3), lognormal(11, 2) B cuts, 10 GB/s"
    if args.devices:
        instance_text += (
            "; first K//2 stages on GPUs (30% of nodes 25x faster, the rest 6x), the rest on CPUs; 1F1B "
            "activation memory min(4, K - s), caps 1.5x the smallest uniform cap that fits"
        )
    summary = {
        "description": f"best-of-repeats wall time of onnxpipe.partition.{solver} vs the O(K n^2) reference",
        "instance": instance_text,
    }
    name = "partition_speed_devices" if args.devices else "partition_speed"
    out = write_result(name, params_of(args), rows, summary=summary, out=args.out)
    print(f"wrote {shown(out)}")
    return 0
