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
   blocked layout.  Values are compared through small random sketches, so tensors are released as soon as
   they are read (and graphs with big activations run in chunks of outputs).  When the model's float
   constants are degenerate (every element equal, as in the onnx "light" models) a jittered copy is used
   for this step, so that channels and branches can be told apart.
3. **Regions**: the nodes of both graphs are joined across every tensor that is not an anchor; each region
   is a fused group seen from both sides.  A region's measured time is spread over its original nodes in
   proportion to their static FLOPs (:mod:`onnxpipe.costs`; output elements as fallback).  A region with
   no original node gives its time to its neighbours.  Nothing is dropped: the node times always sum to
   the total, and :attr:`Profile.unattributed` says which times were not attributed to exactly one node.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from onnxpipe.costs import concrete_shapes, constant_tensors, node_flops
from onnxpipe.errors import ProfileError, UsageError
from onnxpipe.feeds import random_feeds, resolve_input_shapes, symbol_sizes
from onnxpipe.graph import dfs_order
from onnxpipe.model import ModelView, itemsize, subgraph_outer_reads
from onnxpipe.progress import Progress

SCHEMA_VERSION = 1
VALUE_TOLERANCE = 1e-3
"""Relative L2 distance under which two tensors count as the same value."""
CENTRED_TOLERANCE = 0.1
"""The same, for the values minus their mean (looser: rounding is large next to a tiny spread)."""
NAME_ANCHOR_TOLERANCE = 0.05
"""A tensor name shared by both graphs is trusted unless its values differ by more than this."""
VALUE_CHUNK_BYTES = 512 << 20
"""Most bytes of exposed tensors one value-matching run may hold at once."""
SKETCH_SIZE = 64

_NCHWC_DOMAIN = "com.microsoft.nchwc"
_NCHWC_BLOCKS = (16, 8, 4)
_EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"


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
        ort_model = _OrtModel(view, Path(tmpdir), label, threads)
        timing = ort_model.measure(feeds, warmup, runs, bar)
        bar.set_label(f"matching {label}")
        matched = _match(view, ort_model, timing, feeds, input_shapes)
        bar.advance(3)
        result = _attribute(view, timing, matched)
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


# ---- onnxruntime sessions


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    line = text.splitlines()[0] if text else type(e).__name__
    return line if len(line) <= 300 else line[:297] + "..."


@dataclass
class _Timing:
    optimized: onnx.ModelProto
    optimized_dir: Path
    node_seconds: dict[str, float]
    """Per optimized node, scaled to the unprofiled total."""
    output_bytes: dict[str, int]
    total_seconds: float
    foreign_seconds: float
    foreign_names: list[str]


class _OrtModel:
    """The view's model for onnxruntime: its (renamed) graph, with external data read from ``base_dir``."""

    def __init__(self, view: ModelView, tmp: Path, label: str, threads: int) -> None:
        import onnxruntime as ort

        self.ort = ort
        self.view = view
        self.tmp = tmp
        self.label = label
        self.threads = threads

    def options(self, level: str, *, threads: int | None, external_dir: Path | None) -> Any:
        ort = self.ort
        so = ort.SessionOptions()
        so.log_severity_level = 4  # errors reach the user as one ProfileError line, not ORT's log
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.inter_op_num_threads = 1
        if threads is not None:
            so.intra_op_num_threads = threads
        if external_dir is not None:
            so.add_session_config_entry(_EXTERNAL_FOLDER_KEY, str(external_dir))
        return so

    def session(self, model: bytes, so: Any, what: str) -> Any:
        try:
            return self.ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise ProfileError(
                f"{self.label}: onnxruntime cannot load {what} ({_first_line(e)}); make sure onnxruntime "
                "supports its ops and opset and finds its external weight files, or use --cost static"
            ) from e

    def run(
        self, sess: Any, feeds: Mapping[str, np.ndarray], what: str, outputs: list[str] | None = None
    ) -> Any:
        names = {i.name for i in sess.get_inputs()}
        try:
            return sess.run(outputs, {k: v for k, v in feeds.items() if k in names})
        except Exception as e:
            shapes = ", ".join(f"{k}={list(v.shape)}" for k, v in feeds.items())
            raise ProfileError(
                f"{self.label}: onnxruntime failed running {what} ({_first_line(e)}) with inputs {shapes}; "
                "give the shapes the model expects with --shape NAME=D1,D2,..."
            ) from e

    def save_optimized(self, model: bytes, stem: str, what: str) -> onnx.ModelProto:
        """Optimize at ENABLE_ALL and return the optimized graph (weights left in ``tmp``)."""
        so = self.options("ORT_ENABLE_ALL", threads=self.threads, external_dir=self.view.base_dir)
        self._save_to(so, stem)
        sess = self.session(model, so, what)
        del sess
        return self._load_saved(stem)

    def _save_to(self, so: Any, stem: str) -> None:
        so.optimized_model_filepath = str(self.tmp / f"{stem}.onnx")
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", f"{stem}.data")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")

    def _load_saved(self, stem: str) -> onnx.ModelProto:
        path = self.tmp / f"{stem}.onnx"
        try:
            return onnx.load(str(path), load_external_data=False)
        except Exception as e:
            raise ProfileError(
                f"{self.label}: onnxruntime did not save its optimized graph ({_first_line(e)}); "
                "use --cost static for this model"
            ) from e

    def measure(self, feeds: Mapping[str, np.ndarray], warmup: int, runs: int, bar: Progress) -> _Timing:
        so = self.options("ORT_ENABLE_ALL", threads=self.threads, external_dir=self.view.base_dir)
        so.enable_profiling = True
        so.profile_file_prefix = str(self.tmp / "trace")
        self._save_to(so, "optimized")
        if self.view.base_dir is None and _uses_external_data(self.view.proto):
            raise ProfileError(
                f"{self.label}: its weights are in external files but the model was not loaded from a file; "
                "load it with onnxpipe.model.load_model(path)"
            )
        sess = self.session(self.view.proto.SerializeToString(), so, "the model")
        for _ in range(warmup + runs):
            self.run(sess, feeds, "the model")
            bar.advance()
        trace = sess.end_profiling()
        walls: list[float] = []
        for _ in range(runs):
            start = time.perf_counter()
            self.run(sess, feeds, "the model")
            walls.append(time.perf_counter() - start)
            bar.advance()
        del sess
        total = statistics.median(walls)
        optimized = self._load_saved("optimized")
        events = json.loads(Path(trace).read_text(encoding="utf-8"))
        medians, output_bytes = _node_medians(events, runs)
        top = {n.name for n in optimized.graph.node}
        foreign = sorted(n for n in medians if n not in top)
        foreign_us = sum(medians[n] for n in foreign)
        kept = {n: us for n, us in medians.items() if n in top}
        measured = sum(kept.values())
        scale = total / (measured * 1e-6) if measured > 0 else 0.0
        return _Timing(
            optimized=optimized,
            optimized_dir=self.tmp,
            node_seconds={n: us * 1e-6 * scale for n, us in kept.items()},
            output_bytes=output_bytes,
            total_seconds=total,
            foreign_seconds=foreign_us * 1e-6 * scale,
            foreign_names=foreign,
        )


