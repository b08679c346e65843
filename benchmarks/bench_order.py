"""Bytes live across cut points: onnxpipe's chosen topological order against the file's own order.

For every model the benchmark lists the mean and the largest number of bytes live across a cut point
(what a stage boundary placed there would have to send; weights and cheap constants excluded, since
stages get their own copies), for the file's node order (the baseline) and
for the order :func:`onnxpipe.ir.load.load_model` chooses, and prints the ratios chosen / file.
Results go to ``benchmarks/results/order.json``.

    python -m benchmarks order [MODEL.onnx ...] [--out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.common import ROOT, benchmark_parser, params_of, shown, write_result
from onnxpipe.ir.graph import dfs_order, live_bytes_profile, stable_order
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from tools import corpus


def default_models() -> list[Path]:
    models = sorted((ROOT / "sample_models").glob("*.onnx"))
    models += [corpus.onnx_light(n) for n in corpus.onnx_light_names()]
    for getter in (lambda: corpus.rapidocr("det"), corpus.nudenet):
        try:
            models.append(getter())
        except Exception as e:  # noqa: BLE001 - a missing optional model only shortens the table
            print(f"skipped a corpus model: {e}", file=sys.stderr)
    return models


def measure(view: ModelView) -> dict[str, float]:
    nodes = sorted(view.nodes, key=lambda n: n.index)
    deps = [n.reads for n in nodes]
    outs = [n.outputs for n in nodes]
    size = {name: t.nbytes() for name, t in view.tensors.items()}
    free = set(view.initializers) | {o for n in view.nodes if n.is_constant for o in n.outputs}
    avail = free | set(view.inputs)
    stable = stable_order(deps, outs, avail)  # the file's own order where it is topological
    file_order = stable if stable == list(range(len(deps))) else dfs_order(deps, outs, avail)
    chosen = [n.index for n in view.nodes]
    index_to_pos = {n.index: i for i, n in enumerate(nodes)}
    chosen = [index_to_pos[i] for i in chosen]
    result: dict[str, float] = {}
    for label, order in (("file", file_order), ("chosen", chosen)):
        live = live_bytes_profile(order, deps, outs, size, free, view.outputs) or [0]
        result[f"{label}_mean"] = sum(live) / len(live)
        result[f"{label}_max"] = float(max(live))
    return result


def main(argv: list[str]) -> int:
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("models", nargs="*", type=Path, help="default: the sample and corpus models")
    args = parser.parse_args(argv)
    paths = args.models or default_models()
    rows = []
    print(f"{'model':32} {'nodes':>6} {'file mean':>12} {'chosen mean':>12} {'ratio':>6} {'max ratio':>9}")
    for path in paths:
        view = load_model(path)
        r = measure(view)
        ratio = r["chosen_mean"] / r["file_mean"] if r["file_mean"] else 1.0
        max_ratio = r["chosen_max"] / r["file_max"] if r["file_max"] else 1.0
        rows.append(
            {"model": path.name, "nodes": len(view.nodes), **r, "mean_ratio": ratio, "max_ratio": max_ratio}
        )
        print(
            f"{path.name[:32]:32} {len(view.nodes):6d} {r['file_mean']:12.0f} {r['chosen_mean']:12.0f} "
            f"{ratio:6.3f} {max_ratio:9.3f}"
        )
    params = params_of(args, models=[shown(p) for p in paths])
    out = write_result("order", params, rows, summary={"baseline": "file order"}, out=args.out)
    print(f"wrote {shown(out)}")
    return 0
