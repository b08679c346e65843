"""The Ray backend on a local two-CPU cluster: same outputs, same order, same failure behaviour."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from paths import SAMPLE_MODELS
from runtime_support import (
    assert_same,
    original_outputs,
    parse,
    reshape_batches,
    token_batches,
)

from onnxpipe.api import PlanRequest, ProfileOptions, SplitOptions, split
from onnxpipe.core.errors import RuntimeStageError, UsageError
from onnxpipe.runtime.backends import ray_backend, ray_resources
from onnxpipe.runtime.backends.ray_backend import RayBackend
from onnxpipe.runtime.base import RayConfig
from onnxpipe.runtime.generation.generator import Generator
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.schedule.timeline import worker_groups

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


def wait_gone(pids: list[int], timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if Path(f"/proc/{p}").exists() and _not_zombie(p)]
        time.sleep(0.1)
    return alive


def _not_zombie(pid: int) -> bool:
    try:
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1][:4]
    except OSError:
        return False


def test_ray_stream_equals_the_model_in_order(
    ray_cluster: Any,
    tiny_split: Path,
    sample_models_dir: Path,
) -> None:
    batches = token_batches(40, seed=2)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    with Pipeline.from_manifest(tiny_split, RayConfig()) as pipe:
        assert pipe.backend.kind == "ray"
        actual = list(pipe.stream(batches))
        stats = pipe.stats()
    assert_same(expected, actual)
    assert [len(s.records) for s in stats] == [40, 40]


def test_ray_failing_stage_stops_the_pipeline_and_its_actors(
    ray_cluster: Any,
    reshape_split: Path,
) -> None:
    pipe = Pipeline.from_manifest(reshape_split, RayConfig())
    actors = list(pipe.backend.actors)  # type: ignore[attr-defined]
    pids = [place.pid for place in pipe.backend.placed]  # type: ignore[attr-defined]
    got = []
    with pytest.raises(RuntimeStageError) as info:
        for out in pipe.stream(reshape_batches(20, bad=5)):
            got.append(out)
    text = str(info.value)
    assert "stage 1 (stage_1.onnx) failed on micro-batch 5" in text
    assert "'reshape'" in text and "'y'" in text
    assert len(got) <= 5
    pipe.close()
    # ray.kill is asynchronous: wait for the actors' processes to go, then no actor may answer
    assert wait_gone(pids) == []
    for actor in actors:
        with pytest.raises(ray_cluster.exceptions.RayActorError):
            ray_cluster.get(actor.node.remote(), timeout=30)


HALF_CPU = [{"num_cpus": 0.5}, {"num_cpus": 0.5}]  # two pipelines of two stages on the two-CPU cluster


@pytest.mark.exhaustive
def test_closing_one_ray_pipeline_leaves_the_others_and_the_callers_ray(
    ray_cluster: Any,
    tiny_split: Path,
    sample_models_dir: Path,
) -> None:
    batches = token_batches(6, seed=4)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    first = Pipeline.from_manifest(tiny_split, RayConfig(resources=HALF_CPU))
    try:
        with Pipeline.from_manifest(tiny_split, RayConfig(resources=HALF_CPU)) as second:
            first.close()
            assert_same(expected, list(second.stream(batches)))
    finally:
        first.close()
    assert ray_cluster.is_initialized()  # the caller started it: only the caller shuts it down


def test_ctrl_c_while_actors_start_kills_those_started(
    ray_cluster: Any,
    tiny_split: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    options = ray_resources.actor_options
    stages: list[int] = []

    def options_then_ctrl_c(spec: Any, given: Any) -> dict[str, Any]:
        stages.append(spec.index)
        if len(stages) == 2:
            raise KeyboardInterrupt
        return options(spec, given)

    closed = RayBackend.close
    started: list[Any] = []

    def close(self: RayBackend, graceful: bool = True) -> None:
        started.extend(self.actors)
        closed(self, graceful)

    monkeypatch.setattr(ray_backend, "actor_options", options_then_ctrl_c)
    monkeypatch.setattr(RayBackend, "close", close)
    with pytest.raises(KeyboardInterrupt):
        Pipeline.from_manifest(tiny_split, RayConfig())
    assert len(started) == 1, "the actor of stage 0 was left running"
    with pytest.raises(ray_cluster.exceptions.RayActorError):
        ray_cluster.get(started[0].node.remote(), timeout=30)


def test_ray_cli_run(ray_cluster: Any, tiny_split: Path, tmp_path: Path) -> None:
    from onnxpipe.cli import run as run_command

    report = tmp_path / "report.json"
    assert run_command(parse(str(tiny_split), "--backend", "ray", "-m", "8", "--report", str(report))) == 0
    import json

    obj = json.loads(report.read_text())
    assert obj["backend"] == "ray" and obj["microbatches"] == 8
    assert all(s["measured_ms"] > 0 and s["peak_rss_bytes"] > 0 for s in obj["stages"])
    assert np.isfinite(obj["throughput_per_s"])


def test_ray_runs_an_interleaved_split_with_one_actor_per_worker(
    ray_cluster: Any, tmp_path: Path, sample_models_dir: Path
) -> None:
    """4 stages on 2 workers: each worker's 2 stages share one actor (one process, one CPU), so they fit
    the 2-CPU cluster (an actor per stage asking 1 CPU each, 4 in all, would never start) and the
    outputs are the model's, in order."""
    from onnxpipe import api
    from onnxpipe.manifest import load_manifest

    split = tmp_path / "interleaved"
    api.split(
        sample_models_dir / "transformer_tiny.onnx",
        SplitOptions(
            out=split, plan=PlanRequest(4, workers=2), profile=ProfileOptions(cost="static"), verify=False
        ),
    )
    worker_of = [load_manifest(split).worker_of(i) for i in range(4)]
    assert sorted(set(worker_of)) == [0, 1] and worker_of[0] != worker_of[1]
    batches = token_batches(24, seed=4)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    with Pipeline.from_manifest(split, RayConfig()) as pipe:
        backend = pipe.backend
        assert isinstance(backend, RayBackend) and len(backend.actors) == 2
        assert_same(expected, list(pipe.stream(batches)))
        stats = pipe.stats()
        pids = [place.pid for place in backend.placed]
    for i in range(4):
        mates = tuple(j for j in range(4) if worker_of[j] == worker_of[i])
        assert stats[i].index == i and stats[i].hosted_with == mates
        assert {pids[j] for j in mates} == {pids[i]} and stats[i].pid == pids[i]
        assert len(stats[i].records) == 24
    assert pids[0] != pids[1]
    assert wait_gone(sorted(set(pids))) == []


