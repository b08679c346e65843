"""Generation on a real Ray cluster of several nodes (``tools/ray_cluster.py``): each stage's actor on its
node keeping its layers' KV cache, the tokens the unsplit model's, through the API and the CLI as users
run it; a node killed mid-generation, its stage started again on a spare node and the sequences whose
caches it held rebuilt there by a prefill, the tokens unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO_ROOT, SAMPLE_MODELS

from onnxpipe import api
from onnxpipe.api import GenerateOptions, PlanRequest, ProfileOptions, SplitOptions
from onnxpipe.core.errors import RuntimeStageError
from onnxpipe.runtime.backends.ray_backend import RayBackend
from onnxpipe.runtime.base import RayConfig
from onnxpipe.runtime.generation.generator import Generator
from tools.ray_cluster import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.exhaustive]

PINNED = [{"resources": {"node_a": 1}}, {"resources": {"node_b": 1}}]
"""Stage 0 on node ``a``, stage 1 on node ``b``."""
PROMPTS = ((3, 17, 42, 9), (101, 2), (64,))


@pytest.fixture(scope="module")
def llama_split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small GQA decoder split in 2 stages."""
    folder = tmp_path_factory.mktemp("generate-cluster") / "llama"
    api.split(
        SAMPLE_MODELS / "decoders" / "llama_gqa.onnx",
        SplitOptions(out=folder, plan=PlanRequest(2), profile=ProfileOptions(cost="static"), verify=False),
    )
    return folder


def _unsplit(folder: Path, new_tokens: int) -> tuple[tuple[int, ...], ...]:
    """The unsplit model's tokens, one local worker holding the whole cache."""
    with Generator.replicas(folder, 1) as whole:
        return whole.generate([list(p) for p in PROMPTS], new_tokens, eos_token_ids=()).tokens


def test_generate_on_two_nodes_gives_the_unsplit_model_s_tokens(
    on_cluster: LocalCluster, llama_split: Path
) -> None:
    options = GenerateOptions(
        prompt_ids=PROMPTS,
        max_new_tokens=12,
        ignore_eos=True,
        backend="ray",
        ray_address=on_cluster.address,
        ray_resources=PINNED,
        compare=True,  # the unsplit model here, two replicas of it on the cluster
    )
    result = api.generate(llama_split, options)
    assert result.same and set(result.runs) == {"pipeline", "unsplit", "replicas"}
    assert result.tokens == _unsplit(llama_split, 12)
    with Generator.open(llama_split) as local:  # the same split, local threads
        assert local.generate([list(p) for p in PROMPTS], 12, eos_token_ids=()).tokens == result.tokens
    cluster = result.cluster
    assert cluster is not None and result.backend == "ray"
    nodes = {n.spec.name: n.node_id for n in on_cluster.nodes}
    assert [n.node_id for n in cluster.nodes] == [nodes["a"], nodes["b"]]
    assert [(h.source, h.target) for h in cluster.hops] == [
        ("driver", "stage 0"),
        ("stage 0", "stage 1"),
        ("stage 1", "driver"),
    ]
    assert all(0 <= h.share <= 1 for h in cluster.hops) and len(cluster.stage_shares) == 2
    assert cluster.recoveries == () and result.runs["pipeline"].rebuilt == 0


def test_the_cli_generates_on_the_cluster_as_a_user_runs_it(
    on_cluster: LocalCluster, llama_split: Path, tmp_path: Path
) -> None:
    """``onnxpipe generate --backend ray --ray-address --ray-resources`` in a process of its own, the
    token in its environment as on a machine of the cluster; the report names each stage's node."""
    resources = tmp_path / "resources.json"
    resources.write_text(json.dumps({"stages": PINNED}))
    onnxpipe = [sys.executable, "-c", "import sys; from onnxpipe.cli import main; sys.exit(main())"]
    argv = [*onnxpipe, "generate", str(llama_split), "--backend", "ray", "--ray-address", on_cluster.address]
    argv += ["--ray-resources", str(resources), "--max-new-tokens", "8", "--ignore-eos"]
    for prompt in PROMPTS:
        argv += ["--prompt-ids", ",".join(map(str, prompt))]
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": on_cluster.token}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    text = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert text.returncode == 0, text.stderr[-3000:]
    assert "stage 0: node " in text.stdout and "hops per step" in text.stdout
    done = subprocess.run(
        [*argv, "--json"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    obj = json.loads(done.stdout)
    assert tuple(tuple(s) for s in obj["sequences"]) == _unsplit(llama_split, 8)
    nodes = {n.spec.name: n.node_id for n in on_cluster.nodes}
    assert obj["backend"] == "ray"
    assert [s["node_id"] for s in obj["cluster"]["stages"]] == [nodes["a"], nodes["b"]]
    assert all(s["host"] and s["address"] for s in obj["cluster"]["stages"])
    assert len(obj["cluster"]["hops"]) == 3 and obj["runs"]["pipeline"]["tokens_per_second"] > 0


def test_a_node_killed_mid_generation_its_sequences_are_rebuilt_and_the_tokens_are_the_same(
    on_cluster: LocalCluster, llama_split: Path
) -> None:
    for name in ("g1", "g2"):  # two nodes that can host stage 1: one takes it, one is the spare
        on_cluster.add(name, 1, {"gen_host": 1})
    on_cluster.wait()
    pins = [PINNED[0], {"resources": {"gen_host": 1}}]
    want = _unsplit(llama_split, 24)
    with Generator.open(llama_split, RayConfig(resources=pins)) as pipe:
        backend = pipe.steps.backend  # type: ignore[attr-defined]
        assert isinstance(backend, RayBackend)
        first = backend.placed[1]
        made: list[int] = []

        def kill_at_the_tenth(index: int, token: int) -> None:
            made.append(token)
            if len(made) == 10:  # mid-generation: every sequence has tokens to come
                on_cluster.kill(on_cluster.node(first.node_id))

        got = pipe.generate([list(p) for p in PROMPTS], 24, eos_token_ids=(), on_token=kill_at_the_tenth)
    assert got.tokens == want, (got.rebuilt, backend.recoveries)
    assert len(backend.recoveries) == 1, backend.recoveries
    (recovery,) = backend.recoveries
    assert recovery.stages == (1,) and recovery.node_lost
    assert recovery.lost.node_id == first.node_id and recovery.now.node_id != first.node_id
    assert got.rebuilt >= 1  # every sequence in flight held a cache on the lost node


def test_a_lost_node_no_other_can_replace_stops_the_generation_in_one_line(
    on_cluster: LocalCluster, llama_split: Path
) -> None:
    lonely = on_cluster.add("gd", 1, {"gen_lonely": 1})
    on_cluster.wait()
    pins = [PINNED[0], {"resources": {"gen_lonely": 1}}]
    with Generator.open(llama_split, RayConfig(resources=pins)) as pipe:
        made: list[int] = []

        def kill_at_the_fifth(index: int, token: int) -> None:
            made.append(token)
            if len(made) == 5:
                on_cluster.kill(lonely)

        with pytest.raises(RuntimeStageError) as info:
            pipe.generate([list(p) for p in PROMPTS], 24, eos_token_ids=(), on_token=kill_at_the_fifth)
    text = str(info.value)
    assert len(text.splitlines()) == 1
    assert "stage 1 lost its node" in text and lonely.node_id is not None and lonely.node_id[:8] in text
    assert "no alive node has gen_lonely 1" in text
