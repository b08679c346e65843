"""The Ray backend on a real cluster of several nodes (``tools/ray_cluster.py``): stages pinned to nodes by
their custom resources, the CLI run as users run it, against ``ray start`` nodes with token auth; stage
files shipped to nodes that cannot read the driver's folder; a node lost mid-run, with and without a
node to take its stage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from paths import REPO_ROOT
from runtime_support import assert_same, original_outputs, split_tiny, token_batches

from onnxpipe import api
from onnxpipe.api import ExportOptions, PlanRequest, ProfileOptions, RunOptions, SplitOptions
from onnxpipe.api import run as run_split
from onnxpipe.core.errors import RuntimeStageError
from onnxpipe.core.events import Silent
from onnxpipe.runtime.backends import ray_ship
from onnxpipe.runtime.backends.ray_backend import RayBackend
from onnxpipe.runtime.backends.ray_links import LARGEST_BYTES
from onnxpipe.runtime.base import RayConfig
from onnxpipe.runtime.pipeline import Pipeline
from tools.ray_cluster import LocalCluster

pytestmark = pytest.mark.slow

PINNED = [{"resources": {"node_a": 1}}, {"resources": {"node_b": 1}}]
"""Stage 0 on node ``a``, stage 1 on node ``b``."""


def test_stages_pinned_to_two_nodes_stream_the_model_s_outputs_in_order(
    on_cluster: LocalCluster, tiny_split: Path, sample_models_dir: Path
) -> None:
    batches = token_batches(24, seed=3)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    config = RayConfig(address=on_cluster.address, resources=PINNED, files="shared")
    with Pipeline.from_manifest(tiny_split, config) as pipe:
        backend = pipe.backend
        assert isinstance(backend, RayBackend)
        assert_same(expected, list(pipe.stream(batches)))
        stats = pipe.stats()
    assert [len(s.records) for s in stats] == [24, 24]
    nodes = {n.spec.name: n.node_id for n in on_cluster.nodes}
    assert [p.node_id for p in backend.placed] == [nodes["a"], nodes["b"]]
    assert [s.node for s in stats] == backend.placed
    assert backend.shipped == [None, None]  # a shared folder: nothing shipped


@pytest.mark.exhaustive
def test_the_cli_runs_on_the_cluster_as_a_user_runs_it(
    on_cluster: LocalCluster, tiny_split: Path, tmp_path: Path
) -> None:
    """``onnxpipe run --backend ray --ray-address`` in a process of its own, the token in its
    environment as on a machine of the cluster; the report names each stage's node and each hop."""
    resources = tmp_path / "resources.json"
    resources.write_text(json.dumps({"stages": PINNED}))
    report = tmp_path / "report.json"
    onnxpipe = [sys.executable, "-c", "import sys; from onnxpipe.cli import main; sys.exit(main())"]
    argv = [*onnxpipe, "run", str(tiny_split), "--backend", "ray"]
    argv += ["--ray-address", on_cluster.address, "--ray-resources", str(resources), "-m", "12"]
    argv += ["--report", str(report)]
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": on_cluster.token}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    obj = json.loads(report.read_text())
    assert obj["backend"] == "ray" and obj["microbatches"] == 12
    assert [s["microbatches"] for s in obj["stages"]] == [12, 12]
    nodes = {n.spec.name: n.node_id for n in on_cluster.nodes}
    assert [s["node_id"] for s in obj["stages"]] == [nodes["a"], nodes["b"]]
    assert all(s["host"] and s["node_address"] for s in obj["stages"])
    hops = obj["hops"]
    assert [(h["source"], h["target"]) for h in hops] == [
        ("driver", "stage 0"),
        ("stage 0", "stage 1"),
        ("stage 1", "driver"),
    ]
    assert all(h["bytes_per_microbatch"] > 0 for h in hops)
    assert all(h["single_ms"] is not None and h["single_ms"] >= 0 for h in hops)
    assert obj["overhead_ms"] > 0 and obj["recoveries"] == [] and obj["failure"] is None
    assert "node (host address id)" in done.stdout and "stage 0 -> stage 1" in done.stdout


