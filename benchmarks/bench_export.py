"""Exporting K stages of a big model: onnxpipe's one-pass export against ``onnx.utils.extract_model``.

A ~400 MB model (``tools/make_large_graph.make_big_weights``: a MatMul chain whose weights live in an
external data file) is split into K = 4 stages.  Then, each in a fresh subprocess that reports its own time
and peak resident memory (``ru_maxrss`` of the child, i.e. VmHWM):

* ``onnxpipe``: :func:`onnxpipe.load_model` + static costs + :func:`onnxpipe.make_plan` +
  :func:`onnxpipe.export_stages` (which also runs ``onnx.checker`` and opens every stage in onnxruntime),
  through the public API;
* ``extract_model``: ``onnx.utils.extract_model`` called K times with the very same stage boundaries (each
  stage's input and output tensor names, read from onnxpipe's manifest), with its defaults
  (``check_model=True``, ``infer_shapes=True``), as one would script it by hand;
* ``extract_model (no checks)``: the same with ``check_model=False``, its cheapest use (``infer_shapes``
  must stay on: without it the cut tensors have no types and it refuses the boundaries);
* ``imports only``: a process that imports onnx, onnxruntime and onnxpipe and does nothing (the floor of
  every peak above).

The table gives seconds, peak memory, peak above the import floor, bytes written, and every number as a
ratio to onnxpipe's.  The stage files of both are checked to hold the same nodes.

Writes ``benchmarks/results/export.json``, a row per method.

    python -m benchmarks export [--bytes 400000000] [--k 4] [--keep DIR] [--out DIR]
"""

from __future__ import annotations

import json
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import onnx

from benchmarks.common import benchmark_parser, params_of, print_table, run_child, shown, write_result
from tools.make_large_graph import make_big_weights

CHILD_PRELUDE = textwrap.dedent(
    """
    import json, resource, sys, time
    import onnx, onnx.utils, onnxruntime
    import onnxpipe

    def peak_bytes():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def vm_hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return None

    def report(**values):
        values.update(peak_bytes=peak_bytes(), vm_hwm_bytes=vm_hwm())
        print("RESULT " + json.dumps(values))
    """
)

IMPORTS_ONLY = "report(seconds=0.0)"

ONNXPIPE = """
model, out, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = time.perf_counter()
view = onnxpipe.load_model(model)
plan = onnxpipe.make_plan(view, onnxpipe.static_profile(view), k)
t1 = time.perf_counter()
onnxpipe.export_stages(view, plan, out)
t2 = time.perf_counter()
report(seconds=t2 - t0, plan_seconds=t1 - t0, export_seconds=t2 - t1)
"""

EXTRACT = """
model, out, check = sys.argv[1], sys.argv[2], sys.argv[3] == "check"
stages = json.loads(sys.argv[4])
import os
os.makedirs(out)
times = []
t0 = time.perf_counter()
for i, (inputs, outputs) in enumerate(stages):
    s = time.perf_counter()
    onnx.utils.extract_model(
        model, f"{out}/stage_{i}.onnx", inputs, outputs, check_model=check, infer_shapes=True
    )
    times.append(time.perf_counter() - s)
report(seconds=time.perf_counter() - t0, per_stage_seconds=times)
"""


