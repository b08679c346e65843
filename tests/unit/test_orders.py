"""Tests of onnxpipe.planning.orders: device-order search and ``--stages auto``, checked by brute force."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from paths import REPO_ROOT

from onnxpipe.cluster.devicesfile import load_cluster
from onnxpipe.cluster.model import Cluster, Device, Link
from onnxpipe.core.errors import PartitionError, UsageError
from onnxpipe.partition import Partition, solve_heterogeneous
from onnxpipe.partition.inputs import HeterogeneousRequest
from onnxpipe.planning.orders import (
    best_device_order,
    count_orders,
    distinct_orders,
    fixed_order,
    place,
    stages_auto,
    type_ids,
)
from onnxpipe.planning.request import PlanRequest

ROOT = REPO_ROOT


# --------------------------------------------------------------------------------------------------
# an independent brute force of the heterogeneous objective


@dataclass(frozen=True)
class Problem:
    costs: tuple[float, ...]
    cut_bytes: tuple[float, ...]  # n + 1
    item_mem: tuple[float, ...]
    cut_mem_factor: float


def _stage_cost(p: Problem, c: Cluster, s: int, a: int, b: int) -> float:
    compute = sum(p.costs[a:b]) / c.devices[s].speed
    if s == 0:
        return compute
    link = c.links[s - 1]
    transfer = p.cut_bytes[a] / link.bandwidth_bytes_per_s + link.latency_s
    return max(compute, transfer)  # transfers overlap compute


def _fits(p: Problem, c: Cluster, s: int, a: int, b: int) -> bool:
    mem = sum(p.item_mem[a:b]) + (p.cut_mem_factor * p.cut_bytes[a] if s > 0 else 0.0)
    return mem <= c.devices[s].memory_cap


def brute_partition(p: Problem, c: Cluster) -> float:
    """Smallest bottleneck over every split of the items over c's devices in order (inf: none fits)."""
    n, k = len(p.costs), c.size
    best = math.inf
    for inner in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *inner, n)
        if all(_fits(p, c, s, bounds[s], bounds[s + 1]) for s in range(k)):
            best = min(best, max(_stage_cost(p, c, s, bounds[s], bounds[s + 1]) for s in range(k)))
    return best


def solver(p: Problem) -> Callable[[Cluster], Partition]:
    def solve(c: Cluster) -> Partition:
        return solve_heterogeneous(
            HeterogeneousRequest(
                p.costs,
                speeds=c.speeds,
                cut_bytes=p.cut_bytes,
                bandwidths=c.bandwidths,
                latencies=c.latencies,
                item_mem=p.item_mem,
                mem_caps=c.mem_caps,
                cut_mem_factor=[p.cut_mem_factor] * c.size,
            ),
            c.size,
        )

    return solve


def _random_problem(rng: random.Random, n: int) -> Problem:
    costs = tuple(rng.choice([0.0, rng.uniform(0.1, 5)]) for _ in range(n))
    cut = (0.0, *(float(rng.randint(0, 40)) for _ in range(n - 1)), 0.0)
    mem = tuple(float(rng.randint(0, 10)) for _ in range(n))
    return Problem(costs, cut, mem, rng.choice([0.0, 0.5, 1.0]))


def _random_cluster(rng: random.Random, size: int, types: int, uniform: bool = True) -> Cluster:
    kinds = [
        (rng.choice([0.5, 1.0, 2.0, 3.0, 4.0]), rng.choice([None, 15, 25, 40, 80])) for _ in range(types)
    ]
    devices = []
    for i in range(size):
        speed, mem = kinds[rng.randrange(types)]
        devices.append(Device(f"d{i}", speed=speed, memory_bytes=mem))
    if uniform:
        links = (Link(rng.choice([5.0, 10.0, math.inf]), rng.choice([0.0, 0.5])),) * (size - 1)
    else:
        links = tuple(Link(rng.choice([5.0, 10.0]), 0.0) for _ in range(size - 1))
    return Cluster(tuple(devices), links)


# --------------------------------------------------------------------------------------------------
# the heterogeneous partition itself, by brute force (memory caps and links)


def test_heterogeneous_partition_matches_brute_force() -> None:
    rng = random.Random(1)
    checked = infeasible = 0
    for _ in range(150):
        n = rng.randint(2, 8)
        p = _random_problem(rng, n)
        c = _random_cluster(rng, rng.randint(1, min(4, n)), types=3, uniform=rng.random() < 0.5)
        want = brute_partition(p, c)
        if math.isinf(want):
            with pytest.raises(PartitionError, match="smallest uniform cap"):
                solver(p)(c)
            infeasible += 1
            continue
        got = solver(p)(c)
        assert got.bottleneck == pytest.approx(want, rel=1e-9, abs=1e-12)
        bounds = got.bounds
        assert all(_fits(p, c, s, bounds[s], bounds[s + 1]) for s in range(c.size))
        checked += 1
    assert checked > 50 and infeasible > 5