def _uses_external_data(proto: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)


def _node_medians(events: Sequence[Mapping[str, Any]], runs: int) -> tuple[dict[str, float], dict[str, int]]:
    """Median per-node kernel time (us) over the last ``runs`` model runs, and each node's output bytes."""
    spans = sorted(
        (int(e["ts"]), int(e["ts"]) + int(e["dur"]))
        for e in events
        if e.get("cat") == "Session" and e.get("name") == "model_run"
    )[-runs:]
    starts = [s for s, _ in spans]
    per_run: dict[str, list[float]] = {}
    output_bytes: dict[str, int] = {}
    suffix = "_kernel_time"
    for e in events:
        name = e.get("name", "")
        if e.get("cat") != "Node" or not isinstance(name, str) or not name.endswith(suffix):
            continue
        node = name[: -len(suffix)]
        dur = float(e.get("dur", 0))
        if spans:
            ts = int(e["ts"])
            k = bisect.bisect_right(starts, ts) - 1
            if k < 0 or ts > spans[k][1]:
                continue  # a warm-up run
            per_run.setdefault(node, [0.0] * len(spans))[k] += dur
        else:  # no run markers (another onnxruntime version): the node's k-th event is run k
            per_run.setdefault(node, []).append(dur)
        args = e.get("args") or {}
        if node not in output_bytes and "output_size" in args:
            with contextlib.suppress(TypeError, ValueError):
                output_bytes[node] = int(args["output_size"])
    return {n: statistics.median(v[-runs:]) for n, v in per_run.items()}, output_bytes


# ---- value matching


@dataclass(frozen=True)
class _Print:
    """A tensor reduced to its element count, L2 norms (raw and with the mean removed) and CountSketches
    of its values (raw and centred).  Comparing centred values too keeps nearly constant tensors (deep
    layers of degenerate weights) from matching anything of the same mean."""

    size: int
    norm: float
    sketch: np.ndarray
    centred_norm: float
    centred_sketch: np.ndarray

    def distance(self, other: _Print) -> float:
        """Relative L2 distance of the raw values (estimated from the sketches)."""
        scale = max(self.norm, other.norm)
        if abs(self.norm - other.norm) > VALUE_TOLERANCE * scale:
            return math.inf
        return float(np.linalg.norm(self.sketch - other.sketch)) / scale

    def same(self, other: _Print, tolerance: float = VALUE_TOLERANCE) -> bool:
        if self.size != other.size or self.distance(other) >= tolerance:
            return False
        scale = max(self.centred_norm, other.centred_norm)
        return float(np.linalg.norm(self.centred_sketch - other.centred_sketch)) < CENTRED_TOLERANCE * scale