def child(code: str, *args: str) -> dict[str, Any]:
    """What the child running ``code`` reported, and ``wall_seconds``: its whole life, start included."""
    t0 = time.perf_counter()
    proc = run_child(CHILD_PRELUDE + code, *args)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    line = next(x for x in reversed(proc.stdout.splitlines()) if x.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    result["wall_seconds"] = wall
    return result


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def stage_nodes(folder: Path, k: int) -> list[list[str]]:
    return [
        sorted(
            n.name for n in onnx.load(str(folder / f"stage_{i}.onnx"), load_external_data=False).graph.node
        )
        for i in range(k)
    ]


def main(argv: list[str]) -> int:
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--bytes", type=int, default=400_000_000, help="total weight bytes of the model")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temp folder)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench_export-") as tmp_name:
        tmp = args.keep or Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        model = tmp / "big_weights.onnx"
        t0 = time.perf_counter()
        make_big_weights(model, args.bytes)
        model_bytes = folder_bytes(tmp)
        print(f"generated {model.name}: {model_bytes / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s")

        runs: dict[str, dict[str, Any]] = {}
        runs["imports only"] = child(IMPORTS_ONLY)
        runs["onnxpipe"] = child(ONNXPIPE, str(model), str(tmp / "onnxpipe"), str(args.k))
        manifest = json.loads((tmp / "onnxpipe" / "manifest.json").read_text())
        boundaries = [
            [[t["name"] for t in st["inputs"]], [t["name"] for t in st["outputs"]]]
            for st in manifest["stages"]
        ]
        runs["extract_model"] = child(
            EXTRACT, str(model), str(tmp / "extract"), "check", json.dumps(boundaries)
        )
        runs["extract_model (no checks)"] = child(
            EXTRACT, str(model), str(tmp / "extract_nc"), "nocheck", json.dumps(boundaries)
        )
        written = {
            "onnxpipe": folder_bytes(tmp / "onnxpipe"),
            "extract_model": folder_bytes(tmp / "extract"),
            "extract_model (no checks)": folder_bytes(tmp / "extract_nc"),
        }
        same_nodes = stage_nodes(tmp / "onnxpipe", args.k) == stage_nodes(tmp / "extract", args.k)

    floor = runs["imports only"]["peak_bytes"]
    base = runs["onnxpipe"]
    rows = []
    for label, r in runs.items():
        if label == "imports only":
            rows.append([label, "-", f"{r['peak_bytes'] / 2**20:.0f}", "-", "-", "-", "-", "-"])
            continue
        above = r["peak_bytes"] - floor
        rows.append(
            [
                label,
                f"{r['seconds']:.2f}",
                f"{r['peak_bytes'] / 2**20:.0f}",
                f"{above / 2**20:.0f}",
                f"{written[label] / 1e6:.0f}",
                f"{r['seconds'] / base['seconds']:.2f}x",
                f"{r['peak_bytes'] / base['peak_bytes']:.2f}x",
                f"{above / max(1, base['peak_bytes'] - floor):.2f}x",
            ]
        )
    print_table(
        f"export K={args.k} stages of a {model_bytes / 1e6:.0f} MB model (each row a fresh process)",
        ["method", "seconds", "peak MiB", "above imports MiB", "written MB", "time ratio", "peak ratio",
         "above-imports ratio"],
        rows,
    )  # fmt: skip
    per_stage = ", ".join(f"{s:.2f}" for s in runs["extract_model"]["per_stage_seconds"])
    print(
        f"onnxpipe: plan {base['plan_seconds']:.2f} s + export {base['export_seconds']:.2f} s; "
        f"extract_model per stage: {per_stage} s; same nodes per stage: {same_nodes}"
    )
    result_rows = []
    for label, r in runs.items():
        row: dict[str, Any] = {"method": label, **r, "written_bytes": written.get(label)}
        if label != "imports only":
            row["seconds_x_onnxpipe"] = r["seconds"] / base["seconds"]
            row["peak_x_onnxpipe"] = r["peak_bytes"] / base["peak_bytes"]
            row["peak_above_imports_x_onnxpipe"] = (r["peak_bytes"] - floor) / max(
                1, base["peak_bytes"] - floor
            )
        result_rows.append(row)
    summary = {
        "model_bytes": model_bytes,
        "baseline": "onnx.utils.extract_model called K times with onnxpipe's stage boundaries",
        "same_nodes_per_stage": same_nodes,
    }
    out = write_result("export", params_of(args), result_rows, summary=summary, out=args.out)
    print(f"\nwrote {shown(out)}")
    return 0
