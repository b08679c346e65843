"""Time and memory of load, partition and export on very large graphs: 1k, 10k, 100k nodes.

The graphs come from ``tools/make_large_graph.make_many_nodes(n)``: repeated blocks that are deep (chains),
wide (1-3 parallel branches joined by Add) and residual (a skip over every block), on ``[batch, 8]``
tensors, so the cost is the graph, not the weights.  Each size runs in a fresh subprocess, which times
each phase and reads its own peak resident memory per phase (``VmHWM``, reset between phases through
``/proc/self/clear_refs``):

* ``load``: :func:`onnxpipe.load_model` (parse, checker, shape inference, ordering);
* ``costs``: :func:`onnxpipe.costs.static_profile` (static costs: no onnxruntime run);
* ``partition``: :func:`onnxpipe.plan.make_plan` (the exact partitioner) into K stages;
* ``export``: :func:`onnxpipe.export.export_stages` (build, write, ``onnx.checker`` and an onnxruntime
  load of every stage, manifest);
* ``verify``: :func:`onnxpipe.verification.verify` (the model and the chained stages in onnxruntime at
  deployment settings, one random input), reported apart: it is not part of splitting.

The table gives seconds per phase, their sum without ``verify``, microseconds per node (flat when the
growth is linear), and the peak memory of the process.  Results go to ``benchmarks/results/scale.json``.

    python benchmarks/bench_scale.py [--nodes 1000 10000 100000] [--k 4] [--no-verify]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import MEMORY_PRELUDE, ROOT, print_table, write_results

CHILD = MEMORY_PRELUDE + textwrap.dedent(
    """
    from pathlib import Path

    import onnx
    from onnxpipe.cost.static import static_profile
    from onnxpipe.export.stages import export_stages
    from onnxpipe.ir.load import load_model
    from onnxpipe.plan.planner import make_plan
    from onnxpipe.verification.verify import verify

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


def run_size(n: int, k: int, run_verify: bool, folder: Path) -> dict[str, Any]:
    from tools.make_large_graph import make_many_nodes

    path = folder / f"many_{n}.onnx"
    onnx_model = make_many_nodes(n)
    import onnx

    onnx.save_model(onnx_model, str(path))
    del onnx_model
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(path),
            str(folder / f"out_{n}"),
            str(k),
            "1" if run_verify else "0",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
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
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    path = write_results("scale", {"k": args.k, "rows": rows})
    print(f"\nwrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