class _Sketcher:
    """Same-size tensors share hash and sign vectors, so their sketches are comparable."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._cached = 0

    def _vectors(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        hit = self._cache.get(n)
        if hit is None:
            if self._cached + n > 64_000_000:
                self._cache.clear()
                self._cached = 0
            rng = np.random.default_rng(n)
            h = rng.integers(0, SKETCH_SIZE, n, dtype=np.uint8)
            s = rng.integers(0, 2, n, dtype=np.int8) * 2 - 1
            ones = np.bincount(h, weights=s, minlength=SKETCH_SIZE)
            hit = (h, s, ones)
            self._cache[n] = hit
            self._cached += n
        return hit

    def sketch(self, arr: np.ndarray, wanted: Callable[[int, float], bool] | None = None) -> _Print | None:
        """The tensor's print; ``None`` for non-float, non-finite or constant tensors, and when
        ``wanted(size, norm)`` says no original tensor could match (saving the sketch)."""
        if arr.dtype.kind != "f" or arr.size < 2:
            return None
        x = np.ascontiguousarray(arr, dtype=np.float64).reshape(-1)
        sq = float(np.add.reduce(x * x))  # not np.dot: BLAS threads crawl on a busy machine
        if not math.isfinite(sq) or sq == 0.0:
            return None
        norm = math.sqrt(sq)
        if wanted is not None and not wanted(x.size, norm):
            return None
        mean = float(x.sum()) / x.size
        centred = x - mean
        centred_norm = math.sqrt(float(np.add.reduce(centred * centred)))
        if centred_norm <= 1e-12 * norm:
            return None  # every element equal: cannot be told apart
        h, s, ones = self._vectors(x.size)
        sk = np.bincount(h, weights=x * s, minlength=SKETCH_SIZE)
        return _Print(int(x.size), norm, sk, centred_norm, sk - mean * ones)


@dataclass
class _Matched:
    optimized: onnx.ModelProto
    anchors: dict[str, str]
    """Optimized tensor -> original tensor holding the same value."""
    duplicates: set[str]
    """Original tensors the optimizer computes once for another (common subexpressions)."""
    constant: set[str]
    """Original tensors that are constants (never joined across)."""
    shapes: dict[str, tuple[int, ...]]
    """Original tensor shapes at the profiled input shapes."""
    tensor_bytes: dict[str, int]
    notes: list[str]


def _match(
    view: ModelView,
    ort_model: _OrtModel,
    timing: _Timing,
    feeds: Mapping[str, np.ndarray],
    input_shapes: Mapping[str, tuple[int, ...]],
) -> _Matched:
    """Anchors between the original graph and the optimized one that was timed, and tensor sizes."""
    notes: list[str] = []
    original, optimized, rename = _value_graphs(view, ort_model, timing.optimized, notes)
    constant = constant_tensors(view)
    sketcher = _Sketcher()
    shapes = {name: tuple(int(d) for d in arr.shape) for name, arr in feeds.items()}
    nbytes = {name: int(arr.nbytes) for name, arr in feeds.items()}
    o_prints: dict[str, _Print] = {}
    for name, arr in feeds.items():
        p = sketcher.sketch(arr)
        if p is not None:
            o_prints[name] = p

    def take_original(name: str, arr: np.ndarray) -> None:
        shapes[name] = tuple(int(d) for d in arr.shape)
        nbytes[name] = int(arr.nbytes) if arr.dtype.kind != "O" else 8 * int(arr.size)
        p = sketcher.sketch(arr)
        if p is not None:
            o_prints[name] = p

    o_names = [t for n in view.nodes if not n.is_constant for t in n.outputs if t not in constant]
    symbols = symbol_sizes(view, input_shapes)
    estimates = {t: view.tensor(t).nbytes(symbols) for t in o_names}
    p_prints: dict[str, list[_Print]] = {}
    by_size: dict[int, list[tuple[float, str]]] = {}
    try:
        _run_exposed(
            ort_model, original, o_names, estimates, view.base_dir, feeds, take_original, "the model"
        )
    except ProfileError as e:
        notes.append(f"values could not be compared ({e}); regions come from tensor names only")
        for t, shape in concrete_shapes(view, input_shapes).items():
            shapes.setdefault(t, shape)
    else:
        for name, p in o_prints.items():
            by_size.setdefault(p.size, []).append((p.norm, name))
        for lst in by_size.values():
            lst.sort()
        try:
            p_prints = _optimized_prints(ort_model, optimized, timing, feeds, o_prints, by_size, sketcher)
        except ProfileError as e:
            notes.append(
                f"values of the optimized graph could not be compared ({e}); regions come from names only"
            )

    anchors = _anchors(view, optimized, o_prints, p_prints, by_size, constant)
    duplicates = _duplicates(view, anchors, o_prints, p_prints, constant)
    if rename:
        # back to the tensor names of the graph that was timed
        anchors = {rename.get(p, p): o for p, o in anchors.items()}
    _add_unmeasured(view, symbols, shapes, nbytes)
    return _Matched(
        optimized=timing.optimized,
        anchors=anchors,
        duplicates=duplicates,
        constant=constant,
        shapes=shapes,
        tensor_bytes=nbytes,
        notes=notes,
    )


def _value_graphs(
    view: ModelView, ort_model: _OrtModel, optimized: onnx.ModelProto, notes: list[str]
) -> tuple[onnx.ModelProto, onnx.ModelProto, dict[str, str]]:
    """The original and optimized graphs to compare values on, and the map from the latter's tensor
    names to the timed graph's: a jittered copy when the model's constants are degenerate and the copy
    optimizes the same way, else the model itself."""
    jittered = _jittered_copy(view)
    if jittered is None:
        return view.proto, optimized, {}
    other = ort_model.save_optimized(jittered.SerializeToString(), "jittered", "a jittered copy of the model")
    rename = _same_structure(optimized, other)
    if rename is not None:
        return jittered, other, rename
    notes.append(
        "the model's float constants are degenerate (all elements equal) and onnxruntime optimizes "
        "a jittered copy differently, so values were matched on the original constants; equal "
        "values were told apart by graph structure"
    )
    return view.proto, optimized, {}


def _optimized_prints(
    ort_model: _OrtModel,
    optimized: onnx.ModelProto,
    timing: _Timing,
    feeds: Mapping[str, np.ndarray],
    o_prints: Mapping[str, _Print],
    by_size: Mapping[int, list[tuple[float, str]]],
    sketcher: _Sketcher,
) -> dict[str, list[_Print]]:
    """Prints of the optimized graph's tensors (NCHWc ones also read back as NCHW), only where an
    original tensor of the same size and norm exists."""
    blocked = _blocked_tensors(optimized)
    blocks = list(_NCHWC_BLOCKS)
    p_prints: dict[str, list[_Print]] = {}

    def wanted(size: int, norm: float) -> bool:
        lst = by_size.get(size)
        if not lst:
            return False
        k = bisect.bisect_left(lst, (norm * (1 - VALUE_TOLERANCE), ""))
        return k < len(lst) and lst[k][0] <= norm * (1 + VALUE_TOLERANCE)

    def take(name: str, arr: np.ndarray) -> None:
        prints = []
        # a name the original graph also has is sketched anyway, to check that the values agree
        p = sketcher.sketch(arr, None if name in o_prints else wanted)
        if p is not None:
            prints.append(p)
        if name in blocked:
            prints.extend(_unblocked_prints(arr, blocks, by_size, wanted, sketcher))
        if prints:
            p_prints[name] = prints

    names = [t for n in optimized.graph.node for t in n.output if t]
    estimates = {t: timing.output_bytes.get(n.name, 0) for n in optimized.graph.node for t in n.output}
    _run_exposed(
        ort_model,
        optimized,
        names,
        estimates,
        timing.optimized_dir,
        feeds,
        take,
        "the optimized graph",
        prune_inputs=True,
    )
    return p_prints


def _add_unmeasured(
    view: ModelView, symbols: Mapping[str, int], shapes: dict[str, tuple[int, ...]], nbytes: dict[str, int]
) -> None:
    """Shapes and bytes of tensors the value run did not expose (weights, constants), from their types."""
    for t in [t for n in view.nodes for t in n.outputs] + list(view.initializers):
        if t in nbytes:
            continue
        info = view.tensor(t)
        if t not in shapes:
            if info.shape is None:
                continue
            shapes[t] = tuple(d if isinstance(d, int) else symbols.get(str(d), 1) for d in info.shape)
        nbytes[t] = view.initializers.get(t, math.prod(shapes[t]) * max(1, itemsize(info.elem_type)))


def _run_exposed(
    ort_model: _OrtModel,
    model: onnx.ModelProto,
    names: Sequence[str],
    estimates: Mapping[str, int],
    external_dir: Path | None,
    feeds: Mapping[str, np.ndarray],
    take: Callable[[str, np.ndarray], None],
    what: str,
    *,
    prune_inputs: bool = False,
) -> None:
    """Run ``model`` at DISABLE_ALL exposing ``names`` as outputs, in chunks of about VALUE_CHUNK_BYTES.

    The graph outputs of ``model`` are swapped for each chunk and restored afterwards (no copy of the
    weights is made); each value is handed to ``take`` and released.
    """
    graph = model.graph
    saved_outputs = list(graph.output)
    saved_inputs = list(graph.input)
    try:
        if prune_inputs:
            # old-IR models list initializers as inputs; the optimizer may have folded them away
            inits = {t.name for t in graph.initializer}
            read = {i for n in graph.node for i in n.input} | {
                t for n in graph.node for t in subgraph_outer_reads(n)
            }
            keep = [i for i in saved_inputs if i.name in inits or i.name in read or i.name in feeds]
            del graph.input[:]
            graph.input.extend(keep)
        for chunk in _chunks(names, estimates):
            del graph.output[:]
            graph.output.extend(onnx.ValueInfoProto(name=t) for t in chunk)
            so = ort_model.options("ORT_DISABLE_ALL", threads=None, external_dir=external_dir)
            sess = ort_model.session(model.SerializeToString(), so, what)
            values = ort_model.run(sess, feeds, what)
            del sess
            for t, arr in zip(chunk, values, strict=True):
                if isinstance(arr, np.ndarray):
                    take(t, arr)
            del values
    finally:
        del graph.output[:]
        graph.output.extend(saved_outputs)
        if prune_inputs:
            del graph.input[:]
            graph.input.extend(saved_inputs)


def _chunks(names: Sequence[str], estimates: Mapping[str, int]) -> Iterable[list[str]]:
    chunk: list[str] = []
    size = 0
    for t in dict.fromkeys(names):
        b = max(0, estimates.get(t, 0))
        if chunk and size + b > VALUE_CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(t)
        size += b
    if chunk:
        yield chunk


def _blocked_tensors(optimized: onnx.ModelProto) -> set[str]:
    """Tensors that may hold NCHWc blocked data: what the NCHWc ops write (but ReorderOutput's result),
    and what ordinary ops (Concat, Add, Relu...) compute from blocked tensors."""
    nodes = list(optimized.graph.node)
    blocked: set[str] = set()
    for idx in _topological(
        nodes, {t.name for t in optimized.graph.initializer} | {i.name for i in optimized.graph.input}
    ):
        n = nodes[idx]
        if n.domain == _NCHWC_DOMAIN:
            if n.op_type != "ReorderOutput":
                blocked.update(t for t in n.output if t)
        elif any(i in blocked for i in n.input):
            blocked.update(t for t in n.output if t)
    return blocked


def _unblocked_prints(
    arr: np.ndarray,
    blocks: list[int],
    sizes: Container[int],
    wanted: Callable[[int, float], bool],
    sketcher: _Sketcher,
) -> list[_Print]:
    """Prints of ``arr`` read back from NCHWc blocks to NCHW, for each block size and channel count an
    original tensor could have (padding channels sliced off).  The machine has one block size: the first
    that yields a print moves to the front of ``blocks``."""
    if arr.ndim < 3 or arr.dtype.kind != "f":
        return []
    n, cp, spatial = arr.shape[0], arr.shape[1], arr.shape[2:]
    per_channel = n * math.prod(spatial)
    for b in list(blocks):
        if cp % b:
            continue
        channels = [c for c in range(cp, max(0, cp - b), -1) if c * per_channel in sizes]
        if not channels:
            continue
        blocked = arr.reshape(n, cp // b, *spatial, b)
        nchw = np.moveaxis(blocked, -1, 2).reshape(n, cp, *spatial)
        prints = []
        for c in channels:
            p = sketcher.sketch(nchw[:, :c], wanted)
            if p is not None:
                prints.append(p)
        if prints:
            blocks.remove(b)
            blocks.insert(0, b)
            return prints
    return []


def _anchors(
    view: ModelView,
    optimized: onnx.ModelProto,
    o_prints: Mapping[str, _Print],
    p_prints: Mapping[str, list[_Print]],
    by_size: Mapping[int, list[tuple[float, str]]],
    constant: set[str],
) -> dict[str, str]:
    """Pairs (optimized tensor -> original tensor): shared names first, then equal values."""
    finder = _AnchorFinder(view, optimized, o_prints, p_prints, by_size, constant)
    finder.by_name()
    if p_prints:
        finder.by_value()
    return finder.anchors


class _AnchorFinder:
    """Finds anchors; value anchors in the optimized graph's topological order, so that the inputs of a
    node are settled before its outputs are matched."""

    def __init__(
        self,
        view: ModelView,
        optimized: onnx.ModelProto,
        o_prints: Mapping[str, _Print],
        p_prints: Mapping[str, list[_Print]],
        by_size: Mapping[int, list[tuple[float, str]]],
        constant: set[str],
    ) -> None:
        self.view = view
        self.optimized = optimized
        self.o_prints = o_prints
        self.p_prints = p_prints
        self.by_size = by_size
        self.constant = constant
        self.p_nodes = list(optimized.graph.node)
        self.p_inits = {t.name for t in optimized.graph.initializer}
        self.p_producer = {t: n for n in self.p_nodes for t in n.output if t}
        self.pos = dict(view.producer)
        self.anchors: dict[str, str] = {}
        self.used: set[str] = set()
        """Original tensors taken by an anchor."""
        self.lower: dict[str, int] = {}
        """Per optimized tensor, the latest original position it is known to come after."""

    def by_name(self) -> None:
        original = set(self.view.producer) | set(self.view.inputs)
        graph = self.optimized.graph
        names = [i.name for i in graph.input] + [t for n in self.p_nodes for t in n.output if t]
        for t in dict.fromkeys(names):
            if t not in original or t in self.p_inits:
                continue
            o_p, p_p = self.o_prints.get(t), self.p_prints.get(t)
            if o_p is not None and p_p and not any(o_p.same(q, NAME_ANCHOR_TOLERANCE) for q in p_p):
                continue  # same name, different value: not the same tensor
            self.anchors[t] = t
            self.used.add(t)

    def by_value(self) -> None:
        available = self.p_inits | {i.name for i in self.optimized.graph.input}
        consumers_of: dict[str, set[str]] = {}
        for node in self.view.nodes:
            for r in node.reads:
                consumers_of.setdefault(r, set()).update(node.outputs)
        for idx in _topological(self.p_nodes, available):
            node = self.p_nodes[idx]
            bound = max((self.lower.get(i, -1) for i in _reads(node)), default=-1)
            images: set[str] | None = None
            for t in node.output:
                if not t:
                    continue
                if t in self.anchors:
                    self.lower[t] = self.pos.get(self.anchors[t], -1)
                    continue
                self.lower[t] = bound
                prints = self.p_prints.get(t)
                if not prints:
                    continue
                cands = _candidates(prints, self.o_prints, self.by_size, self.used, self.constant)
                if images is None and (len(cands) != 1):
                    images = self.p_frontier(node)
                if not cands:
                    self.layout_copy(t, prints, images or set())
                    continue
                if len(cands) > 1:
                    cands = self.best_ranked(node, cands, images or set(), bound)
                best = min(cands, key=lambda c: self.pos.get(c, -1))
                # equal values along a chain (Relu of non-negative data, Identity, Reshape): the last
                while True:
                    nxt = [c for c in cands if c in consumers_of.get(best, ()) and c != best]
                    if not nxt:
                        break
                    best = max(nxt, key=lambda c: self.pos.get(c, -1))
                self.anchors[t] = best
                self.used.add(best)
                self.lower[t] = self.pos.get(best, -1)

    def layout_copy(self, t: str, prints: Sequence[_Print], images: set[str]) -> None:
        """Anchor ``t`` to one of its node's own inputs when it holds the same value in another layout
        (ReorderInput): a copy, not a tensor to join regions across."""
        copies = [
            o
            for o in sorted(images, key=lambda o: self.pos.get(o, -1))
            if o in self.o_prints and any(q.same(self.o_prints[o]) for q in prints)
        ]
        if copies:
            self.anchors[t] = copies[-1]
            self.lower[t] = self.pos.get(copies[-1], -1)

    def best_ranked(self, node: onnx.NodeProto, cands: list[str], images: set[str], bound: int) -> list[str]:
        """Among equal values in several places (parallel branches of degenerate weights), those computed
        from what ``node`` is computed from, then those the optimizer named ``node`` after, then those
        downstream of its inputs."""

        def rank(c: str) -> tuple[bool, bool, bool]:
            front = self.o_frontier(c)
            consistent = front is not None and front <= images
            producer = self.view.nodes[self.pos[c]].name if c in self.pos else ""
            return consistent, _named_after(node.name, c, producer), self.pos.get(c, -1) > bound

        ranks = {c: rank(c) for c in cands}
        top = max(ranks.values())
        return [c for c in cands if ranks[c] == top]

    def o_frontier(self, t: str, limit: int = 256) -> set[str] | None:
        """Anchored original tensors that ``t`` is computed from through unanchored ones (None: too far)."""
        found: set[str] = set()
        seen: set[int] = set()
        stack = [self.pos[t]] if t in self.pos else []
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            if len(seen) > limit:
                return None
            for r in self.view.nodes[i].reads:
                if r in self.used:
                    found.add(r)
                elif r in self.constant:
                    continue
                elif r in self.pos:
                    stack.append(self.pos[r])
                else:
                    found.add(r)
        return found

    def p_frontier(self, node: onnx.NodeProto, limit: int = 256) -> set[str]:
        """Original images of the anchored tensors ``node`` is computed from through unanchored ones."""
        found: set[str] = set()
        seen: set[str] = set()
        stack = [node]
        while stack and len(seen) <= limit:
            n = stack.pop()
            if n.name in seen:
                continue
            seen.add(n.name)
            for r in _reads(n):
                if r in self.anchors:
                    found.add(self.anchors[r])
                elif r in self.p_producer and r not in self.p_inits:
                    stack.append(self.p_producer[r])
        return found


def _reads(node: onnx.NodeProto) -> list[str]:
    return [i for i in node.input if i] + sorted(subgraph_outer_reads(node))


def _named_after(p_name: str, tensor: str, node: str) -> bool:
    """Whether the optimizer derived ``p_name`` from the original tensor or node name."""
    return any(p_name == x or p_name.startswith(x + "_") for x in (tensor, node) if x)


def _duplicates(
    view: ModelView,
    anchors: Mapping[str, str],
    o_prints: Mapping[str, _Print],
    p_prints: Mapping[str, list[_Print]],
    constant: set[str],
) -> set[str]:
    """Unanchored original tensors equal to an anchored optimized one computed elsewhere: onnxruntime
    merged two identical computations (common subexpression elimination) and runs only one of them.

    Equal values on one chain (a Relu of non-negative data) are not duplicates: those nodes are fused."""
    anchored = set(anchors.values())
    index: dict[int, list[tuple[float, int, _Print, str]]] = {}
    for p_t, o_t in anchors.items():
        for q in p_prints.get(p_t, ()):
            lst = index.setdefault(q.size, [])
            lst.append((q.norm, len(lst), q, o_t))
    for lst in index.values():
        lst.sort(key=lambda e: e[:2])
    result: set[str] = set()
    for o, pr in o_prints.items():
        if o in anchored or o in constant or o not in view.producer:
            continue
        lst = index.get(pr.size, [])
        k = bisect.bisect_left(lst, pr.norm * (1 - VALUE_TOLERANCE), key=lambda e: e[0])
        for norm, _, q, twin in lst[k:]:
            if norm > pr.norm * (1 + VALUE_TOLERANCE):
                break
            if pr.same(q) and not _related(view, o, twin):
                result.add(o)
                break
    return result


def _related(view: ModelView, a: str, b: str, limit: int = 64) -> bool:
    """Whether one tensor is computed from the other within ``limit`` nodes."""
    for src, dst in ((a, b), (b, a)):
        seen: set[str] = set()
        stack = [src]
        while stack and len(seen) < limit:
            t = stack.pop()
            if t == dst:
                return True
            if t in seen:
                continue
            seen.add(t)
            for c in view.consumers.get(t, ()):
                stack.extend(view.nodes[c].outputs)
    return False


def _candidates(
    prints: Sequence[_Print],
    o_prints: Mapping[str, _Print],
    by_size: Mapping[int, list[tuple[float, str]]],
    used: set[str],
    constant: set[str],
) -> list[str]:
    found: list[str] = []
    for p in prints:
        lst = by_size.get(p.size)
        if not lst:
            continue
        lo = bisect.bisect_left(lst, (p.norm * (1 - VALUE_TOLERANCE), ""))
        for norm, name in lst[lo:]:
            if norm > p.norm * (1 + VALUE_TOLERANCE):
                break
            if name not in used and name not in constant and name not in found and p.same(o_prints[name]):
                found.append(name)
    return found


def _topological(nodes: Sequence[onnx.NodeProto], available: set[str]) -> list[int]:
    deps = [[i for i in n.input if i] + sorted(subgraph_outer_reads(n)) for n in nodes]
    outs = [[o for o in n.output if o] for n in nodes]
    return dfs_order(deps, outs, available, [n.name for n in nodes])


def _same_structure(timed: onnx.ModelProto, other: onnx.ModelProto) -> dict[str, str] | None:
    """When ``other`` has the same nodes as ``timed`` (names, ops, wiring), the map from its tensor names
    to ``timed``'s (generated names such as ``reorder_token_N`` are numbered differently); else ``None``."""
    a, b = timed.graph.node, other.graph.node
    if len(a) != len(b):
        return None
    rename: dict[str, str] = {}
    for x, y in zip(a, b, strict=True):
        if (x.name, x.op_type, x.domain, len(x.output)) != (y.name, y.op_type, y.domain, len(y.output)):
            return None
        rename.update(zip(y.output, x.output, strict=True))
    produced = set(rename.values())
    for x, y in zip(a, b, strict=True):
        ins_x = [i for i in x.input if i in produced]
        ins_y = [rename[i] for i in y.input if i in rename]
        if ins_x != ins_y:
            return None
    return rename


def _jittered_copy(view: ModelView) -> onnx.ModelProto | None:
    """A copy whose degenerate float constants (all elements equal, at least 16) are jittered by a
    factor in [0.5, 1.5) per element, or ``None`` when the model has none.  Signs are kept (so variances
    stay positive); all-zero constants stay zero; weights in external files are left alone."""
    rng = np.random.default_rng(20240531)
    proto = view.proto
    graph = proto.graph
    float_types = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16}

    def jitter(arr: np.ndarray) -> np.ndarray | None:
        if arr.size < 16 or arr.dtype.kind != "f":
            return None
        flat = arr.reshape(-1)
        if flat[0] == 0 or not (flat == flat[0]).all():
            return None
        return (arr * rng.uniform(0.5, 1.5, arr.shape)).astype(arr.dtype)

    new_inits: dict[int, onnx.TensorProto] = {}
    for i, t in enumerate(graph.initializer):
        if t.data_type in float_types and t.data_location != onnx.TensorProto.EXTERNAL:
            j = jitter(numpy_helper.to_array(t))
            if j is not None:
                new_inits[i] = numpy_helper.from_array(j, t.name)
    new_nodes: dict[int, onnx.NodeProto] = {}
    init_arrays = {t.name: t for t in graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL}
    for i, n in enumerate(graph.node):
        value = next(
            (a.t for a in n.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None
        )
        if n.op_type == "ConstantOfShape" and n.input and n.input[0] in init_arrays:
            dims = numpy_helper.to_array(init_arrays[n.input[0]]).astype(np.int64).tolist()
            fill = numpy_helper.to_array(value).reshape(-1)[0] if value is not None else np.float32(0)
            if value is None or value.data_type not in float_types or math.prod(dims) < 16:
                continue
            j = jitter(np.full(dims, fill, dtype=fill.dtype))
        elif n.op_type == "Constant" and value is not None and value.data_type in float_types:
            j = jitter(numpy_helper.to_array(value))
        else:
            continue
        if j is not None:
            new_nodes[i] = onnx.helper.make_node(
                "Constant", [], list(n.output), name=n.name, value=numpy_helper.from_array(j)
            )
    if not new_inits and not new_nodes:
        return None
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for i, t in new_inits.items():
        copy.graph.initializer[i].CopyFrom(t)
    for i, n in new_nodes.items():
        copy.graph.node[i].CopyFrom(n)
    return copy


# ---- attribution


@dataclass
class _Attribution:
    node_seconds: dict[str, float]
    regions: tuple[tuple[str, ...], ...]
    exact_fraction: float
    notes: list[str]


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:
            self.parent[i], i = root, self.parent[i]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _attribute(view: ModelView, timing: _Timing, matched: _Matched) -> _Attribution:
    """Join both graphs into regions and spread each region's measured time over its original nodes."""
    o_nodes = view.nodes
    p_nodes = list(matched.optimized.graph.node)
    n_o = len(o_nodes)
    uf = _UnionFind(n_o + len(p_nodes))
    anchors = matched.anchors
    anchored_o = set(anchors.values()) | matched.duplicates
    constant = matched.constant

    # original side: join across tensors the optimized graph does not hold
    for tensor, prod in view.producer.items():
        if tensor in anchored_o or tensor in constant:
            continue
        for c in view.consumers.get(tensor, ()):
            uf.union(prod, c)
    # optimized side: join across tensors the original graph does not hold
    p_inits = {t.name for t in matched.optimized.graph.initializer}
    p_producer: dict[str, int] = {}
    p_consumers: dict[str, list[int]] = {}
    for j, n in enumerate(p_nodes):
        for out in n.output:
            if out:
                p_producer[out] = j
        for read in dict.fromkeys(_reads(n)):
            p_consumers.setdefault(read, []).append(j)
    for tensor, j in p_producer.items():
        if tensor in anchors or tensor in p_inits:
            continue
        for c in p_consumers.get(tensor, ()):
            uf.union(n_o + j, n_o + c)
    # anchors: the two producers of one value are the same computation's ends
    for p_t, o_t in anchors.items():
        if p_t in p_producer and o_t in view.producer:
            uf.union(view.producer[o_t], n_o + p_producer[p_t])

    members: dict[int, list[int]] = {}
    for i in range(n_o + len(p_nodes)):
        members.setdefault(uf.find(i), []).append(i)

    seconds = {n.name: 0.0 for n in o_nodes if not n.is_constant}
    comp_time: dict[int, float] = {}
    for j, n in enumerate(p_nodes):
        s = timing.node_seconds.get(n.name, 0.0)
        if s:
            root = uf.find(n_o + j)
            comp_time[root] = comp_time.get(root, 0.0) + s

    def compute_members(root: int) -> list[int]:
        return [i for i in members[root] if i < n_o and not o_nodes[i].is_constant]

    def p_names(root: int) -> list[str]:
        return [p_nodes[i - n_o].name for i in members[root] if i >= n_o]

    notes: list[str] = []
    fused: list[str] = []
    fused_sizes: list[int] = []
    fused_time = 0.0
    flopless: list[str] = []
    flopless_time = 0.0
    exact = 0.0
    total = sum(comp_time.values())
    orphan_time: dict[int, float] = {}
    for root, t in comp_time.items():
        targets = compute_members(root)
        if not targets:
            orphan_time[root] = t
            continue
        how = _spread(view, targets, t, matched.shapes, seconds)
        if len(targets) == 1:
            exact += t
        elif how == "FLOPs":
            fused.extend(p_names(root))
            fused_time += t
            fused_sizes.append(len(targets))
        else:
            flopless.extend(p_names(root))
            flopless_time += t
    if flopless:
        notes.insert(
            0,
            f"{len(flopless)} optimized node(s) ({_short(flopless, 6)}) each ran a group of original nodes "
            f"without FLOPs (shape and data movement): their {flopless_time * 1e3:.3f} ms were split by "
            "output elements; the groups are listed in regions",
        )
    if fused:
        share = f" ({fused_time / total:.0%} of the time)" if total > 0 else ""
        notes.insert(
            0,
            f"{len(fused_sizes)} fused group(s) of {min(fused_sizes)}-{max(fused_sizes)} original nodes, "
            f"run as {len(fused)} optimized node(s) ({_short(fused, 6)}): their {fused_time * 1e3:.3f} ms"
            f"{share} were split by FLOPs; the groups are listed in regions",
        )
    orphan_notes: list[str] = []
    for root, t in orphan_time.items():
        near = _neighbour_regions(root, uf, members, n_o, p_nodes, p_producer, p_consumers, anchors, view)
        near = [r for r in near if compute_members(r)]
        if near:
            for r in near:
                _spread(view, compute_members(r), t / len(near), matched.shapes, seconds)
            receivers = [o_nodes[i].name for r in near for i in compute_members(r)]
        else:
            everyone = [i for i in range(n_o) if not o_nodes[i].is_constant]
            if everyone:
                _spread(view, everyone, t, matched.shapes, seconds)
            receivers = ["every node"]
        orphan_notes.append(
            f"{_short(p_names(root))}: work no original node does (a layout change or copy); its "
            f"{t * 1e3:.3f} ms went to the neighbouring node(s) {_short(receivers)}"
        )
    if len(orphan_notes) <= 5:
        notes.extend(orphan_notes)
    else:
        names = [n for root in orphan_time for n in p_names(root)]
        notes.append(
            f"{len(names)} optimized node(s) ({_short(names, 6)}) compute values no original node holds "
            f"(layout changes, reorders): their {sum(orphan_time.values()) * 1e3:.3f} ms went to the "
            "neighbouring original nodes"
        )
    if timing.foreign_seconds > 0:
        notes.append(
            f"{len(timing.foreign_names)} profiler event(s) for nodes outside the optimized main graph "
            f"({_short(timing.foreign_names)}, inside subgraphs): their time is part of their parent's"
        )
    if total == 0 and timing.total_seconds > 0 and seconds:
        notes.append("onnxruntime reported no kernel time; every node time is 0 (the model does nothing)")
    folded = [n.name for n in o_nodes if not n.is_constant and seconds[n.name] == 0.0]
    if folded and total > 0:
        notes.append(
            f"{len(folded)} original node(s) run inside no measured kernel (folded or removed by the "
            f"optimizer) and cost 0: {_short(folded)}"
        )
    regions = []
    for root in sorted(members):
        targets = compute_members(root)
        if len(targets) >= 2:
            regions.append(tuple(o_nodes[i].name for i in sorted(targets)))
    position = {n.name: n.position for n in o_nodes}
    regions.sort(key=lambda r: position[r[0]])
    return _Attribution(
        node_seconds=seconds,
        regions=tuple(regions),
        exact_fraction=exact / total if total > 0 else 1.0,
        notes=notes,
    )


def _spread(
    view: ModelView,
    targets: Sequence[int],
    t: float,
    shapes: Mapping[str, tuple[int, ...]],
    out: dict[str, float],
) -> str:
    """Add ``t`` seconds to the nodes at ``targets`` in proportion to FLOPs (else output elements)."""
    nodes = [view.nodes[i] for i in targets]
    if len(nodes) == 1:
        out[nodes[0].name] += t
        return "nothing"
    weights = [node_flops(view, n, shapes) for n in nodes]
    how = "FLOPs"
    if sum(weights) <= 0:
        weights = [float(sum(math.prod(shapes.get(o, ())) for o in n.outputs if o in shapes)) for n in nodes]
        how = "output elements"
    if sum(weights) <= 0:
        weights = [1.0] * len(nodes)
        how = "equal shares"
    total = sum(weights)
    for n, w in zip(nodes, weights, strict=True):
        out[n.name] += t * w / total
    return how


def _neighbour_regions(
    root: int,
    uf: _UnionFind,
    members: Mapping[int, list[int]],
    n_o: int,
    p_nodes: Sequence[onnx.NodeProto],
    p_producer: Mapping[str, int],
    p_consumers: Mapping[str, list[int]],
    anchors: Mapping[str, str],
    view: ModelView,
) -> list[int]:
    """Regions that feed or read the region ``root`` (breadth first through regions without original
    compute nodes, until some are found)."""
    seen = {root}
    frontier = [root]
    while frontier:
        found: list[int] = []
        nxt: list[int] = []
        for r in frontier:
            for i in members[r]:
                if i < n_o:
                    tensors = list(view.nodes[i].reads) + list(view.nodes[i].outputs)
                    near = [view.producer[t] for t in tensors if t in view.producer]
                    near += [c for t in view.nodes[i].outputs for c in view.consumers.get(t, ())]
                else:
                    n = p_nodes[i - n_o]
                    near = [n_o + p_producer[t] for t in n.input if t in p_producer]
                    near += [n_o + c for t in n.output for c in p_consumers.get(t, ())]
                    for t in list(n.input) + list(n.output):
                        o_t = anchors.get(t)
                        if o_t is not None:
                            if o_t in view.producer:
                                near.append(view.producer[o_t])
                            near += list(view.consumers.get(o_t, ()))
                for k in near:
                    rk = uf.find(k)
                    if rk in seen:
                        continue
                    seen.add(rk)
                    has_compute = any(m < n_o and not view.nodes[m].is_constant for m in members[rk])
                    (found if has_compute else nxt).append(rk)
        if found:
            return sorted(found)
        frontier = nxt
    return []


def _short(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