def test_a_ray_actor_hosting_stages_asks_for_the_most_any_of_them_asks() -> None:
    merged = ray_resources.merged_options(
        [
            {"num_cpus": 1, "num_gpus": 0, "resources": {"a": 1}, "max_concurrency": 1},
            {"num_cpus": 2, "num_gpus": 0.5, "memory": 10, "resources": {"a": 0.5, "b": 1}},
        ]
    )
    assert merged == {
        "num_cpus": 2,
        "num_gpus": 0.5,
        "memory": 10,
        "resources": {"a": 1, "b": 1},
        "max_concurrency": 1,
    }
    assert worker_groups([1, 0, 1, 0]) == [(0, 2), (1, 3)]
    assert worker_groups(range(3)) == [(0,), (1,), (2,)]


def test_actors_that_cannot_be_placed_fail_naming_what_each_asked_for(
    ray_cluster: Any, tiny_split: Path
) -> None:
    """One actor hosting both stages (as for one worker of an interleaved split) asks for the most of
    each resource its stages ask for; no node has ``nowhere``, so it never starts."""
    from onnxpipe.manifest import load_manifest
    from onnxpipe.runtime.spec import manifest_placements, stage_specs

    manifest = load_manifest(tiny_split)
    specs = stage_specs(tiny_split, manifest, manifest_placements(manifest, None))
    asks = [{"resources": {"nowhere": 1}}, {"num_cpus": 0.5, "resources": {"nowhere": 0.5}}]
    with pytest.raises(RuntimeStageError) as info:
        RayBackend([specs], RayConfig(resources=asks), workers=[0, 0], start_timeout=3.0)
    assert "did not start within 3 s" in str(info.value)
    assert "stages 0, 1: {'num_cpus': 1, 'num_gpus': 0, 'resources': {'nowhere': 1}}" in str(info.value)


def test_a_worker_s_stages_asking_for_different_machines_are_refused(tiny_split: Path) -> None:
    from onnxpipe.manifest import load_manifest
    from onnxpipe.runtime.spec import manifest_placements, stage_specs

    manifest = load_manifest(tiny_split)
    specs = stage_specs(tiny_split, manifest, manifest_placements(manifest, None))
    asks = [{"resources": {"host_a": 1}}, {"resources": {"host_b": 1}}]
    with pytest.raises(UsageError, match=r"stages 0 and 1 share one worker .*\['host_a'\] and \['host_b'\]"):
        RayBackend([specs], RayConfig(resources=asks), workers=[0, 0])
    ray_resources.check_shared_pins(specs, [[0], [1]], asks)  # a stage each: fine
    ray_resources.check_shared_pins(specs, [[0, 1]], [{"resources": {"host_a": 1}}, {"num_cpus": 2}])


