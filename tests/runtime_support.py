"""Helpers shared by the runtime tests: small models and their splits, micro-batches, output checks.

The ``tiny_split`` and ``reshape_split`` fixtures built from these live in ``conftest.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from dataclasses import dataclass, field
from multiprocessing import active_children
from pathlib import Path
from typing import cast

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxpipe import api
from onnxpipe.api import PlanRequest, ProfileOptions, SplitOptions
from onnxpipe.cli.parsers import RUN
from onnxpipe.cluster.devicesfile import load_cluster
from onnxpipe.core.errors import RuntimeStageError
from onnxpipe.manifest import Manifest, StageEntry
from onnxpipe.runtime.backends.shm import SHM_DIR
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.report.measure import Measurement
from onnxpipe.runtime.session import Record, WorkerStats
from onnxpipe.runtime.spec import CPU_PROVIDER, Placement, WorkerSpec
from onnxpipe.verification.compare import compare

MODES = ["processes", "threads"]


# --------------------------------------------------------------------------------------------------
# models and splits


def reshape_model() -> onnx.ModelProto:
    """x[N,8] -> three MatMul/Relu -> Reshape(., shape) -> y: a bad ``shape`` fails the last stage."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), f"w{i}") for i in range(3)
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["a"], name="mm0"),
        helper.make_node("Relu", ["a"], ["b"], name="relu0"),
        helper.make_node("MatMul", ["b", "w1"], ["c"], name="mm1"),
        helper.make_node("Relu", ["c"], ["d"], name="relu1"),
        helper.make_node("MatMul", ["d", "w2"], ["e"], name="mm2"),
        helper.make_node("Reshape", ["e", "shape"], ["y"], name="reshape"),
    ]
    graph = helper.make_graph(
        nodes,
        "reshape_model",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["p", "q"])],
        initializer=weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def split_tiny(base: Path, sample_models_dir: Path) -> Path:
    """The sample transformer split in 2 (static costs)."""
    out = base / "split"
    api.split(
        sample_models_dir / "transformer_tiny.onnx",
        SplitOptions(out=out, plan=PlanRequest(2), profile=ProfileOptions(cost="static"), verify=False),
    )
    return out


def split_reshape(base: Path) -> Path:
    """:func:`reshape_model` split in 2: the Reshape lands in the last stage."""
    path = base / "reshape.onnx"
    onnx.save_model(reshape_model(), str(path))
    out = base / "split"
    api.split(
        path,
        SplitOptions(
            out=out,
            plan=PlanRequest(2),
            profile=ProfileOptions(cost="static", shapes={"x": (4, 8), "shape": (2,)}),
            verify=False,
        ),
    )
    return out


def token_batches(count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"tokens": rng.integers(0, 256, (2, 16)).astype(np.int64)} for _ in range(count)]


def reshape_batches(count: int, bad: int | None = None) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    out: list[dict[str, np.ndarray]] = []
    for j in range(count):
        shape = np.array([3, 5] if j == bad else [8, 4], dtype=np.int64)
        out.append({"x": rng.standard_normal((4, 8)).astype(np.float32), "shape": shape})
    return out


def original_outputs(model: Path, batches: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(names, b), strict=True)) for b in batches]


def assert_same(expected: list[dict[str, np.ndarray]], actual: list[dict[str, np.ndarray]]) -> None:
    assert len(expected) == len(actual)
    for j, (e, a) in enumerate(zip(expected, actual, strict=True)):
        assert set(e) == set(a), j
        for name in e:
            c = compare(name, e[name], a[name], rtol=1e-4, atol=1e-5)
            assert c.ok, f"micro-batch {j}: {c.describe()}"


def stream_until_failure(
    pipeline: Pipeline, batches: list[dict[str, np.ndarray]]
) -> tuple[list[dict[str, np.ndarray]], str]:
    """Stream ``batches`` until the pipeline fails (within 30 s): what came out first, and the error."""
    got: list[dict[str, np.ndarray]] = []
    start = time.monotonic()
    try:
        for out in pipeline.stream(batches):
            got.append(out)
    except RuntimeStageError as e:
        assert time.monotonic() - start < 30
        return got, str(e)
    raise AssertionError("the pipeline did not fail")


def segments(pipeline: Pipeline) -> list[str]:
    prefix = getattr(pipeline.backend, "prefix", f"onnxpipe-{os.getpid()}-")
    return sorted(p.name for p in SHM_DIR.glob(prefix + "*"))


