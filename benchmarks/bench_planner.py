"""Cluster-aware planning against cluster-blind splits placed on the same devices (measured profiles).

For each real model (tiny GPT-2 at 64 tokens, NudeNet's YOLOv8n at 320x320, the onnx light DenseNet-121,
RapidOCR's detector; profiles measured once at 1 intra-op thread and cached under
``benchmarks/results/profiles/``) and each cluster below, the benchmark plans a streaming pipeline with
:func:`onnxpipe.planning.cluster.plan_pipeline` (``onnxpipe``) and places the splits of the baselines on
the very same devices, in the cluster's file order:

* ``homogeneous`` — onnxpipe's own exact homogeneous planner
  (:func:`onnxpipe.planning.workers.make_plan`, i.e.
  :func:`onnxpipe.partition.solve` on the reference costs, all devices taken as speed 1, told the link
  bandwidth): the best split for a cluster of identical devices;
* ``params`` — DeepSpeed's default parameter balancing (:func:`benchmarks.baselines.parameter_balanced`
  on the weight bytes each node reads first, constants that hold weights included);
* ``equal`` — the same number of nodes per stage (:func:`benchmarks.baselines.equal_count`);
* ``torchgpipe`` — torchgpipe's block partition of the reference costs
  (:func:`benchmarks.baselines.torchgpipe_block`).

Every split is costed with the planner's own objective: stage ``s`` on device ``s`` computes for
``sum(reference costs in stage) / speed[s]``; the link into it takes ``cut_bytes[start] / bandwidth +
latency``; transfers overlap compute, so the bottleneck (seconds per micro-batch in steady state) is the
largest of every stage's compute and every link's transfer.  A split *fits* when every stage's memory
under the planner's streaming model (parameters first read in the stage, plus two micro-batches of the
activations it receives) is within its device's ``memory_bytes``.  The table gives baseline / onnxpipe
bottleneck ratios: above 1 means onnxpipe's plan is faster; ``(no fit)`` marks a split that does not fit,
``(peak>cap)`` one that fits that model but not the planner's final check (every weight the stage reads,
shared ones included, plus its peak working set), which the planner only reports as a note.

Clusters (K = number of devices):

* ``a_1248_fast`` — four devices of speeds 1:2:4:8 on 10 GB/s links (10 us latency);
* ``b_1248_edge`` — ``examples/devices/edge_1248.json``: the same speeds on 100 Mbit/s, 0.5 ms latency;
* ``c_1_3`` — two devices of speeds 1 and 3 on a 10 GB/s link (the fast device should get ~3x the work);
* ``d_mem_capped`` — four equal devices, each capped at ``ceil(1.3 x total parameter bytes / 4)`` so that
  memory binds (only for models whose weights are initializers: the planner's memory model counts
  initializers, not weights built by ``Constant``/``ConstantOfShape`` nodes);
* ``e_shuffled_free`` — the 1:2:4:8 devices of ``a`` listed in the order 4, 1, 8, 2, planned with
  ``order="free"``; the baselines run in file order (they have no notion of device order).

Writes ``benchmarks/results/planner.json``: a row per model and cluster (a case); the models' own figures
and the geometric means over the cases are its ``summary``.

    python -m benchmarks planner [--models gpt2_tiny,nudenet,...] [--refresh] [--out DIR]
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from benchmarks import baselines
from benchmarks.common import (
    ROOT,
    benchmark_parser,
    cached_profile,
    compute_costs,
    model_path,
    params_of,
    print_table,
    shown,
    write_result,
)
from onnxpipe import partition
from onnxpipe.api import PlanRequest
from onnxpipe.cluster.devicesfile import load_cluster
from onnxpipe.cluster.model import Cluster, Device, Link
from onnxpipe.core.errors import MemoryFitError
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.graph import cut_profile
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.partition.inputs import HeterogeneousRequest
from onnxpipe.planning.cluster import plan_pipeline
from onnxpipe.planning.sequences import first_reader_param_bytes, tensor_sizes
from onnxpipe.planning.stages import assign_stages
from onnxpipe.planning.workers import make_plan
from onnxpipe.schedule.simulate import in_flight

MODELS: dict[str, dict[str, tuple[int, ...]] | None] = {
    "gpt2_tiny": {"input_ids": (1, 64)},
    "nudenet": {"images": (1, 3, 320, 320)},
    "light_densenet121": None,  # fixed 1x3x224x224
    "rapidocr_det": None,  # profiled at 1x3x64x64
}
BASELINES = ("homogeneous", "params", "equal", "torchgpipe")
FAST = Link(10e9, 1e-5)
EDGE = ROOT / "examples" / "devices" / "edge_1248.json"
MEM_HEADROOM = 1.3
CUT_MEM_FACTOR = 2.0  # the planner's streaming model: a stage holds the micro-batch it computes and the next
SHUFFLE = (2, 0, 3, 1)  # edge_1248's boards x4, x1, x8, x2


# --------------------------------------------------------------------------------------------------
# clusters


def cluster_1248_fast() -> Cluster:
    edge = load_cluster(EDGE)
    return Cluster(edge.devices, (FAST,) * (edge.size - 1), "1:2:4:8 on 10 GB/s")


def cluster_edge() -> Cluster:
    return load_cluster(EDGE)


def cluster_1_3() -> Cluster:
    devices = (Device("slow-x1", speed=1.0), Device("fast-x3", speed=3.0))
    return Cluster(devices, (FAST,), "speeds 1 and 3 on 10 GB/s")


def cluster_capped(cap: int | None) -> Cluster:
    devices = tuple(Device(f"cpu{i}", memory_bytes=cap) for i in range(4))
    what = "without memory limits" if cap is None else f"capped at {cap} bytes"
    return Cluster(devices, (FAST,) * 3, f"4 equal devices {what}")


def cluster_shuffled() -> Cluster:
    fast = cluster_1248_fast()
    return replace(fast.arranged(SHUFFLE), source="1:2:4:8 listed x4, x1, x8, x2 on 10 GB/s")


# --------------------------------------------------------------------------------------------------
# the planner's numbers, for any split


@dataclass(frozen=True)
class Problem:
    """What the planner sees of one model: reference costs, cut bytes, parameter and weight bytes."""

    name: str
    view: ModelView
    profile: Profile
    costs: list[float]
    cuts: list[float]
    params: list[float]  # initializer bytes first read by each compute node (the planner's memory model)
    weights: list[float]  # the same plus weights made by constant nodes (what DeepSpeed would balance)
    sizes: dict[str, int]  # tensor bytes at the profiled shapes


def problem_of(name: str, shapes: dict[str, tuple[int, ...]] | None, refresh: bool) -> Problem:
    view = load_model(model_path(name))
    profile, cached = cached_profile(name, view, threads=1, shapes=shapes, runs=30, refresh=refresh)
    print(f"{name}: {'cached' if cached else 'new'} profile", file=sys.stderr)
    compute = view.compute_nodes
    sizes = tensor_sizes(view, profile)
    const_out = {o for n in view.nodes if n.is_constant for o in n.outputs}
    free = set(view.initializers) | const_out
    cuts = cut_profile([n.reads for n in compute], [n.outputs for n in compute], sizes, free)
    seen: set[str] = set()
    weights = []
    for n in compute:
        total = 0
        for t in n.reads:
            if t in seen:
                continue
            if t in view.initializers:
                total += view.initializers[t]
            elif t in const_out:
                total += sizes.get(t, 0)
            else:
                continue
            seen.add(t)
        weights.append(float(total))
    return Problem(
        name=name,
        view=view,
        profile=profile,
        costs=compute_costs(view, profile),
        cuts=[float(c) for c in cuts],
        params=first_reader_param_bytes(view),
        weights=weights,
        sizes=sizes,
    )


@dataclass(frozen=True)
class Scored:
    bounds: tuple[int, ...]
    devices: tuple[str, ...]
    reference_seconds: tuple[float, ...]  # stage compute on a speed-1 device
    compute: tuple[float, ...]
    transfer: tuple[float, ...]
    bottleneck: float
    memory: tuple[float, ...]
    fits: bool
    exact_memory: tuple[float, ...]
    fits_exact: bool

    def to_obj(self) -> dict[str, Any]:
        return {
            "bounds": list(self.bounds),
            "devices": list(self.devices),
            "node_counts": [b - a for a, b in zip(self.bounds, self.bounds[1:], strict=False)],
            "reference_ms": [x * 1e3 for x in self.reference_seconds],
            "compute_ms": [x * 1e3 for x in self.compute],
            "transfer_ms": [x * 1e3 for x in self.transfer],
            "bottleneck_ms": self.bottleneck * 1e3,
            "memory_bytes": list(self.memory),
            "fits": self.fits,
            "exact_memory_bytes": list(self.exact_memory),
            "fits_exact": self.fits_exact,
        }


def score(p: Problem, bounds: Sequence[int], cluster: Cluster) -> Scored:
    """A split on ``cluster`` (stage ``s`` on device ``s``) under the planner's objective and memory model.

    compute_s = sum(costs in stage) / speed_s; link_s = cut_bytes[start] / bandwidth_s + latency_s (none
    into stage 0); bottleneck = max over stages of max(compute_s, link_s), since transfers overlap compute.
    """
    k = len(bounds) - 1
    assert k == cluster.size, (k, cluster.size)
    ref, comp, tr, mem = [], [], [], []
    for s in range(k):
        a, b = bounds[s], bounds[s + 1]
        work = math.fsum(p.costs[a:b])
        ref.append(work)
        comp.append(work / cluster.speeds[s])
        link = 0.0 if s == 0 else p.cuts[a] / cluster.bandwidths[s] + cluster.latencies[s]
        tr.append(link)
        held = math.fsum(p.params[a:b]) + (0.0 if s == 0 else CUT_MEM_FACTOR * p.cuts[a])
        mem.append(held)
    bottleneck = max(max(c, t) for c, t in zip(comp, tr, strict=True))
    caps = cluster.mem_caps
    fits = all(m <= cap for m, cap in zip(mem, caps, strict=True))
    # the planner's final check: every weight a stage reads (shared ones in each stage) + peak working set
    specs = assign_stages(p.view, bounds, p.sizes, comp, tr)
    exact = tuple(
        float(sp.param_bytes + in_flight("stream", 0, k, 1) * sp.peak_activation_bytes) for sp in specs
    )
    fits_exact = all(m <= cap for m, cap in zip(exact, caps, strict=True))
    _cross_check(p, bounds, cluster, bottleneck)
    return Scored(
        tuple(bounds),
        cluster.names,
        tuple(ref),
        tuple(comp),
        tuple(tr),
        bottleneck,
        tuple(mem),
        fits,
        exact,
        fits_exact,
    )


def _cross_check(p: Problem, bounds: Sequence[int], cluster: Cluster, bottleneck: float) -> None:
    """:func:`onnxpipe.partition.evaluate_heterogeneous` must agree with :func:`score`."""
    request = HeterogeneousRequest(
        p.costs,
        speeds=list(cluster.speeds),
        cut_bytes=p.cuts,
        bandwidths=list(cluster.bandwidths),
        latencies=list(cluster.latencies),
        overlap=True,
    )
    got = partition.evaluate_heterogeneous(request, list(bounds))
    if not math.isclose(float(got.bottleneck), bottleneck, rel_tol=1e-9, abs_tol=0.0):
        raise AssertionError(
            f"{p.name}: evaluate_heterogeneous says {got.bottleneck!r} for {tuple(bounds)}, "
            f"this benchmark {bottleneck!r}"
        )


def bounds_of(plan: Any) -> tuple[int, ...]:
    b = [0]
    for s in plan.stages:
        b.append(b[-1] + len(s.node_names))
    return tuple(b)


# --------------------------------------------------------------------------------------------------
# one (model, cluster) case


def baseline_bounds(p: Problem, cluster: Cluster) -> dict[str, tuple[int, ...]]:
    k = cluster.size
    n = len(p.costs)
    link = cluster.uniform_link
    bandwidth = link.bandwidth_bytes_per_s if link is not None else math.inf
    homogeneous = make_plan(p.view, p.profile, k, bandwidth_bytes_per_s=bandwidth)
    return {
        "homogeneous": bounds_of(homogeneous),
        "params": baselines.parameter_balanced(p.weights, k),
        "equal": baselines.equal_count(n, k),
        "torchgpipe": baselines.torchgpipe_block(p.costs, k),
    }


def run_case(
    p: Problem, label: str, cluster: Cluster, order: Literal["fixed", "free"] = "fixed"
) -> dict[str, Any]:
    plan = plan_pipeline(p.view, p.profile, PlanRequest(cluster.size, devices=cluster, order=order))
    placed = plan.cluster
    assert placed is not None
    ours = score(p, bounds_of(plan), placed)
    if not math.isclose(ours.bottleneck, plan.bottleneck_seconds, rel_tol=1e-9, abs_tol=0.0):
        raise AssertionError(
            f"{p.name} on {label}: re-scored onnxpipe plan {ours.bottleneck!r} != planner's "
            f"{plan.bottleneck_seconds!r}: this benchmark's cost formula drifted from the planner's"
        )
    if not ours.fits:
        raise AssertionError(f"{p.name} on {label}: onnxpipe's plan does not fit memory")
    case: dict[str, Any] = {
        "model": p.name,
        "cluster": label,
        "cluster_source": cluster.source,
        "order": order,
        "devices_in_file_order": list(cluster.names),
        "speeds_in_file_order": list(cluster.speeds),
        "memory_caps": [None if math.isinf(c) else c for c in cluster.mem_caps],
        "onnxpipe": {**ours.to_obj(), "lower_bound_ms": plan.lower_bound_seconds * 1e3, "notes": plan.notes},
        "baselines": {},
    }
    if order == "free":
        fixed = plan_pipeline(p.view, p.profile, PlanRequest(cluster.size, devices=cluster, order="fixed"))
        case["onnxpipe_fixed_order_ms"] = fixed.bottleneck_seconds * 1e3
        case["free_over_fixed"] = plan.bottleneck_seconds / fixed.bottleneck_seconds
    for name, bounds in baseline_bounds(p, cluster).items():
        s = score(p, bounds, cluster)  # baselines run in file order
        case["baselines"][name] = {**s.to_obj(), "ratio": s.bottleneck / ours.bottleneck}
    return case


def memory_case(p: Problem) -> dict[str, Any] | None:
    """Cluster ``d``: four equal devices capped just above 1.3 x a quarter of the parameters."""
    total = math.fsum(p.params)
    if total <= 0 or total < 0.5 * math.fsum(p.weights):
        print(
            f"{p.name}: skipped the memory-capped cluster: {total:.0f} initializer bytes of "
            f"{math.fsum(p.weights):.0f} weight bytes (the planner counts initializers only)",
            file=sys.stderr,
        )
        return None
    cap = math.ceil(MEM_HEADROOM * total / 4)
    raised_from = None
    try:
        plan_pipeline(p.view, p.profile, PlanRequest(4, devices=cluster_capped(cap)))
    except MemoryFitError as e:  # activations of the cuts push past the cap: use the smallest that fits
        raised_from, cap = cap, math.ceil(e.smallest_fit_bytes * 1.01)
    case = run_case(p, "d_mem_capped", cluster_capped(cap))
    free = plan_pipeline(p.view, p.profile, PlanRequest(4, devices=cluster_capped(None)))
    case["cap_bytes"] = cap
    case["cap_rule"] = f"ceil({MEM_HEADROOM} x total initializer bytes / 4)"
    case["cap_raised_from"] = raised_from
    case["total_param_bytes"] = total
    case["uncapped_onnxpipe_ms"] = free.bottleneck_seconds * 1e3
    case["uncapped_split_fits"] = score(p, bounds_of(free), cluster_capped(cap)).fits
    case["memory_binds"] = not case["uncapped_split_fits"]
    return case


def bench_model(p: Problem) -> list[dict[str, Any]]:
    cases = [
        run_case(p, "a_1248_fast", cluster_1248_fast()),
        run_case(p, "b_1248_edge", cluster_edge()),
        run_case(p, "c_1_3", cluster_1_3()),
    ]
    c = cases[-1]["onnxpipe"]["reference_ms"]
    cases[-1]["fast_over_slow_reference_work"] = c[1] / c[0] if c[0] > 0 else math.inf
    mem = memory_case(p)
    if mem is not None:
        cases.append(mem)
    cases.append(run_case(p, "e_shuffled_free", cluster_shuffled(), order="free"))
    return cases


# --------------------------------------------------------------------------------------------------
# report


def _fit_mark(v: dict[str, Any]) -> str:
    if not v["fits"]:
        return " (no fit)"
    return "" if v["fits_exact"] else " (peak>cap)"


def _cell(b: dict[str, Any]) -> str:
    return f"{b['ratio']:.2f}x{_fit_mark(b)}"


def _geomean(xs: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else math.nan


def main(argv: list[str]) -> int:
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--refresh", action="store_true", help="re-profile instead of using cached profiles")
    args = parser.parse_args(argv)
    cases: list[dict[str, Any]] = []
    models: list[dict[str, Any]] = []
    for name in [m for m in args.models.split(",") if m]:
        try:
            p = problem_of(name, MODELS.get(name), args.refresh)
        except Exception as e:  # noqa: BLE001 - a missing optional model only shortens the table
            print(f"skipped {name}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        models.append(
            {
                "model": name,
                "compute_nodes": len(p.costs),
                "input_shapes": {k: list(v) for k, v in p.profile.input_shapes.items()},
                "threads": p.profile.threads,
                "profile_runs": p.profile.runs,
                "reference_total_ms": math.fsum(p.costs) * 1e3,
                "initializer_bytes": math.fsum(p.params),
                "weight_bytes_incl_constants": math.fsum(p.weights),
            }
        )
        cases.extend(bench_model(p))

    rows = []
    for c in cases:
        o = c["onnxpipe"]
        extra = ""
        if c["cluster"] == "c_1_3":
            extra = f"fast/slow work {c['fast_over_slow_reference_work']:.2f}"
        elif c["cluster"] == "d_mem_capped":
            extra = f"cap {c['cap_bytes'] / 1e6:.2f} MB, binds: {c['memory_binds']}"
        elif c["cluster"] == "e_shuffled_free":
            extra = f"free/fixed {c['free_over_fixed']:.2f}, order {'>'.join(o['devices'])}"
        rows.append(
            [
                c["model"],
                c["cluster"],
                f"{o['bottleneck_ms']:.4f}{_fit_mark(o)}",
                *(_cell(c["baselines"][b]) for b in BASELINES),
                extra,
            ]
        )
    print_table(
        "baseline bottleneck / onnxpipe bottleneck on the same devices (>1: onnxpipe faster). (no fit): "
        "over a device's memory in the planner's model; (peak>cap): fits that model but not the planner's "
        "final check (shared weights + peak working set)",
        ["model", "cluster", "onnxpipe ms", *BASELINES, "notes"],
        rows,
    )
    summary: dict[str, Any] = {}
    for b in BASELINES:
        ratios = [c["baselines"][b]["ratio"] for c in cases if c["baselines"][b]["fits"]]
        summary[b] = {
            "geomean_ratio_where_it_fits": _geomean(ratios),
            "min_ratio_where_it_fits": min(ratios, default=math.nan),
            "max_ratio_where_it_fits": max(ratios, default=math.nan),
            "infeasible_cases": sum(not c["baselines"][b]["fits"] for c in cases),
            "cases": len(cases),
        }
    print_table(
        "over all cases where the baseline fits memory",
        ["baseline", "geomean ratio", "min", "max", "no fit"],
        [
            [
                b,
                f"{s['geomean_ratio_where_it_fits']:.2f}x",
                f"{s['min_ratio_where_it_fits']:.2f}x",
                f"{s['max_ratio_where_it_fits']:.2f}x",
                f"{s['infeasible_cases']}/{s['cases']}",
            ]
            for b, s in summary.items()
        ],
    )
    work = {c["model"]: c["fast_over_slow_reference_work"] for c in cases if c["cluster"] == "c_1_3"}
    print(
        "\ncluster c (speeds 1 and 3): fast stage's reference work / slow stage's: "
        + ", ".join(f"{m} {r:.3f}" for m, r in work.items())
    )
    out = write_result(
        "planner",
        params_of(args, models=[m for m in args.models.split(",") if m]),
        cases,
        out=args.out,
        summary={
            "objective": (
                "streaming bottleneck: max over stages of max(sum(reference costs)/speed, "
                "cut_bytes/bandwidth + latency); memory ('fits'): the partitioner's model, first-read "
                "initializer bytes + 2 x received bytes; 'fits_exact': the planner's final check, every "
                "initializer the stage reads + its peak working set"
            ),
            "ratio": "baseline bottleneck / onnxpipe bottleneck (> 1: onnxpipe faster)",
            "baselines": {
                "homogeneous": "onnxpipe.planning.make_plan (partition.solve, equal speeds, told the link "
                "bandwidth), placed on the devices in file order",
                "params": "benchmarks.baselines.parameter_balanced on first-read weight bytes "
                "(initializers and constant-node weights)",
                "equal": "benchmarks.baselines.equal_count",
                "torchgpipe": "benchmarks.baselines.torchgpipe_block on the reference costs",
            },
            "clusters": {
                "a_1248_fast": "edge_1248.json devices (speeds 1, 2, 4, 8) with 10 GB/s, 10 us links",
                "b_1248_edge": "examples/devices/edge_1248.json (100 Mbit/s, 0.5 ms)",
                "c_1_3": "speeds 1 and 3, 10 GB/s, 10 us",
                "d_mem_capped": "4 speed-1 devices, 10 GB/s, memory ceil(1.3 x initializer bytes / 4) "
                "(raised to 1.01 x the smallest fitting cap if that does not fit); models whose weights "
                "are constant nodes are skipped",
                "e_shuffled_free": "a_1248_fast listed x4, x1, x8, x2, onnxpipe with order='free'; "
                "baselines in file order",
            },
            "models": models,
            "baselines_over_cases": summary,
            "cluster_c_fast_over_slow_reference_work": work,
        },
    )
    print(f"\nwrote {shown(out)}")
    return 0
