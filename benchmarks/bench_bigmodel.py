"""Peak memory of splitting a model over 2 GB: the graph, not the model (nor even the largest stage).

``tools/make_large_graph.make_big_weights`` writes a MatMul chain (16 layers, two weights each) whose
weights, ``--gb`` gigabytes in all, live in an external data file (written layer by layer).  For every K,
a fresh subprocess loads the model, partitions it (static costs) and exports it with
``--external-data auto`` (every stage gets its own ``.data`` file holding only its weights; with K=1 the
one stage is itself over 2 GB).  It reports per phase (peak reset in between through
``/proc/self/clear_refs``) the seconds and the peak resident memory, and then verifies the split in
another subprocess (the original model, then the stages one at a time).

Stage weights are copied from the source's weights file into each stage's own file in 16 MiB chunks
(:mod:`onnxpipe.export.weightfile`), so the export's memory does not grow with the model; its time is mostly
the disk's (the page cache is flushed before each run).  Columns: ``model`` and ``largest stage`` are
weight bytes; ``export peak`` is the process's peak resident memory while exporting; ``above floor``
subtracts what the process held before exporting (interpreter, libraries, the loaded graph); the two
ratios divide that by the model and by the largest stage.  ``verify peak`` is the verification's (the
original model, then one stage at a time, in onnxruntime); it is not representative of real weights:
onnxruntime holds these constant-filled generated weights in far less than their size, while a model
with random weights costs it about its size.  Results go to ``benchmarks/results/bigmodel.json``.

    python -m benchmarks bigmodel [--gb 0.5 2.5] [--k 1 2 4 8] [--no-verify] [--keep DIR] [--out DIR]

Needs about 3x the model size of free disk (the model, one split at a time).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    MEMORY_PRELUDE,
    benchmark_parser,
    params_of,
    print_table,
    run_child,
    shown,
    write_result,
)
from tools.make_large_graph import make_big_weights

CHILD_PRELUDE = MEMORY_PRELUDE + textwrap.dedent(
    """
    result = {}

    def phase(name, fn):
        reset_peak()
        result[name + "_floor_bytes"] = status("VmRSS")
        t = time.perf_counter()
        value = fn()
        result[name + "_seconds"] = time.perf_counter() - t
        result[name + "_peak_bytes"] = status("VmHWM")
        return value
    """
)

SPLIT = """
from onnxpipe.cost.static import static_profile
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.load import load_model
from onnxpipe.planning.workers import make_plan

model, out, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
view = phase("load", lambda: load_model(model))
plan = phase("partition", lambda: make_plan(view, static_profile(view), k))
manifest = phase("export", lambda: export_stages(view, plan, out))
result["stage_weight_bytes"] = [s.param_bytes for s in manifest.stages]
result["external_data"] = [s.external_data for s in manifest.stages]
print("RESULT " + json.dumps(result))
"""

VERIFY = """
from onnxpipe.api import verify

report = phase("verify", lambda: verify(sys.argv[1]))
result["verify_ok"] = report.ok
print("RESULT " + json.dumps(result))
"""


def child(code: str, *args: str) -> dict[str, Any]:
    os.sync()  # the previous run's dirty pages must not throttle this one's writes
    proc = run_child(CHILD_PRELUDE + code, *args)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def main(argv: list[str]) -> int:
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--gb", type=float, nargs="+", default=[0.5, 2.5], help="weight gigabytes")
    parser.add_argument("--k", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument("--keep", type=Path, help="folder for the models and splits (default: temporary)")
    args = parser.parse_args(argv)

    folder = args.keep or Path(tempfile.mkdtemp(prefix="onnxpipe-bigmodel-"))
    folder.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    try:
        for gb in args.gb:
            model = folder / f"big_{gb:g}gb.onnx"
            t = time.perf_counter()
            make_big_weights(model, int(gb * 1e9))
            made = time.perf_counter() - t
            weights = (folder / (model.name + ".data")).stat().st_size
            print(f"{gb:g} GB model written in {made:.0f} s", file=sys.stderr, flush=True)
            for k in args.k:
                out = folder / f"split_{gb:g}gb_k{k}"
                r = child(SPLIT, str(model), str(out), str(k))
                if not args.no_verify:
                    r.update(child(VERIFY, str(out)))
                r.update(gb=gb, k=k, model_weight_bytes=weights, model_file_bytes=model.stat().st_size)
                r["largest_stage_bytes"] = max(r["stage_weight_bytes"])
                r["export_above_floor_bytes"] = r["export_peak_bytes"] - r["export_floor_bytes"]
                rows.append(r)
                peak = r["export_peak_bytes"] / 1e9
                print(
                    f"  K={k}: export {r['export_seconds']:.1f} s, peak {peak:.2f} GB",
                    file=sys.stderr,
                    flush=True,
                )
                shutil.rmtree(out)
            model.unlink()
            (folder / (model.name + ".data")).unlink()
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)

    gb_ = 1e9
    print_table(
        "peak resident memory while exporting (GB); weights in external files; --external-data auto",
        [
            "model",
            "K",
            "largest stage",
            "load s",
            "export s",
            "export peak",
            "above floor",
            "/ model",
            "/ largest stage",
            "verify s",
            "verify peak",
            "ok",
        ],
        [
            [
                f"{r['model_weight_bytes'] / gb_:.2f}",
                r["k"],
                f"{r['largest_stage_bytes'] / gb_:.2f}",
                f"{r['load_seconds']:.1f}",
                f"{r['export_seconds']:.1f}",
                f"{r['export_peak_bytes'] / gb_:.2f}",
                f"{r['export_above_floor_bytes'] / gb_:.2f}",
                f"{r['export_above_floor_bytes'] / r['model_weight_bytes']:.2f}",
                f"{r['export_above_floor_bytes'] / r['largest_stage_bytes']:.2f}",
                f"{r['verify_seconds']:.1f}" if "verify_seconds" in r else "-",
                f"{r['verify_peak_bytes'] / gb_:.2f}" if "verify_peak_bytes" in r else "-",
                str(r.get("verify_ok", "-")),
            ]
            for r in rows
        ],
    )
    path = write_result("bigmodel", params_of(args), rows, out=args.out)
    print(f"\nwrote {shown(path)}")
    return 0