# --------------------------------------------------------------------------------------------------
# distinct orders


def test_distinct_orders_are_the_distinct_type_sequences() -> None:
    rng = random.Random(2)
    for _ in range(40):
        c = _random_cluster(rng, rng.randint(1, 6), types=rng.randint(1, 3))
        ids = type_ids(c)
        for k in range(1, c.size + 1):
            want = {tuple(ids[i] for i in perm) for perm in itertools.permutations(range(c.size), k)}
            got = list(distinct_orders(c, k))
            assert len(got) == len(want) == count_orders(c, k)
            assert {tuple(ids[i] for i in order) for order in got} == want
            assert all(len(set(order)) == k for order in got)
            assert got[0] == tuple(range(k))  # file order first


def test_few_types_make_few_orders() -> None:
    two_types = Cluster(tuple(Device(f"d{i}", speed=1 + i % 2) for i in range(8)), (Link(),) * 7)
    assert count_orders(two_types, 8) == 70  # 8! / (4! 4!)
    edge = load_cluster(ROOT / "examples" / "devices" / "edge_1248.json")
    assert count_orders(edge, 4) == 24
    assert count_orders(edge, 2) == 12


# --------------------------------------------------------------------------------------------------
# the free-order search finds the best order


def brute_best_order(p: Problem, c: Cluster, k: int) -> float:
    best = math.inf
    for perm in itertools.permutations(range(c.size), k):
        best = min(best, brute_partition(p, c.arranged(perm)))
    return best


def test_free_order_finds_the_best_order_by_brute_force() -> None:
    rng = random.Random(4)
    improved = 0
    for _ in range(60):
        n = rng.randint(3, 7)
        p = _random_problem(rng, n)
        c = _random_cluster(rng, rng.randint(2, min(4, n)), types=rng.randint(2, 3))
        k = rng.randint(1, c.size)
        want = brute_best_order(p, c, k)
        if math.isinf(want):
            with pytest.raises(PartitionError, match="no order of"):
                best_device_order(c, k, solver(p))
            continue
        got = best_device_order(c, k, solver(p))
        assert got.bottleneck == pytest.approx(want, rel=1e-9, abs=1e-12)
        assert got.cluster.names == tuple(c.devices[i].name for i in got.order)
        assert got.evaluated == count_orders(c, k) and got.free
        # the arranged cluster really gives that bottleneck
        assert brute_partition(p, got.cluster) == pytest.approx(got.bottleneck, rel=1e-9, abs=1e-12)
        fixed = brute_partition(p, c.prefix(k))
        improved += got.bottleneck < fixed - 1e-9
    assert improved > 5  # the search matters: file order is often not the best


def test_edge_boards_put_the_work_on_the_fast_boards() -> None:
    """Eight equal layers over boards 1:2:4:8 written slowest first: free order may reorder them."""
    edge = load_cluster(ROOT / "examples" / "devices" / "edge_1248.json")
    p = Problem((1.0,) * 15, (0.0,) * 16, (0.0,) * 15, 0.0)
    fixed = fixed_order(edge, 2, solver(p))
    free = best_device_order(edge, 2, solver(p))
    assert fixed.cluster.names == ("board-x1", "board-x2")
    assert set(free.cluster.names) == {"board-x4", "board-x8"}
    assert free.bottleneck < fixed.bottleneck
    assert place(edge, 2, solver(p), order="free").order == free.order
    assert place(edge, 2, solver(p)).order == (0, 1)


def test_ties_keep_the_file_order() -> None:
    c = Cluster((Device("a"), Device("b", speed=2), Device("c")), (Link(),) * 2)
    p = Problem((0.0, 0.0, 0.0), (0.0,) * 4, (0.0,) * 3, 0.0)  # every order costs 0
    assert best_device_order(c, 3, solver(p)).order == (0, 1, 2)


def test_free_order_refusals() -> None:
    mixed = Cluster((Device("a"), Device("b", speed=2)), (Link(1e6, 0),))
    other = Cluster((Device("a"), Device("b", speed=2), Device("c")), (Link(1e6, 0), Link(1e3, 0)))
    p = Problem((1.0, 1.0, 1.0), (0.0,) * 4, (0.0,) * 3, 0.0)
    assert best_device_order(mixed, 2, solver(p)).evaluated == 2
    with pytest.raises(UsageError, match="same link between every pair"):
        best_device_order(other, 2, solver(p))
    many = Cluster(tuple(Device(f"d{i}", speed=i + 1) for i in range(6)), (Link(),) * 5)
    with pytest.raises(UsageError, match="720 distinct device orders"):
        best_device_order(many, 6, solver(p), max_orders=100)
    with pytest.raises(UsageError, match="between 1 and 2"):
        best_device_order(mixed, 3, solver(p))
    with pytest.raises(UsageError, match="`order=random`: choose one of fixed, free"):
        PlanRequest(2, order="random")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# --stages auto


