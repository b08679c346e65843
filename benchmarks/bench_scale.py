"""Time and memory of load, partition and export on very large graphs: 1k, 10k, 100k nodes.

The graphs come from ``tools/make_large_graph.make_many_nodes(n)``: repeated blocks that are deep (chains),
wide (1-3 parallel branches joined by Add) and residual (a skip over every block), on ``[batch, 8]``
tensors, so the cost is the graph, not the weights.  Each size runs in a fresh subprocess, which times
each phase and reads its own peak resident memory per phase (``VmHWM``, reset between phases through
``/proc/self/clear_refs``):

* ``load``: :func:`onnxpipe.ir.load.load_model` (parse, checker, shape inference, ordering);
* ``costs``: :func:`onnxpipe.cost.static.static_profile` (static costs: no onnxruntime run);
* ``partition``: :func:`onnxpipe.planning.workers.make_plan` (the exact partitioner) into K stages;
* ``export``: :func:`onnxpipe.export.stages.export_stages` (build, write, ``onnx.checker`` and an
  onnxruntime load of every stage, manifest);
* ``verify``: :func:`onnxpipe.verify` (the model and the chained stages in
  onnxruntime at deployment settings, one random input), reported apart: it is not part of splitting.

The table gives seconds per phase, their sum without ``verify``, microseconds per node (flat when the
growth is linear), and the peak memory of the process.

Then, in this process (graphs only, no onnxruntime), the topological order that loading starts from,
three ways on the same dependencies (``deps``/``outs`` built as :func:`onnxpipe.ir.load.load_model`
builds them), each the median of :data:`ORDER_REPEATS` runs:

* ``order_ours_seconds``: :func:`onnxpipe.ir.graph.dfs_order`, which also refuses a cycle;
* ``order_networkx_seconds``: a ``networkx.DiGraph`` of the same edges built, then
  ``networkx.lexicographical_topological_sort`` (ties to the file order, as ours);
* ``dag_check_networkx_seconds``: the same graph built, then ``networkx.is_directed_acyclic_graph``
  alone (only the check, no order).

This is why onnxpipe's orders are its own and networkx is used only to name a cycle once a graph has
failed: its figures are in ``benchmarks/results/scale.json`` (``order_networkx_over_ours``).

    python -m benchmarks scale [--nodes 1000 10000 100000] [--k 4] [--no-verify] [--out DIR]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import networkx as nx
import onnx

from benchmarks.common import (
    MEMORY_PRELUDE,
    benchmark_parser,
    params_of,
    print_table,
    run_child,
    shown,
    write_result,
)
from onnxpipe.ir.graph import dfs_order
from onnxpipe.ir.load import subgraph_outer_reads
from tools.make_large_graph import make_many_nodes

ORDER_REPEATS = 3

CHILD = MEMORY_PRELUDE + textwrap.dedent(
    """
    from pathlib import Path

    import onnx
    from onnxpipe.cost.static import static_profile
    from onnxpipe.export.stages import export_stages
    from onnxpipe.ir.load import load_model
    from onnxpipe.planning.workers import make_plan
    from onnxpipe.api import verify

    model, out, k, run_verify = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
    result = {"floor_bytes": status("VmRSS")}

    def phase(name, fn):
        reset_peak()
        t = time.perf_counter()
        value = fn()
        result[name + "_seconds"] = time.perf_counter() - t
        result[name + "_peak_bytes"] = status("VmHWM")
        return value

    view = phase("load", lambda: load_model(model))
    result["nodes"] = len(view.nodes)
    profile = phase("costs", lambda: static_profile(view))
    plan = phase("partition", lambda: make_plan(view, profile, k))
    phase("export", lambda: export_stages(view, plan, out))
    if run_verify:
        report = phase("verify", lambda: verify(out))
        result["verify_ok"] = report.ok
    print("RESULT " + json.dumps(result))
    """
)


def dependencies(model: onnx.ModelProto) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]], set[str]]:
    """``(deps, outs, available)`` of ``model``'s nodes in file order, as loading passes them to the
    orders: the tensors each node reads (its subgraphs' outer reads included) and writes, and what is
    there before any node runs (initializers and graph inputs)."""
    graph = model.graph
    deps, outs = [], []
    for node in graph.node:
        ins = tuple(i for i in node.input if i)
        outer = tuple(t for t in sorted(subgraph_outer_reads(node)) if t not in ins)
        deps.append(ins + outer)
        outs.append(tuple(o for o in node.output if o))
    available = {t.name for t in graph.initializer} | {i.name for i in graph.input}
    return deps, outs, available


def networkx_graph(
    deps: Sequence[Sequence[str]], outs: Sequence[Sequence[str]], available: set[str]
) -> nx.DiGraph:
    """The same dependencies as a ``networkx.DiGraph``: node ``i`` -> every node reading what ``i`` writes."""
    producer = {t: i for i, o in enumerate(outs) for t in o}
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(deps)))
    graph.add_edges_from(
        (producer[t], i) for i, d in enumerate(deps) for t in d if t in producer and t not in available
    )
    return graph


def median_seconds(fn: Callable[[], object], repeats: int = ORDER_REPEATS) -> tuple[float, object]:
    """The median wall time of ``repeats`` calls of ``fn``, and its last value."""
    times, value = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), value


def order_timings(model: onnx.ModelProto) -> dict[str, Any]:
    """onnxpipe's topological order against networkx's on ``model``'s dependencies (the docstring)."""
    deps, outs, available = dependencies(model)
    ours, order = median_seconds(lambda: dfs_order(deps, outs, available))
    theirs, nx_order = median_seconds(
        lambda: list(nx.lexicographical_topological_sort(networkx_graph(deps, outs, available)))
    )
    check, is_dag = median_seconds(
        lambda: nx.is_directed_acyclic_graph(networkx_graph(deps, outs, available))
    )
    build, _ = median_seconds(lambda: networkx_graph(deps, outs, available))
    assert isinstance(order, list) and isinstance(nx_order, list) and sorted(order) == sorted(nx_order)
    assert is_dag is True
    return {
        "order_ours_seconds": ours,
        "order_networkx_seconds": theirs,
        "dag_check_networkx_seconds": check,
        "networkx_build_seconds": build,
        "order_networkx_over_ours": theirs / ours if ours > 0 else None,
        "dag_check_networkx_over_ours": check / ours if ours > 0 else None,
    }


def run_size(n: int, k: int, run_verify: bool, folder: Path) -> dict[str, Any]:
    path = folder / f"many_{n}.onnx"
    onnx_model = make_many_nodes(n)
    onnx.save_model(onnx_model, str(path))
    proc = run_child(CHILD, str(path), str(folder / f"out_{n}"), str(k), "1" if run_verify else "0")
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{n} nodes: the child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    result["file_bytes"] = path.stat().st_size
    result["split_seconds"] = sum(result[f"{p}_seconds"] for p in ("load", "costs", "partition", "export"))
    result["peak_bytes"] = max(v for key, v in result.items() if key.endswith("_peak_bytes"))
    result["split_peak_bytes"] = max(
        result[f"{p}_peak_bytes"] for p in ("load", "costs", "partition", "export")
    )
    result.update(order_timings(onnx_model))
    return result


def main(argv: list[str]) -> int:
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--no-verify", action="store_true")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="onnxpipe-scale-") as tmp:
        for n in args.nodes:
            r = run_size(n, args.k, not args.no_verify, Path(tmp))
            r["requested_nodes"] = n
            rows.append(r)
            print(f"{r['nodes']} nodes: split in {r['split_seconds']:.1f} s", file=sys.stderr, flush=True)

    mb = 1 / 1e6
    table_rows = []
    for r in rows:
        table_rows.append(
            [
                f"{r['nodes']:,}",
                f"{r['file_bytes'] * mb:.1f}",
                f"{r['load_seconds']:.2f}",
                f"{r['costs_seconds']:.2f}",
                f"{r['partition_seconds']:.2f}",
                f"{r['export_seconds']:.2f}",
                f"{r['split_seconds']:.2f}",
                f"{r['split_seconds'] / r['nodes'] * 1e6:.0f}",
                f"{r['verify_seconds']:.2f}" if "verify_seconds" in r else "-",
                f"{r['split_peak_bytes'] * mb:.0f}",
                f"{r['export_peak_bytes'] * mb:.0f}",
                f"{r['peak_bytes'] * mb:.0f}",
            ]
        )
    print_table(
        f"load + partition + export into K={args.k} stages (seconds; memory: peak resident MB)",
        [
            "nodes",
            "file MB",
            "load",
            "costs",
            "partition",
            "export",
            "split total",
            "us/node",
            "verify",
            "peak MB split",
            "peak MB export",
            "peak MB all",
        ],
        table_rows,
    )
    print_table(
        f"topological order of the same dependencies (seconds, median of {ORDER_REPEATS}; networkx: "
        "DiGraph built + lexicographical_topological_sort, or + is_directed_acyclic_graph)",
        ["nodes", "onnxpipe dfs_order", "networkx order", "x ours", "networkx DAG check", "x ours"],
        [
            [
                f"{r['nodes']:,}",
                f"{r['order_ours_seconds']:.4f}",
                f"{r['order_networkx_seconds']:.4f}",
                f"{r['order_networkx_over_ours']:.1f}x",
                f"{r['dag_check_networkx_seconds']:.4f}",
                f"{r['dag_check_networkx_over_ours']:.1f}x",
            ]
            for r in rows
        ],
    )
    path = write_result("scale", params_of(args, order_repeats=ORDER_REPEATS), rows, out=args.out)
    print(f"\nwrote {shown(path)}")
    return 0
