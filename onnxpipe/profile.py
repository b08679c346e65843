"""Per-node time at deployment settings, measured with onnxruntime and mapped back to the original nodes.

onnxruntime runs the model at ``ORT_ENABLE_ALL`` (what deployment runs), and its profiler names the nodes
of the *optimized* graph: on CPU the NCHWc layout pass renames most Conv nodes and the tensors between
them, and fusions replace groups of nodes by one kernel.  :func:`profile_model` maps those times back:

1. **Timing.**  One session at deployment settings (``intra_op_num_threads=threads``, one inter-op thread,
   sequential execution) with profiling on: ``warmup`` runs, then ``runs`` runs whose per-node
   ``<node>_kernel_time`` events give a median per optimized node.  The session saves its optimized graph,
   whose node names are the event names.  Profiling costs 8-16 us per event, so the same session then runs
   ``runs`` more times with profiling off, and the per-node medians are scaled so that they sum to that
   unprofiled median wall time (:attr:`Profile.total_seconds`).  The scaled times therefore include the
   session's own per-run cost (feeding inputs, fetching outputs), spread in proportion to node time.
2. **Anchors**, tensors present in both graphs: by name, and by value.  Both graphs run once more at
   ``ORT_DISABLE_ALL`` with every node output exposed; an optimized tensor holds the same value as an
   original one when their relative L2 distance is under :data:`VALUE_TOLERANCE`, after undoing the NCHWc
   blocked layout (blocks of 16 channels with AVX-512, 8 with AVX2: a width counts once a value read
   back with it matches an original one, as a wrong width only permutes the elements).  Values are
   compared through small random sketches, so tensors are released as soon as they are read (and graphs
   with big activations run in chunks of outputs).  When the model's float
   constants are degenerate (every element equal, as in the onnx "light" models) a jittered copy is used
   for this step, so that channels and branches can be told apart.
3. **Regions**: the nodes of both graphs are joined across every tensor that is not an anchor; each region
   is a fused group seen from both sides.  A region's measured time is spread over its original nodes in
   proportion to their static FLOPs (:mod:`onnxpipe.costs`; output elements as fallback).  A region with
   no original node gives its time to its neighbours.  Nothing is dropped: the node times always sum to
   the total, and :attr:`Profile.unattributed` says which times were not attributed to exactly one node.

This module is the facade: :class:`Profile` and its JSON, and :func:`profile_model`, which runs the steps
kept in private modules: :mod:`onnxpipe.ortprofile` (step 1 and the sessions), :mod:`onnxpipe.valuematch`
with :mod:`onnxpipe.anchors` and :mod:`onnxpipe.valuesketch` (step 2), :mod:`onnxpipe.attribution` (step 3).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from onnxpipe.anchors import NAME_ANCHOR_TOLERANCE
from onnxpipe.attribution import attribute
from onnxpipe.core.errors import ProfileError, UsageError
from onnxpipe.core.progress import Progress
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapes import resolve_input_shapes
from onnxpipe.ortprofile import OrtModel, node_medians
from onnxpipe.valuematch import match_graphs
from onnxpipe.valuesketch import CENTRED_TOLERANCE, SKETCH_SIZE, VALUE_TOLERANCE

__all__ = [
    "CENTRED_TOLERANCE",
    "NAME_ANCHOR_TOLERANCE",
    "SCHEMA_VERSION",
    "SKETCH_SIZE",
    "VALUE_CHUNK_BYTES",
    "VALUE_TOLERANCE",
    "Profile",
    "profile_model",
]

SCHEMA_VERSION = 1
VALUE_CHUNK_BYTES = 512 << 20
"""Most bytes of exposed tensors one value-matching run may hold at once (read at each call)."""

# the names benchmarks and tests reach for from before the split
_OrtModel = OrtModel
_node_medians = node_medians


# --------------------------------------------------------------------------------------------------
# the result


@dataclass(frozen=True)
class Profile:
    """Seconds per compute node of one model at fixed input shapes, with what the partitioner needs."""

    schema_version: int
    model_sha256: str
    model_name: str
    source: str
    """``"profile"`` (measured) or ``"static"`` (cost model)."""
    threads: int
    runs: int
    input_shapes: Mapping[str, tuple[int, ...]]
    node_seconds: Mapping[str, float]
    """Every compute node of the view; 0.0 for nodes the optimizer folded away."""
    tensor_bytes: Mapping[str, int]
    """Bytes of each tensor at the profiled shapes."""
    total_seconds: float
    """Median whole-run wall time at deployment settings (static: the sum of node times)."""
    regions: tuple[tuple[str, ...], ...]
    """Groups of original nodes onnxruntime runs as one fused kernel (each of size >= 2)."""
    unattributed: tuple[str, ...]
    """Human-readable notes on every time not attributed to exactly one original node."""
    exact_fraction: float
    """Share of the time attributed to exactly one original node."""
    origin: str = field(default="", compare=False, repr=False)
    """The file the profile was read from, for messages (not saved)."""

    # ---- JSON

    def to_json(self) -> str:
        data = {
            "schema_version": self.schema_version,
            "model_sha256": self.model_sha256,
            "model_name": self.model_name,
            "source": self.source,
            "threads": self.threads,
            "runs": self.runs,
            "input_shapes": {k: list(v) for k, v in self.input_shapes.items()},
            "total_seconds": self.total_seconds,
            "exact_fraction": self.exact_fraction,
            "node_seconds": dict(self.node_seconds),
            "tensor_bytes": dict(self.tensor_bytes),
            "regions": [list(r) for r in self.regions],
            "unattributed": list(self.unattributed),
        }
        return json.dumps(data, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source_name: str = "") -> Profile:
        """Parse and validate; :class:`ProfileError` naming ``source_name`` on bad content."""
        where = source_name or "profile"
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ProfileError(
                f"{where}: not valid JSON ({e.msg} at line {e.lineno}); re-run onnxpipe profile"
            ) from None
        v = _Validator(where)
        if not isinstance(data, dict):
            v.fail("expected a JSON object")
        version = v.integer(data, "schema_version")
        if version != SCHEMA_VERSION:
            v.fail(f"schema_version {version}, this onnxpipe reads {SCHEMA_VERSION}")
        source = v.string(data, "source")
        if source not in ("profile", "static"):
            v.fail(f"source {source!r}, expected 'profile' or 'static'")
        shapes_raw = v.mapping(data, "input_shapes")
        input_shapes: dict[str, tuple[int, ...]] = {}
        for name, dims in shapes_raw.items():
            if not isinstance(dims, list) or not all(_is_int(d) and d >= 0 for d in dims):
                v.fail(f"input_shapes[{name!r}] must be a list of non-negative integers")
            input_shapes[name] = tuple(dims)
        node_seconds = {
            k: v.seconds(x, f"node_seconds[{k!r}]") for k, x in v.mapping(data, "node_seconds").items()
        }
        tensor_bytes: dict[str, int] = {}
        for k, x in v.mapping(data, "tensor_bytes").items():
            if not _is_int(x) or x < 0:
                v.fail(f"tensor_bytes[{k!r}] must be a non-negative integer")
            tensor_bytes[k] = x
        regions_raw = v.field(data, "regions", list)
        regions: list[tuple[str, ...]] = []
        for r in regions_raw:
            if not isinstance(r, list) or len(r) < 2 or not all(isinstance(n, str) for n in r):
                v.fail("regions must be lists of at least two node names")
            regions.append(tuple(r))
        notes = v.field(data, "unattributed", list)
        if not all(isinstance(n, str) for n in notes):
            v.fail("unattributed must be a list of strings")
        exact = v.seconds(data.get("exact_fraction"), "exact_fraction")
        if exact > 1.0 + 1e-9:
            v.fail("exact_fraction must lie in [0, 1]")
        threads = v.integer(data, "threads")
        runs = v.integer(data, "runs")
        if threads < 1 or runs < 0:
            v.fail("threads must be >= 1 and runs >= 0")
        return cls(
            schema_version=version,
            model_sha256=v.string(data, "model_sha256"),
            model_name=v.string(data, "model_name"),
            source=source,
            threads=threads,
            runs=runs,
            input_shapes=MappingProxyType(input_shapes),
            node_seconds=MappingProxyType(node_seconds),
            tensor_bytes=MappingProxyType(tensor_bytes),
            total_seconds=v.seconds(data.get("total_seconds"), "total_seconds"),
            regions=tuple(regions),
            unattributed=tuple(notes),
            exact_fraction=exact,
            origin=source_name,
        )

    def save(self, path: str | Path) -> None:
        """Write through a temporary file renamed into place: a failed write leaves nothing behind."""
        p = Path(path)
        tmp = p.with_name(f".{p.name}.tmp")
        try:
            tmp.write_text(self.to_json(), encoding="utf-8")
            os.replace(tmp, p)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise ProfileError(f"{p}: cannot write the profile ({e.strerror}); choose another path") from e

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
            raise ProfileError(
                f"{p}: cannot read the profile ({reason}); give a file onnxpipe profile wrote"
            ) from e
        return cls.from_json(text, source_name=str(p))

    def check_matches(self, view: ModelView) -> None:
        """Refuse a profile made for another model (compared by the model file's sha256)."""
        if self.model_sha256 == view.sha256:
            return
        which = Path(self.origin).name if self.origin else "the profile"
        made_for = self.model_name or "another model"
        this = view.path.name if view.path is not None else "the in-memory model"
        raise ProfileError(
            f"{which}: made for model {made_for} (sha256 {self.model_sha256[:12]}), not {this} "
            f"(sha256 {view.sha256[:12]}); re-run onnxpipe profile"
        )


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class _Validator:
    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, why: str) -> Any:
        raise ProfileError(f"{self.where}: {why}; re-run onnxpipe profile to make a new one")

    def field(self, data: dict[str, Any], key: str, kind: type) -> Any:
        if key not in data:
            self.fail(f"missing field {key!r}")
        value = data[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            self.fail(f"field {key!r} must be a {kind.__name__}")
        return value

    def integer(self, data: dict[str, Any], key: str) -> int:
        value = self.field(data, key, int)
        return int(value)

    def string(self, data: dict[str, Any], key: str) -> str:
        return str(self.field(data, key, str))

    def mapping(self, data: dict[str, Any], key: str) -> dict[str, Any]:
        return dict(self.field(data, key, dict))

    def seconds(self, x: object, what: str) -> float:
        if not isinstance(x, int | float) or isinstance(x, bool) or not math.isfinite(x) or x < 0:
            self.fail(f"{what} must be a finite non-negative number")
        return float(x)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# profiling


def profile_model(
    view: ModelView,
    *,
    threads: int = 1,
    runs: int = 10,
    warmup: int = 3,
    shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    progress: bool = False,
) -> Profile:
    """Measure every compute node of ``view`` with onnxruntime at deployment settings (see module doc).

    ``shapes`` overrides input shapes (:func:`onnxpipe.feeds.resolve_input_shapes`); inputs are
    :func:`onnxpipe.feeds.random_feeds` with ``seed``.  Raises :class:`ProfileError` when onnxruntime
    cannot load or run the model.
    """
    if threads < 1:
        raise UsageError(f"threads must be >= 1, got {threads}")
    if runs < 1:
        raise UsageError(f"runs must be >= 1, got {runs}")
    if warmup < 0:
        raise UsageError(f"warmup must be >= 0, got {warmup}")
    label = view.path.name if view.path is not None else "model"
    input_shapes = resolve_input_shapes(view, shapes)
    feeds = random_feeds(view, input_shapes, seed)
    steps = warmup + 2 * runs + 3
    with (
        tempfile.TemporaryDirectory(prefix="onnxpipe-profile-") as tmpdir,
        Progress(steps, f"profiling {label}", enabled=progress) as bar,
    ):
        ort_model = OrtModel(view, Path(tmpdir), label, threads)
        timing = ort_model.measure(feeds, warmup, runs, bar)
        bar.set_label(f"matching {label}")
        matched = match_graphs(view, ort_model, timing, feeds, input_shapes, VALUE_CHUNK_BYTES)
        bar.advance(3)
        result = attribute(view, timing, matched)
        bar.set_label(f"profiled {label}")
    return Profile(
        schema_version=SCHEMA_VERSION,
        model_sha256=view.sha256,
        model_name=view.path.name if view.path is not None else "",
        source="profile",
        threads=threads,
        runs=runs,
        input_shapes=MappingProxyType(input_shapes),
        node_seconds=MappingProxyType(result.node_seconds),
        tensor_bytes=MappingProxyType(matched.tensor_bytes),
        total_seconds=timing.total_seconds,
        regions=result.regions,
        unattributed=tuple(matched.notes + result.notes),
        exact_fraction=result.exact_fraction,
    )
