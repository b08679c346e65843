"""The Ray backend on a real cluster of several nodes (``tests/cluster.py``): stages pinned to nodes by
their custom resources, the CLI run as users run it, against ``ray start`` nodes with token auth."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import LocalCluster
from paths import REPO_ROOT
from runtime_support import assert_same, original_outputs, token_batches

from onnxpipe.api import RunOptions
from onnxpipe.api import run as run_split
from onnxpipe.runtime.backends.ray_backend import RayBackend
from onnxpipe.runtime.base import RayConfig
from onnxpipe.runtime.pipeline import Pipeline

pytestmark = pytest.mark.slow

PINNED = [{"resources": {"node_a": 1}}, {"resources": {"node_b": 1}}]
"""Stage 0 on node ``a``, stage 1 on node ``b``."""


def test_stages_pinned_to_two_nodes_stream_the_model_s_outputs_in_order(
    on_cluster: LocalCluster, tiny_split: Path, sample_models_dir: Path
) -> None:
    batches = token_batches(24, seed=3)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    with Pipeline.from_manifest(tiny_split, RayConfig(address=on_cluster.address, resources=PINNED)) as pipe:
        backend = pipe.backend
        assert isinstance(backend, RayBackend)
        assert_same(expected, list(pipe.stream(batches)))
        stats = pipe.stats()
    assert [len(s.records) for s in stats] == [24, 24]
    assert stats[0].pid != stats[1].pid


def test_the_cli_runs_on_the_cluster_as_a_user_runs_it(
    on_cluster: LocalCluster, tiny_split: Path, tmp_path: Path
) -> None:
    """``onnxpipe run --backend ray --ray-address`` in a process of its own, the token in its
    environment as on a machine of the cluster."""
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


def test_run_through_the_api_on_the_cluster(on_cluster: LocalCluster, tiny_split: Path) -> None:
    report = run_split(
        tiny_split,
        RunOptions(backend="ray", ray_address=on_cluster.address, ray_resources=PINNED, microbatches=12),
    )
    assert report.backend == "ray" and report.microbatches == 12
