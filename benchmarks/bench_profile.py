"""How much of onnxruntime's measured time the profiler maps back to the model's original nodes.

:func:`onnxpipe.cost.measure.profile_model` runs the model at ``ORT_ENABLE_ALL`` and attributes every
kernel's time to the original nodes it came from.

Baseline: matching profiler events to original nodes by name, which is all that works without the
optimized graph (at ``ORT_ENABLE_ALL`` the NCHWc pass and fusions rename most nodes).  For every model the
table lists:

* ``by name``: share of the measured kernel time whose optimized node has an original node's name;
* ``attributed``: share of the total that ``profile_model`` put on original nodes (1.0 = nothing dropped);
* ``exact``: share attributed to exactly one original node (the rest is split inside fused groups);
* ``regions`` and the largest region (original nodes the partitioner must keep together);
* ``static rho``: Spearman rank correlation between :func:`onnxpipe.cost.static.static_profile` node times and
  the measured ones (how well the static cost model orders nodes);
* ``wall``: seconds ``profile_model`` took (timing runs included).

Results go to ``benchmarks/results/profile.json``.

    python -m benchmarks profile [--runs N] [MODEL.onnx ...] [--out DIR]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import benchmark_parser, params_of, shown, write_result
from onnxpipe.core.progress import Progress
from onnxpipe.cost.measure import profile_model
from onnxpipe.cost.profile import Profile
from onnxpipe.cost.static import static_profile
from onnxpipe.cost.trace import OrtModel
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapes import resolve_input_shapes
from tools import corpus, export_transformers


def default_models() -> list[Path]:
    models = [corpus.onnx_light(n) for n in ("resnet50", "inception_v2", "densenet121", "squeezenet")]

    def transformer(name: str, dynamo: bool) -> Path:
        path: Path = getattr(export_transformers, name)(dynamo=dynamo)
        return path

    getters = [
        corpus.nudenet,
        lambda: corpus.rapidocr("det"),
        lambda: corpus.rapidocr("rec"),
        lambda: transformer("gpt2_tiny", False),
        lambda: transformer("bert_tiny", True),
    ]
    for getter in getters:
        try:
            models.append(getter())
        except Exception as e:  # noqa: BLE001 - a missing optional model only shortens the table
            print(f"skipped a corpus model: {e}", file=sys.stderr)
    return models


def name_share(view: ModelView, runs: int) -> float:
    """Baseline: share of kernel time on optimized nodes that carry an original node's name."""
    feeds = random_feeds(view, resolve_input_shapes(view))
    with tempfile.TemporaryDirectory() as tmp:
        timing = OrtModel(view, Path(tmp), view.label, 1).measure(
            feeds, 1, runs, Progress(0, "", enabled=False)
        )
    names = {n.name for n in view.nodes}
    total = sum(timing.node_seconds.values())
    return sum(s for n, s in timing.node_seconds.items() if n in names) / total if total else 1.0


def spearman(a: list[float], b: list[float]) -> float:
    if len(a) < 2:
        return 1.0
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def measure(path: Path, runs: int) -> dict[str, object]:
    view = load_model(path)
    start = time.perf_counter()
    prof: Profile = profile_model(view, runs=runs, warmup=2)
    wall = time.perf_counter() - start
    static = static_profile(view)
    names = [n.name for n in view.compute_nodes]
    return {
        "model": path.name,
        "nodes": len(names),
        "total_ms": prof.total_seconds * 1e3,
        "by_name": name_share(view, runs),
        "attributed": sum(prof.node_seconds.values()) / prof.total_seconds if prof.total_seconds else 1.0,
        "exact": prof.exact_fraction,
        "regions": len(prof.regions),
        "largest_region": max((len(r) for r in prof.regions), default=1),
        "static_rho": spearman(
            [static.node_seconds[n] for n in names], [prof.node_seconds[n] for n in names]
        ),
        "wall_s": wall,
        "notes": list(prof.unattributed),
    }


def main(argv: list[str]) -> int:
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args(argv)
    paths = args.models or default_models()
    rows = []
    header = (
        f"{'model':34} {'nodes':>6} {'ms':>8} {'by name':>8} {'attrib':>7} {'exact':>6} "
        f"{'regions':>7} {'largest':>7} {'rho':>5} {'wall s':>7}"
    )
    print(header)
    for path in paths:
        r = measure(path, args.runs)
        rows.append(r)
        print(
            f"{str(r['model'])[:34]:34} {r['nodes']:6d} {r['total_ms']:8.3f} {r['by_name']:8.3f} "
            f"{r['attributed']:7.3f} {r['exact']:6.3f} {r['regions']:7d} {r['largest_region']:7d} "
            f"{r['static_rho']:5.2f} {r['wall_s']:7.2f}"
        )
    params = params_of(args, models=[shown(p) for p in paths])
    summary = {"baseline": "event names matched to node names"}
    out = write_result("profile", params, rows, summary=summary, out=args.out)
    print(f"wrote {shown(out)}")
    return 0