def assert_no_workers_left(pids: list[int], pipeline: Pipeline) -> None:
    alive = {p.pid for p in active_children()}
    for pid in pids:
        assert pid not in alive
        assert not Path(f"/proc/{pid}").exists(), f"worker {pid} is still there"
    assert segments(pipeline) == []
    assert not [t for t in threading.enumerate() if t.name.startswith("onnxpipe")]


# --------------------------------------------------------------------------------------------------
# the command and devices files


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="onnxpipe run")
    RUN.add_arguments(parser)
    return parser.parse_args(list(argv))


def devices_file(path: Path, *devices: tuple[str, str, int]) -> Path:
    """A devices file of ``(name, provider, threads)`` devices on free links."""
    path.write_text(
        json.dumps(
            {
                "devices": [
                    {"name": n, "provider": p, "threads": t, "memory_bytes": None} for n, p, t in devices
                ],
                "links": {"bandwidth_bytes_per_s": None, "latency_s": 0},
            }
        )
    )
    return path


def split_on_devices(tmp_path: Path, sample_models_dir: Path, *devices: tuple[str, str, int]) -> Path:
    out = tmp_path / "split"
    devices_path = devices_file(tmp_path / "devices.json", *devices)
    api.split(
        sample_models_dir / "transformer_tiny.onnx",
        SplitOptions(
            out=out,
            plan=PlanRequest(len(devices), devices=load_cluster(devices_path)),
            profile=ProfileOptions(cost="static"),
            verify=False,
        ),
    )
    return out


# --------------------------------------------------------------------------------------------------
# fakes for the report's logic: a pipeline's stats and timings without running anything

CPU = CPU_PROVIDER


@dataclass
class FakeBackend:
    kind: str


@dataclass
class FakePipeline:
    """What build_report and the baselines read of a pipeline: its lanes, backend kind and manifest."""

    lanes: tuple[tuple[WorkerSpec, ...], ...]
    backend: FakeBackend
    manifest: Manifest | None = None
    capacity: int = 6
    input_types: dict[str, str] = field(default_factory=dict)
    output_names: tuple[str, ...] = ()
    pin_note: str | None = None


def spec(index: int, placement: Placement | None = None, stage: StageEntry | None = None) -> WorkerSpec:
    placement = placement or Placement()
    return WorkerSpec(index, f"stage {index}", f"stage_{index}.onnx", (), (), (), (), placement, stage)


def entry(index: int, estimated_ms: float, param_bytes: int = 0, device: str = "cpu") -> StageEntry:
    """The manifest's record of stage ``index``: only its estimate, weights and device matter to a
    report."""
    return StageEntry(
        index,
        f"stage_{index}.onnx",
        "0" * 64,
        None,
        None,
        1,
        0,
        device,
        (),
        (),
        estimated_ms / 1e3,
        0.0,
        param_bytes,
        0,
    )


def records(done: list[float], run_s: float = 0.01) -> tuple[Record, ...]:
    """One record per entry of ``done`` (the worker's own clock), each run taking ``run_s``."""
    return tuple(Record(j, t - 2 * run_s, t - 2 * run_s, t - run_s, t - run_s, t) for j, t in enumerate(done))


def stats(
    index: int, done: list[float], *, shared: bool = False, peak: int = 100, startup: int = 60
) -> WorkerStats:
    return WorkerStats(
        index=index,
        label=f"stage {index}",
        records=records(done),
        pid=1000 + index,
        load_seconds=0.1,
        startup_rss_bytes=startup,
        rss_bytes=peak,
        peak_rss_bytes=peak,
        process_shared=shared,
        load_rss_bytes=7,
    )


def measurement(
    n: int,
    worker_stats: tuple[WorkerStats, ...],
    *,
    driver_done: list[float] | None = None,
    output_workers: tuple[int, ...] = (1,),
    single: tuple[float, ...] = (),
) -> Measurement:
    done = driver_done if driver_done is not None else [float(j) for j in range(n)]
    return Measurement(
        queued_at=tuple(0.0 for _ in range(n)),
        done_at=tuple(done),
        start=0.0,
        end=max(done),
        stats=worker_stats,
        in_flight=6,
        output_workers=output_workers,
        single_latencies_s=single,
    )


def as_pipeline(fake: FakePipeline) -> Pipeline:
    return cast(Pipeline, fake)


# --------------------------------------------------------------------------------------------------
# steady throughput: the last worker's clock, not the driver's polls
