"""The Ray backend on machines of their own (``tools/hosts.py``): each node in its own network namespace
with its own address, a 100 Mbit link, a core of its own; the driver (``onnxpipe run`` as a user runs it)
on a third machine with the head; the split folder out of the stage machines' reach; a machine lost
mid-run.  Skipped with the reason where this machine cannot make namespaced hosts (not root, no
``ip``/``tc``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from runtime_support import assert_same, original_outputs, split_tiny, token_batches

from onnxpipe import api
from onnxpipe.api import PlanRequest, ProfileOptions, SplitOptions
from onnxpipe.manifest import load_manifest
from onnxpipe.verification.options import BY_BOUNDARY
from tools.hosts import Hosts, HostSpec, cannot_make_hosts
from tools.ray_cluster import QUICK_HEALTH_CHECKS, LocalCluster, session_members

pytestmark = [
    pytest.mark.slow,
    pytest.mark.exhaustive,
    pytest.mark.xdist_group("hosts"),
]
# Only the test that times something (a lost node's recovery within its health checks) is marked
# whole_machine; the others check outputs and bytes, which other tests' compute cannot change.

RATE_MBIT = 100.0
PINNED = [{"resources": {"node_a": 1}}, {"resources": {"node_b": 1}}]


@pytest.fixture(scope="module")
def host_cluster() -> Iterator[LocalCluster]:
    """Hosts ``d`` (the driver's machine: the head, no worker CPUs), ``a`` (core 0) and ``b`` (core 1),
    each on a 100 Mbit link to the bridge; node ``a`` on host a, node ``b`` on host b."""
    pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[ray]')")
    reason = cannot_make_hosts()
    if reason is not None:
        pytest.skip(reason)
    with Hosts() as hosts:
        hosts.add(HostSpec("d", rate_mbit=RATE_MBIT))
        hosts.add(HostSpec("a", cpus=(0,), rate_mbit=RATE_MBIT))
        hosts.add(HostSpec("b", cpus=(1,), rate_mbit=RATE_MBIT))
        cluster = LocalCluster(system_config=QUICK_HEALTH_CHECKS, hosts=hosts, head_host="d")
        try:
            cluster.add("a", 1, {"node_a": 1}, host="a")
            cluster.add("b", 1, {"node_b": 1}, host="b")
            cluster.wait()
            yield cluster
        finally:
            cluster.stop()


def test_each_host_has_its_address_its_link_and_its_core(host_cluster: LocalCluster) -> None:
    hosts = host_cluster.hosts
    assert hosts is not None
    addresses = {h.address for h in hosts.hosts.values()}
    assert len(addresses) == len(hosts.hosts) >= 3 and not {"127.0.0.1"} & addresses
    qdisc = hosts.run("a", ["tc", "qdisc", "show", "dev", "eth0"]).stdout
    assert "tbf" in qdisc and "100Mbit" in qdisc
    cores = hosts.run("b", [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"])
    assert cores.stdout.strip() == "[1]"


def test_the_cli_on_the_driver_s_host_streams_the_model_s_outputs_across_the_links(
    host_cluster: LocalCluster, sample_models_dir: Path, tmp_path: Path
) -> None:
    """``onnxpipe run --backend ray`` on host d, stage 0 on host a, stage 1 on host b, the split folder
    hidden from both (shipped): the outputs are the model's, each stage ran on its host's node."""
    split = split_tiny(host_cluster.hidden, sample_models_dir)
    batches = token_batches(8, seed=5)
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, tokens=np.stack([b["tokens"] for b in batches]))
    resources = tmp_path / "resources.json"
    resources.write_text(json.dumps({"stages": PINNED}))
    outputs, report = tmp_path / "outputs.npz", tmp_path / "report.json"
    argv = [sys.executable, "-c", "import sys; from onnxpipe.cli import main; sys.exit(main())", "run"]
    argv += [str(split), "--backend", "ray", "--ray-address", host_cluster.address]
    argv += ["--ray-resources", str(resources), "--inputs-stacked", str(inputs), "-m", "8"]
    argv += ["--outputs", str(outputs), "--report", str(report)]
    done = host_cluster.run_on("d", argv, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(outputs) as stacked:
        actual = [{name: stacked[name][j] for name in stacked.files} for j in range(len(batches))]
    assert_same(original_outputs(sample_models_dir / "transformer_tiny.onnx", batches), actual)
    obj = json.loads(report.read_text())
    nodes = {n.spec.name: n.node_id for n in host_cluster.nodes}
    assert [s["node_id"] for s in obj["stages"]] == [nodes["a"], nodes["b"]]
    assert all(s["node_address"].startswith(host_cluster.ip.rsplit(".", 1)[0]) for s in obj["stages"])


def _link_bytes(hosts: Hosts, name: str) -> int:
    """Bytes host ``name``'s link carried so far, both ways."""
    stats = "/sys/class/net/eth0/statistics"
    done = hosts.run(name, ["cat", f"{stats}/rx_bytes", f"{stats}/tx_bytes"])
    return sum(int(v) for v in done.stdout.split())


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from onnxpipe.cli import main; sys.exit(main())", *args]


def test_no_byte_between_the_stages_crosses_the_driver_s_machine(
    host_cluster: LocalCluster, sample_models_dir: Path, tmp_path: Path
) -> None:
    """The stages on hosts a and b, the driver on d: d's link carries the inputs and the outputs (and
    Ray's own chatter), not the tensors between the stages, which go from a to b directly."""
    hosts = host_cluster.hosts
    assert hosts is not None
    split = split_tiny(tmp_path, sample_models_dir)
    count = 64
    batches = token_batches(count, seed=2)
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, tokens=np.stack([b["tokens"] for b in batches]))
    resources = tmp_path / "resources.json"
    resources.write_text(json.dumps({"stages": PINNED}))
    report = tmp_path / "report.json"
    argv = _cli("run", str(split), "--backend", "ray", "--ray-address", host_cluster.address)
    argv += ["--ray-resources", str(resources), "--inputs-stacked", str(inputs), "-m", str(count)]
    argv += ["--warmup", "0", "--report", str(report)]
    first = host_cluster.run_on("d", argv, timeout=300)  # ships the stages to a and b
    assert first.returncode == 0, first.stderr[-3000:]
    before = _link_bytes(hosts, "d")
    done = host_cluster.run_on("d", argv, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    crossed_d = _link_bytes(hosts, "d") - before
    hops = {
        (h["source"], h["target"]): h["bytes_per_microbatch"] for h in json.loads(report.read_text())["hops"]
    }
    ends = hops[("driver", "stage 0")] + hops[("stage 1", "driver")]
    between = hops[("stage 0", "stage 1")]
    runs = 2 * count  # a run's micro-batches, and as many again one at a time for the report
    assert crossed_d < runs * (ends + between / 2), (
        f"host d's link carried {crossed_d} bytes: more than the inputs and outputs of {runs} micro-batches "
        f"({runs * ends}) and half of what crossed between the stages ({runs * between})"
    )


def test_links_measures_the_link_between_two_hosts(host_cluster: LocalCluster, tmp_path: Path) -> None:
    """``onnxpipe links`` between the devices on hosts a and b, run from host d: one link, with a
    bandwidth (more bytes took longer: the link is not free) and a latency above 0.  How close the
    bandwidth comes to the rate the link was set to is a measured speed, so it is the benchmark's
    (``benchmarks/bench_cluster.py``: ``hops``, the fitted bandwidth against the set rate), not a test's."""
    devices = tmp_path / "devices.json"
    device = {"provider": "CPUExecutionProvider", "threads": 1, "memory_bytes": None}
    devices.write_text(
        json.dumps(
            {
                "devices": [{"name": "left", **device}, {"name": "right", **device}],
                "links": {"bandwidth_bytes_per_s": "1 Gbit/s", "latency_s": 0.001},
            }
        )
    )
    resources = tmp_path / "resources.json"
    resources.write_text(json.dumps({"stages": PINNED}))
    argv = _cli("links", str(devices), "--ray-address", host_cluster.address)
    argv += ["--ray-resources", str(resources), "--repeats", "5", "--json"]
    done = host_cluster.run_on("d", argv, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (measured,) = json.loads(done.stdout)["links"]
    assert measured["bandwidth_bytes_per_s"] is not None and measured["bandwidth_bytes_per_s"] > 0, measured
    assert measured["latency_s"] > 0, measured


@pytest.mark.parametrize(
    ("model", "dtype", "feeds"),
    [
        ("transformer_tiny.onnx", "float16", lambda: token_batches(8, seed=6)),
        (
            "mlp.onnx",
            "int8",
            lambda: [
                {"x": np.random.default_rng(j).standard_normal((4, 64)).astype(np.float32)} for j in range(8)
            ],
        ),
    ],
)
def test_a_compressed_boundary_crosses_the_link_and_holds_its_tolerance(
    host_cluster: LocalCluster,
    sample_models_dir: Path,
    tmp_path: Path,
    model: str,
    dtype: str,
    feeds: Callable[[], list[dict[str, np.ndarray]]],
) -> None:
    """A split whose boundary crosses as float16 (int8), verified when it was split, run on the hosts:
    stage 1 receives the compressed tensor over host b's link, and the outputs hold the dtype's
    tolerance against the uncompressed model."""
    split = host_cluster.hidden / f"split-{dtype}"
    request = PlanRequest(2, boundary_dtype=dtype)
    api.split(
        sample_models_dir / model,
        SplitOptions(out=split, plan=request, profile=ProfileOptions(cost="static")),
    )
    manifest = load_manifest(split)
    assert manifest.stages[1].boundary_dtype == dtype
    assert all(i.name.endswith(f"/onnxpipe_{dtype}") or "scale" in i.name for i in manifest.stages[1].inputs)
    batches = feeds()
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, **{name: np.stack([b[name] for b in batches]) for name in batches[0]})
    resources = tmp_path / "resources.json"
    resources.write_text(json.dumps({"stages": PINNED}))
    outputs = tmp_path / "outputs.npz"
    argv = _cli("run", str(split), "--backend", "ray", "--ray-address", host_cluster.address)
    argv += ["--ray-resources", str(resources), "--inputs-stacked", str(inputs), "-m", str(len(batches))]
    argv += ["--outputs", str(outputs)]
    done = host_cluster.run_on("d", argv, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    tolerance = BY_BOUNDARY[dtype]
    expected = original_outputs(sample_models_dir / model, batches)
    with np.load(outputs) as stacked:
        for j, want in enumerate(expected):
            for name, value in want.items():
                got = stacked[name][j]
                bound = tolerance.atol + tolerance.rtol * float(np.abs(value).max())
                assert float(np.abs(got - value).max()) <= bound, (name, j)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


_LOST_SCRIPT = """
import json, signal, sys, threading, time
import numpy as np, ray
from onnxpipe.runtime.base import RayConfig
from onnxpipe.runtime.pipeline import Pipeline
from tools.ray_cluster import kill_session
split, address, sessions, inputs, out = sys.argv[1:]
sessions = json.loads(sessions)
ray.init(address=address, logging_level="WARNING", log_to_driver=False)
with np.load(inputs) as stacked:
    batches = [{"tokens": t} for t in stacked["tokens"]]
pins = [{"resources": {"node_a": 1}}, {"resources": {"lost_host": 1}}]
got = []
with Pipeline.from_manifest(split, RayConfig(resources=pins)) as pipe:
    victim = pipe.backend.placed[1]
    for out_ in pipe.stream(batches):
        got.append(out_)
        if len(got) == 100:
            threading.Thread(target=kill_session, args=(sessions[victim.node_id], signal.SIGKILL)).start()
    recoveries = [
        {"seconds": r.seconds, "lost": r.lost.node_id, "pid": r.lost.pid, "now": r.now.node_id,
         "node_lost": r.node_lost, "replayed": r.replayed}
        for r in pipe.backend.recoveries
    ]
np.savez(out, **{name: np.stack([g[name] for g in got]) for name in got[0]})
print(json.dumps(recoveries))
"""


@pytest.mark.whole_machine
def test_a_machine_lost_mid_run_is_replaced_and_every_result_comes_once(
    host_cluster: LocalCluster, sample_models_dir: Path, tmp_path: Path
) -> None:
    """Stage 1 on one of two machines that can host it (hosts c and e, a node each); that machine's node
    is killed (its whole process tree, SIGKILL) after 100 of 300 results: the head's quick health checks
    declare it dead, Ray starts the stage's actor on the other machine, every result comes once and
    equal to the model's, and no process of the lost actor or of its node is left.  The recovery's
    seconds are printed (the issue's goal: under 5 s), not asserted: a busy machine stretches them."""
    hosts = host_cluster.hosts
    assert hosts is not None
    spares = []
    for name in ("c", "e"):
        hosts.add(HostSpec(name, cpus=(1,), rate_mbit=RATE_MBIT))
        spares.append(host_cluster.add(name, 1, {"lost_host": 1}, host=name))
    host_cluster.wait()
    split = split_tiny(tmp_path, sample_models_dir)
    batches = token_batches(16, seed=8)
    inputs = [batches[j % len(batches)] for j in range(300)]
    stacked = tmp_path / "inputs.npz"
    np.savez(stacked, tokens=np.stack([b["tokens"] for b in inputs]))
    sessions = {n.node_id: n.process.pid for n in spares}
    outputs = tmp_path / "outputs.npz"
    argv = [sys.executable, "-c", _LOST_SCRIPT, str(split), host_cluster.address, json.dumps(sessions)]
    done = host_cluster.run_on("d", [*argv, str(stacked), str(outputs)], timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (recovery,) = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"a machine lost mid-run: recovered in {recovery['seconds']:.2f} s, "
        f"{recovery['replayed']} micro-batches sent again"
    )
    lost = [n for n in spares if n.node_id == recovery["lost"]]
    assert len(lost) == 1 and recovery["node_lost"] and recovery["now"] != recovery["lost"]
    with np.load(outputs) as stacked:
        actual = [{name: stacked[name][j] for name in stacked.files} for j in range(len(inputs))]
    assert_same(original_outputs(sample_models_dir / "transformer_tiny.onnx", inputs), actual)
    assert not _alive(recovery["pid"])  # the lost actor's worker is gone
    assert session_members(lost[0].process.pid) == []  # and every process of its node