@pytest.mark.exhaustive
def test_nodes_that_cannot_read_the_driver_s_folder_get_the_stages_shipped(
    on_cluster: LocalCluster, sample_models_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The split lies where the nodes see an empty folder: read there (``shared``) the stages do not
    open; shipped (in chunks of 20 kB here, several on their way at once, as a stage of gigabytes
    ships), they run, and a second run finds them in the nodes' caches and ships nothing."""
    if not on_cluster.hides:
        pytest.skip("this machine gives no process a mount namespace of its own (unshare)")
    monkeypatch.setattr(ray_ship, "CHUNK_BYTES", 20_000)
    split = on_cluster.hidden / "private"  # the mlp: no other test ships its stages to these nodes
    model = sample_models_dir / "mlp.onnx"
    options = SplitOptions(
        out=split,
        plan=PlanRequest(2),
        profile=ProfileOptions(cost="static"),
        export=ExportOptions(external_data="always"),  # each stage's weights in a file beside it
        verify=False,
    )
    api.split(model, options)
    with pytest.raises(RuntimeStageError, match=r"stage 0 \(stage_0.onnx\): .*stage_0.onnx is not on this"):
        Pipeline.from_manifest(split, RayConfig(resources=PINNED, files="shared"))
    rng = np.random.default_rng(6)
    batches = [{"x": rng.standard_normal((2, 64)).astype(np.float32)} for _ in range(8)]
    expected = original_outputs(model, batches)
    shipped = []
    for _ in range(2):
        with Pipeline.from_manifest(split, RayConfig(resources=PINNED)) as pipe:
            backend = pipe.backend
            assert isinstance(backend, RayBackend)
            assert_same(expected, list(pipe.stream(batches)))
            shipped.append(list(backend.shipped))
    sizes = [sum(p.stat().st_size for p in split.glob(f"stage_{i}.onnx*")) for i in range(2)]
    assert len(list(split.glob("stage_*.onnx.data"))) == 2
    assert shipped == [sizes, [0, 0]]


@pytest.mark.exhaustive
def test_run_through_the_api_on_the_cluster(on_cluster: LocalCluster, tiny_split: Path) -> None:
    report = run_split(
        tiny_split,
        RunOptions(backend="ray", ray_address=on_cluster.address, ray_resources=PINNED, microbatches=12),
    )
    assert report.backend == "ray" and report.microbatches == 12
    assert [s.node is not None for s in report.stages] == [True, True]


def _kill_when(
    cluster: LocalCluster, backend: RayBackend, position: int, delivered: list[int], after: int
) -> None:
    """Kill the node of the stage at ``position`` once ``after`` results came out."""

    def watch() -> None:
        while len(delivered) < after:
            threading.Event().wait(0.01)
        cluster.kill(cluster.node(backend.placed[position].node_id))

    threading.Thread(target=watch, daemon=True).start()


@pytest.mark.exhaustive
def test_a_lost_node_s_stage_runs_again_on_a_spare_and_every_result_comes_once_in_order(
    on_cluster: LocalCluster, tiny_split: Path, sample_models_dir: Path
) -> None:
    for name in ("c1", "c2"):  # two nodes that can host stage 1: one takes it, one is the spare
        on_cluster.add(name, 1, {"spare_host": 1})
    on_cluster.wait()
    pins = [PINNED[0], {"resources": {"spare_host": 1}}]
    batches = token_batches(16, seed=8)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    inputs = [batches[j % len(batches)] for j in range(600)]
    delivered: list[int] = []
    with Pipeline.from_manifest(tiny_split, RayConfig(resources=pins)) as pipe:
        backend = pipe.backend
        assert isinstance(backend, RayBackend)
        first = backend.placed[1]
        _kill_when(on_cluster, backend, 1, delivered, 100)
        got = []
        for out in pipe.stream(inputs):
            got.append(out)
            delivered.append(1)
    assert_same([expected[j % len(expected)] for j in range(600)], got)
    (recovery,) = backend.recoveries
    assert recovery.stages == (1,) and recovery.node_lost
    assert recovery.lost.node_id == first.node_id and recovery.now.node_id != first.node_id
    assert backend.placed[1] == recovery.now and 1 <= recovery.replayed <= backend.capacity
    assert backend.shipped[1] is not None and backend.shipped[1] > 0  # a new node's cache


@pytest.mark.exhaustive
def test_a_lost_node_no_other_can_replace_stops_the_run_naming_it_and_keeps_the_results(
    on_cluster: LocalCluster, tmp_path: Path, sample_models_dir: Path
) -> None:
    lonely = on_cluster.add("d", 1, {"lonely_host": 1})
    on_cluster.wait()
    split = split_tiny(tmp_path, sample_models_dir)
    report, outputs = tmp_path / "report.json", tmp_path / "outputs.npz"
    pins = [PINNED[0], {"resources": {"lonely_host": 1}}]
    options = RunOptions(
        backend="ray", ray_resources=pins, microbatches=20_000, warmup=0, report=report, outputs=outputs
    )
    killer = threading.Timer(1.0, on_cluster.kill, (lonely,))

    class KillOnceRunning(Silent):
        def step(self, what: str) -> None:
            if what.startswith("running"):  # the actors are up: the stream starts
                killer.start()

    with pytest.raises(RuntimeStageError) as info:
        run_split(split, options, listener=KillOnceRunning())
    killer.join()
    text = str(info.value)
    assert len(text.splitlines()) == 1
    assert "stage 1 lost its node" in text and lonely.node_id is not None and lonely.node_id[:8] in text
    assert "no alive node has lonely_host 1" in text
    obj = json.loads(report.read_text())
    assert obj["failure"] in text and 0 < obj["microbatches"] < 20_000
    assert len(np.load(outputs)["logits"]) == obj["microbatches"]


@pytest.mark.exhaustive
def test_links_measured_between_the_devices_nodes_are_written_into_the_devices_file(
    on_cluster: LocalCluster, tiny_split: Path, tmp_path: Path
) -> None:
    from onnxpipe.api import LinkOptions, links
    from onnxpipe.cluster.devicesfile import load_cluster

    devices = tmp_path / "devices.json"
    device = {"provider": "CPUExecutionProvider", "threads": 1, "memory_bytes": None}
    devices.write_text(
        json.dumps(
            {
                "description": "two machines",
                "devices": [{"name": "left", **device}, {"name": "right", **device}],
                "links": {"bandwidth_bytes_per_s": "1 Gbit/s", "latency_s": 0.001},
            }
        )
    )
    out = tmp_path / "measured.json"
    report = links(devices, LinkOptions(ray_resources=PINNED, split=tiny_split, repeats=5, out=out))
    (link,) = report.links
    nodes = {n.spec.name: n.node_id for n in on_cluster.nodes}
    assert (link.source, link.target) == ("left", "right")
    assert (link.measured.source.node_id, link.measured.target.node_id) == (nodes["a"], nodes["b"])
    crossing = json.loads((tiny_split / "manifest.json").read_text())["stages"][1]["link_bytes_in"]
    assert sorted(link.measured.seconds_by_size) == sorted({1024, crossing, LARGEST_BYTES})
    assert all(s > 0 for s in link.measured.seconds_by_size.values())
    written = load_cluster(out)
    assert [d.name for d in written.devices] == ["left", "right"]
    assert written.links[0].latency_s == link.measured.latency_s
    obj = json.loads(out.read_text())
    assert (
        obj["description"] == "two machines"
        and "measured over the data plane" in obj["links"][0]["description"]
    )


@pytest.mark.exhaustive
def test_a_split_calibrated_on_the_cluster_times_each_stage_on_its_node(
    on_cluster: LocalCluster, tmp_path: Path, sample_models_dir: Path
) -> None:
    from onnxpipe.api import CalibrationOptions, split
    from onnxpipe.manifest import load_manifest

    out = tmp_path / "calibrated"
    result = split(
        sample_models_dir / "transformer_tiny.onnx",
        SplitOptions(
            out=out,
            plan=PlanRequest(2),
            profile=ProfileOptions(runs=5, warmup=1),
            calibration=CalibrationOptions(rounds=1, mode="ray", ray_resources=PINNED),
            verify=False,
        ),
    )
    notes = " ".join(load_manifest(out).plan.notes)
    assert "timed on its node of the Ray cluster over a window of back-to-back runs" in notes, notes
    assert result.plan.k == 2
