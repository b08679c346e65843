"""An interleaved split's workers: one process per worker hosting all its stages, or its stages' threads
taking turns.

A worker of ``split --stages 4 --workers 2`` runs stages 0 and 2 (or 1 and 3) in one process, so that it
pays for one interpreter and one onnxruntime instead of one per stage.  Its stages feed each other across
the two workers (0 -> 1 -> 2 -> 3), so a process that waited on one stage's full channel while another of
its stages had work would stall the whole pipeline: these tests run such chains with one slot per channel
and many micro-batches, check the outputs in order, a failure in a hosted stage, the memory report, and
that a worker never runs two of its sessions at once, in processes or threads (one loop, :class:`Host
<onnxpipe.runtime.backends.lanes.Host>`, runs a worker's stages in both).
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from runtime_support import (
    assert_no_workers_left,
    assert_same,
    entry,
    original_outputs,
    reshape_batches,
    reshape_model,
    spec,
    stream_until_failure,
    token_batches,
)

from onnxpipe import api
from onnxpipe.api import PlanRequest, ProfileOptions, SplitOptions
from onnxpipe.core.errors import RuntimeStageError
from onnxpipe.cost.profile import corrected
from onnxpipe.cost.static import static_profile
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import load_manifest
from onnxpipe.planning.workers import make_plan
from onnxpipe.runtime.backends.lanes import Host, Hosted
from onnxpipe.runtime.base import LocalConfig
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.report.baselines import stage_worker_memory
from onnxpipe.runtime.report.model import StageReport, WorkerReport
from onnxpipe.runtime.session import Record, WorkerStats
from onnxpipe.schedule.timeline import worker_groups


@pytest.fixture(scope="module")
def six_on_two(tmp_path_factory: pytest.TempPathFactory, sample_models_dir: Path) -> Path:
    """The sample MLP in 6 stages on 2 workers: each process hosts 3 stages."""
    out = tmp_path_factory.mktemp("hosted") / "split"
    api.split(
        sample_models_dir / "mlp.onnx",
        SplitOptions(
            out=out, plan=PlanRequest(6, workers=2), profile=ProfileOptions(cost="static"), verify=False
        ),
    )
    return out


def mlp_batches(count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((4, 64)).astype(np.float32)} for _ in range(count)]


@pytest.fixture(scope="module")
def reshape_on_two(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Reshape model in 4 stages on 2 workers: the failing Reshape is in stage 3, hosted with stage 1."""
    base = tmp_path_factory.mktemp("hosted-reshape")
    path = base / "reshape.onnx"
    onnx.save_model(reshape_model(), str(path))
    out = base / "split"
    api.split(
        path,
        SplitOptions(
            out=out,
            plan=PlanRequest(4, workers=2),
            profile=ProfileOptions(cost="static", shapes={"x": (4, 8), "shape": (2,)}),
            verify=False,
        ),
    )
    return out


def test_hosts_group_a_workers_stages_in_order() -> None:
    assert worker_groups(range(3)) == [(0,), (1,), (2,)]
    assert worker_groups([0, 1, 0, 1]) == [(0, 2), (1, 3)]
    assert worker_groups([1, 0, 1, 0, 1, 0]) == [(0, 2, 4), (1, 3, 5)]
    assert worker_groups([0, 0]) == [(0, 1)]


@pytest.mark.parametrize("slots", [1, 2])
def test_one_process_per_worker_equals_the_model(
    six_on_two: Path, sample_models_dir: Path, slots: int
) -> None:
    batches = mlp_batches(40, seed=9)
    expected = original_outputs(sample_models_dir / "mlp.onnx", batches)
    with Pipeline.from_manifest(six_on_two, LocalConfig(mode="processes", slots=slots)) as pipe:
        pids = pipe.worker_pids()
        actual = list(pipe.stream(batches))
        stats = pipe.stats()
    assert_same(expected, actual)
    # stages 0, 2, 4 in one process, 1, 3, 5 in another
    assert len(set(pids)) == 2 and pids[0::2] == [pids[0]] * 3 and pids[1::2] == [pids[1]] * 3
    assert [st.index for st in stats] == list(range(6))
    for st in stats:
        assert st.hosted_with == ((0, 2, 4) if st.index % 2 == 0 else (1, 3, 5))
        assert st.pid == pids[st.index]
        assert sorted(r.seq for r in st.records) == list(range(40))  # every micro-batch, each once
    assert_no_workers_left(pids, pipe)