@pytest.mark.exhaustive
def test_a_dead_actor_is_named_with_its_stages(
    ray_cluster: Any, tmp_path: Path, sample_models_dir: Path
) -> None:
    """Killing a worker's actor mid-stream fails a run that allows no restart with one line naming the
    actor's stages."""
    import os
    import signal
    import threading

    from onnxpipe import api

    split = tmp_path / "interleaved"
    api.split(
        sample_models_dir / "transformer_tiny.onnx",
        SplitOptions(
            out=split, plan=PlanRequest(4, workers=2), profile=ProfileOptions(cost="static"), verify=False
        ),
    )
    pipe = Pipeline.from_manifest(split, RayConfig(restarts=0))
    backend = pipe.backend
    assert isinstance(backend, RayBackend)
    pid, host = backend.placed[1].pid, backend.placed[1].host
    stages = ", ".join(str(i) for i in backend.groups[1])
    threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
    with pytest.raises(RuntimeStageError) as info:
        for _ in pipe.stream(token_batches(100_000)):
            pass
    pipe.close()
    text = str(info.value)
    assert len(text.splitlines()) == 1
    assert f"the actor of stages {stages} (pid {pid} on {host}) died" in text
    assert wait_gone(sorted({p.pid for p in backend.placed})) == []


@pytest.mark.exhaustive
def test_a_killed_actor_is_started_again_and_its_micro_batches_sent_again(
    ray_cluster: Any, tiny_split: Path, sample_models_dir: Path
) -> None:
    """Ray starts a killed actor again (here on the same node, which lives on); the driver opens its
    stage again and sends what was in flight again: every result once, in order, the model's.  The
    actor is killed as the 60th micro-batch is taken, while earlier ones are in flight (not on a
    timer, which a fast machine outran)."""
    import os
    import signal

    batches = token_batches(16, seed=5)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)

    def inputs(pid: int) -> Iterator[dict[str, np.ndarray]]:
        for j in range(400):
            if j == 60:
                os.kill(pid, signal.SIGKILL)
            yield batches[j % len(batches)]

    with Pipeline.from_manifest(tiny_split, RayConfig()) as pipe:
        backend = pipe.backend
        assert isinstance(backend, RayBackend)
        before = backend.placed[1]
        got = list(pipe.stream(inputs(before.pid)))
        after = backend.placed[1]
    assert_same([expected[j % len(expected)] for j in range(400)], got)
    (recovery,) = backend.recoveries
    assert recovery.stages == (1,) and recovery.lost == before and recovery.now == after
    assert after.pid != before.pid and not recovery.node_lost
    assert 1 <= recovery.replayed <= backend.capacity and recovery.seconds > 0


def test_ray_replicas_are_lanes_of_one_actor_each(ray_cluster: Any, sample_models_dir: Path) -> None:
    """Two lanes of the whole model (data parallel): fed in turn, the same outputs in order."""
    from onnxpipe.runtime.spec import Placement, model_spec

    model = sample_models_dir / "transformer_tiny.onnx"
    expected = original_outputs(model, token_batches(20, seed=9))
    names = list(expected[0])
    lanes = [[model_spec(model, ["tokens"], names, Placement(threads=1), index=i)] for i in range(2)]
    backend = RayBackend(lanes)
    assert backend.capacity == 2 * 2 * 2
    with Pipeline(backend, input_types={"tokens": "int64"}, output_names=names, lanes=lanes) as pipe:
        assert_same(expected, list(pipe.stream(token_batches(20, seed=9))))
        stats = pipe.stats()
        pids = {place.pid for place in backend.placed}
    assert [s.index for s in stats] == [0, 1] and len(pids) == 2
    assert sorted(len(s.records) for s in stats) == [10, 10]
    with pytest.raises(UsageError, match="one lane"):
        RayBackend(lanes, workers=[0, 0])


@pytest.mark.exhaustive
def test_ray_compare_runs_the_replicas_as_actors(ray_cluster: Any, tiny_split: Path, tmp_path: Path) -> None:
    import json

    from onnxpipe.cli import run as run_command

    report = tmp_path / "report.json"
    argv = (str(tiny_split), "--backend", "ray", "-m", "8", "--compare", "--report", str(report))
    assert run_command(parse(*argv)) == 0
    replicas = json.loads(report.read_text())["baselines"]["replicas"]
    assert replicas["mode"] == "ray" and replicas["workers"] == 2
    assert replicas["throughput_per_s"] > 0 and replicas["peak_rss_bytes"] > 0
    assert replicas["balanced_ceiling"] is None  # actors' clocks need not be one machine's


def test_ray_actors_keep_their_layers_cache_while_generating(ray_cluster: Any, tmp_path: Path) -> None:
    """Generation through Ray actors: each actor keeps its stage's cache; the tokens are the unsplit
    model's (generated here by one local worker holding the whole cache)."""
    folder = tmp_path / "llama"
    split(
        SAMPLE_MODELS / "decoders" / "llama_gqa.onnx",
        SplitOptions(out=folder, plan=PlanRequest(2), profile=ProfileOptions(cost="static"), verify=False),
    )
    prompts = [[3, 17, 42, 9], [101, 2], [64]]
    with Generator.replicas(folder, 1) as whole:
        want = whole.generate(prompts, 16)
    with Generator.open(folder, RayConfig()) as pipe:
        got = pipe.generate(prompts, 16)
    assert got.tokens == want.tokens