@dataclass(frozen=True)
class _R:
    bottleneck: float


def _table(values: Sequence[float | None]) -> Callable[[int], _R]:
    def solve_k(k: int) -> _R:
        v = values[k - 1]
        if v is None:
            raise PartitionError(f"{k} stages do not fit; the smallest uniform cap that fits is 99 bytes")
        return _R(v)

    return solve_k


def test_stages_auto_fewest_within_tolerance() -> None:
    ch = stages_auto(4, _table([10.0, 5.2, 5.0, 6.0]))
    assert ch.k == 2 and min(b for _, b in ch.bottlenecks) == 5.0
    assert ch.bottlenecks == ((1, 10.0), (2, 5.2), (3, 5.0), (4, 6.0))
    assert "within 5%" in ch.reason
    assert stages_auto(4, _table([10.0, 5.3, 5.0, 6.0])).k == 3
    assert stages_auto(4, _table([10.0, 5.3, 5.0, 6.0]), tolerance=0.1).k == 2
    assert stages_auto(4, _table([5.0, 5.0, 5.0, 5.0])).k == 1


def test_stages_auto_skips_what_does_not_fit() -> None:
    ch = stages_auto(4, _table([None, None, 5.0, 4.0]))
    assert ch.k == 4 and ch.bottlenecks[0] == (1, math.inf)
    with pytest.raises(PartitionError, match=r"no stage count from 1 to 3 fits.*99 bytes"):
        stages_auto(3, _table([None, None, None]))
    with pytest.raises(UsageError):
        stages_auto(0, _table([]))
    with pytest.raises(UsageError):
        stages_auto(2, _table([1.0, 1.0]), tolerance=-0.1)


def test_stages_auto_with_free_order_on_edge_boards() -> None:
    """On the 100 Mbit/s network a cut of 100 kB costs 8.5 ms and one of 400 kB 32.5 ms per micro-batch."""
    edge = load_cluster(ROOT / "examples" / "devices" / "edge_1248.json")
    cheap = Problem((0.01,) * 16, (0.0, *(1e5,) * 15, 0.0), (0.0,) * 16, 0.0)
    ch = stages_auto(edge.size, lambda k: place(edge, k, solver(cheap), order="free"))
    assert dict(ch.bottlenecks) == pytest.approx({1: 0.02, 2: 0.01375, 3: 0.0125, 4: 0.01125})
    assert ch.k == 4
    dear = Problem((0.01,) * 16, (0.0, *(4e5,) * 15, 0.0), (0.0,) * 16, 0.0)
    ch = stages_auto(edge.size, lambda k: place(edge, k, solver(dear), order="free"))
    assert ch.k == 1 and ch.result.cluster.names == ("board-x8",)  # every cut costs more than it saves
    assert ch.bottlenecks[0][0] == 1 and ch.bottlenecks[0][1] == pytest.approx(0.16 / 8)


# --------------------------------------------------------------------------------------------------
# a real model on devices of speed 1 and 3


def test_real_model_speed_1_and_3(tmp_path: Path) -> None:
    from onnxpipe.cost.static import static_profile
    from onnxpipe.ir.load import load_model

    devices = {
        "devices": [
            {
                "name": "slow",
                "provider": "CPUExecutionProvider",
                "threads": 1,
                "memory_bytes": None,
                "speed": 1,
            },
            {
                "name": "fast",
                "provider": "CPUExecutionProvider",
                "threads": 1,
                "memory_bytes": None,
                "speed": 3,
            },
        ],
        "links": [{"bandwidth_bytes_per_s": None, "latency_s": 0}],
    }
    path = tmp_path / "devices.json"
    path.write_text(json.dumps(devices), encoding="utf-8")
    cluster = load_cluster(path)
    view = load_model(ROOT / "sample_models" / "transformer_tiny.onnx")
    profile = static_profile(view)
    costs = [profile.node_seconds.get(n.name, 0.0) for n in view.compute_nodes]
    part = solve_heterogeneous(HeterogeneousRequest(costs, speeds=cluster.speeds), 2)
    reference_compute = [part.compute[s] * cluster.speeds[s] for s in range(2)]  # before speed-up
    ratio = reference_compute[1] / reference_compute[0]
    assert 2.5 < ratio < 3.5, ratio