def test_a_worker_hosting_every_stage(sample_models_dir: Path, tmp_path: Path) -> None:
    """One worker: consecutive stages in one process, each feeding the next through its own channel."""
    out = tmp_path / "split"
    api.split(
        sample_models_dir / "transformer_tiny.onnx",
        SplitOptions(
            out=out, plan=PlanRequest(3, workers=1), profile=ProfileOptions(cost="static"), verify=False
        ),
    )
    batches = token_batches(12, seed=3)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    with Pipeline.from_manifest(out, LocalConfig(mode="processes", slots=1)) as pipe:
        assert len(set(pipe.worker_pids())) == 1
        assert_same(expected, pipe.run_many(batches))


def test_a_failing_hosted_stage_stops_the_pipeline(reshape_on_two: Path) -> None:
    batches = reshape_batches(30, bad=7)
    pipe = Pipeline.from_manifest(reshape_on_two, LocalConfig(mode="processes"))
    pids = pipe.worker_pids()
    assert pids[1] == pids[3] != pids[0]
    got, text = stream_until_failure(pipe, batches)
    assert "stage 3 (stage_3.onnx)" in text and "micro-batch 7" in text and "'reshape'" in text
    assert len(got) <= 7
    pipe.close()
    assert_no_workers_left(pids, pipe)


def test_a_hosting_process_killed_is_reported(six_on_two: Path) -> None:
    pipe = Pipeline.from_manifest(six_on_two, LocalConfig(mode="processes"))
    pids = pipe.worker_pids()
    pipe.run(mlp_batches(1)[0])
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(RuntimeStageError, match=r"stage 1 .*stage 3 .*stage 5 .*killed by SIGKILL"):
        pipe.run_many(mlp_batches(8))
    pipe.close()
    assert_no_workers_left(pids, pipe)


def _stage(index: int, model: int, hosted_with: tuple[int, ...]) -> StageReport:
    measured = WorkerStats(index, f"stage {index}", (), None, 0.0, None, None, None, process_shared=True)
    alone = replace(
        measured, process_shared=False, peak_rss_bytes=model, startup_rss_bytes=0, hosted_with=hosted_with
    )
    return StageReport(
        worker=spec(index, stage=entry(index, 1.0, param_bytes=10)),
        stats=measured,
        microbatches=1,
        measured_ms=1.0,
        mean_ms=1.0,
        handling_ms=1.0,
        busy_seconds=1.0,
        busy_fraction=0.5,
        alone=alone,
    )


def test_a_worker_process_memory_counts_once() -> None:
    hosted = WorkerReport.of(0, [_stage(0, 100, (0, 2)), _stage(2, 100, (0, 2))], 2.0)
    apart = WorkerReport.of(0, [_stage(0, 30, ()), _stage(2, 70, ())], 2.0)
    assert hosted.model_rss_bytes == 100 and apart.model_rss_bytes == 100
    assert hosted.param_bytes == apart.param_bytes == 20


def test_compare_measures_a_worker_in_one_process(six_on_two: Path) -> None:
    batches = mlp_batches(4)
    with Pipeline.from_manifest(six_on_two, LocalConfig(mode="threads")) as pipe:
        stats = stage_worker_memory(pipe, batches)
    assert stats is not None
    assert len({st.pid for st in stats}) == 2
    by_worker = {st.hosted_with for st in stats}
    assert by_worker == {(0, 2, 4), (1, 3, 5)}
    assert all(np.isfinite(st.model_rss_bytes or np.nan) for st in stats)


# --------------------------------------------------------------------------------------------------
# one session at a time per worker, in processes and in threads


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_a_workers_stages_never_run_at_once(six_on_two: Path, sample_models_dir: Path, mode: str) -> None:
    batches = mlp_batches(30, seed=4)
    expected = original_outputs(sample_models_dir / "mlp.onnx", batches)
    with Pipeline.from_manifest(six_on_two, LocalConfig(mode=mode)) as pipe:  # type: ignore[arg-type]
        actual = list(pipe.stream(batches))
        stats = pipe.stats()
    assert_same(expected, actual)
    for worker in (0, 1):
        runs = sorted((r.run_start, r.run_end) for st in stats if st.index % 2 == worker for r in st.records)
        assert len(runs) == 3 * 30
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(runs)), f"worker {worker} ran two at once"


class _Box:
    """A channel for :class:`Host`: a list of micro-batches in, ``room`` places out."""

    def __init__(self, items: Sequence[int] = (), room: int = 9) -> None:
        self.items = list(items)
        self.room = room
        self.sent: list[int] = []

    def pending(self) -> bool:
        return bool(self.items)

    def take(self) -> tuple[int, dict[str, np.ndarray], int]:
        return self.items.pop(0), {}, 0

    def release(self, slot: int) -> None:
        pass

    def has_room(self) -> bool:
        return len(self.sent) < self.room

    def send(self, seq: int, tensors: Mapping[str, np.ndarray]) -> None:
        self.sent.append(seq)


class _Runner:
    """A stage that records the order its micro-batches ran in."""

    def __init__(self, index: int, ran: list[tuple[int, int]]) -> None:
        self.spec = spec(index)
        self.records: deque[Record] = deque()
        self.ran = ran

    def run(self, seq: int, received: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.ran.append((self.spec.index, seq))
        return {}


def _host(*stages: tuple[int, _Box, _Box], ran: list[tuple[int, int]]) -> Host[_Box, _Box]:
    return Host([Hosted(_Runner(i, ran), inbox, outbox) for i, inbox, outbox in stages])  # type: ignore[arg-type]


def test_a_host_runs_its_deepest_stage_with_work_first() -> None:
    ran: list[tuple[int, int]] = []
    host = _host((0, _Box([10, 11]), _Box()), (2, _Box([20]), _Box()), (4, _Box([40]), _Box()), ran=ran)
    while host.one_pass():
        pass
    assert ran == [(4, 40), (2, 20), (0, 10), (0, 11)]


def test_a_held_result_lets_the_workers_other_stages_run() -> None:
    """Stage 2's channel is full: its result is held, stage 0 runs on, and the result goes once there
    is room (its record then written)."""
    ran: list[tuple[int, int]] = []
    full = _Box(room=0)
    host = _host((0, _Box([10, 11]), _Box()), (2, _Box([20, 21]), full), ran=ran)
    while host.one_pass():
        pass
    assert ran == [(2, 20), (0, 10), (0, 11)] and host.hosted[1].held is not None
    full.room = 2
    while host.one_pass():
        pass
    assert full.sent == [20, 21] and ran[-1] == (2, 21)
    assert [r.seq for r in host.hosted[1].runner.records] == [20, 21]


def _matmul_chain(path: Path, layers: int = 8, width: int = 512) -> Path:
    """x[64, width] through ``layers`` MatMul + Relu: a few ms per stage, so a stream lasts seconds."""
    rng = np.random.default_rng(0)
    nodes, weights, prev = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
            helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        prev = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, width])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [64, width])],
        initializer=weights,
    )
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_stats_are_answered_while_the_first_stage_always_has_work(tmp_path: Path) -> None:
    """A worker process reads its control pipe on every pass, not only once it runs dry: ``stats()`` from
    another thread while the stream flows answers at once.  The split gives the first stage nearly all
    the work (a profile that makes the later nodes look 1000x dearer), so that worker always has input and
    room downstream, and deep channels keep it so for seconds."""
    model = _matmul_chain(tmp_path / "chain.onnx")
    view = load_model(model)
    profile = static_profile(view)
    profile = corrected(profile, [s.node_names for s in make_plan(view, profile, 2).stages], (1.0, 1000.0))
    out = tmp_path / "split"
    api.split(
        model, SplitOptions(out=out, plan=PlanRequest(2), profile=ProfileOptions(saved=profile), verify=False)
    )
    first, second = load_manifest(out).stages
    assert first.node_count >= 2 * second.node_count  # the first stage is the slow one
    x = {"x": np.ones((64, 512), dtype=np.float32)}
    with Pipeline.from_manifest(out, LocalConfig(mode="processes", slots=64)) as pipe:
        jobs = [pipe.submit(x) for _ in range(2000)]
        jobs[4].result(timeout=60)  # flowing
        start = time.monotonic()
        stats = pipe.stats()
        took = time.monotonic() - start
        pending = sum(not j.done() for j in jobs)
        pipe.close(graceful=False)
    assert len(stats) == 2
    assert took < 2.0, f"stats() took {took:.2f} s while the first worker was busy"
    assert pending > 0, "the stream ended before stats() was answered: make it longer"
