"""A Ray cluster of several nodes on this machine, started the way users start one on several machines:
what the tests (``tests/conftest.py``'s ``ray_nodes``) and ``python -m benchmarks cluster`` run on.

``ray start --head`` and ``ray start --address`` per node (each with its own CPU count and custom
resources, token authentication as Ray 2.60 requires), every node a process tree of its own: started
with ``--block`` in a new session, so that its raylet, agents and workers are this fixture's and nothing
else's, and stopped by killing that session (the node's process group, then whatever of its session is
left: Ray starts its workers in process groups of their own).  Never ``ray stop``, which stops every Ray
on the machine.  Ports are picked free, temp dirs are private: two clusters (two test sessions, or
another engineer's) do not collide.

``hidden``: a folder that the nodes' processes cannot read (they see an empty tmpfs there, their own
mount namespace): a split folder written there reaches the stages only if the driver ships it.  Needs
``unshare --mount`` (root, or user namespaces); :attr:`LocalCluster.hides` says whether it worked.

Killing a node (:meth:`LocalCluster.kill`) is a machine lost: every process of its session gets SIGKILL.

``hosts``: the nodes run on machines of their own (``tools/hosts.py``: a network namespace with its own
address and a link of a set rate, its own cores, a CPU quota), each node on the host its spec names, the
head on ``head_host``.  A Ray driver needs a raylet on its own host, so the driver is then a process on a
node's host (:meth:`LocalCluster.run_on`: ``onnxpipe run --ray-address`` as a user runs it on machine A),
not this process.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.hosts import Host, Hosts

REPO_ROOT = Path(__file__).resolve().parents[1]

START_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0

QUICK_HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}
"""The head declares a node dead about 3 s after it stopped answering (Ray's defaults: 15-30 s), so that
the tests of a lost node do not wait for it."""


@dataclass(frozen=True)
class NodeSpec:
    """One node: its name (for the test), CPUs, custom resources and the host it runs on (with
    ``hosts``)."""

    name: str
    num_cpus: int
    resources: Mapping[str, float] = field(default_factory=dict)
    host: str | None = None


@dataclass
class Node:
    spec: NodeSpec
    process: subprocess.Popen[bytes]
    temp_dir: Path
    log: Path
    node_id: str | None = None

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


def free_ports(count: int, *, taken: set[int] | None = None) -> list[int]:
    """``count`` distinct free ports, none of them in ``taken`` (which gets them added).

    The sockets stay bound until all are picked: picked one by one, the kernel may hand the same
    just-closed port out twice, and ``ray start`` refuses two components on one port."""
    taken = set() if taken is None else taken
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < count:
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
            if port not in taken:
                taken.add(port)
                ports.append(port)
    return ports


def ray_command() -> list[str]:
    """``ray``, the console script of this interpreter's Ray (not some other one on PATH)."""
    beside = Path(sys.executable).with_name("ray")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("ray")
    if found is None:
        raise RuntimeError("the ray command is not installed (pip install 'onnxpipe[ray]')")
    return [found]


def session_members(sid: int) -> list[int]:
    """Every process whose session is ``sid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def kill_session(sid: int, sig: signal.Signals) -> None:
    """``sig`` to the process group ``sid`` (the node's ``ray start``, raylet, agents), then to every
    process left in session ``sid`` (its workers, each in a process group of its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, sig)
    for pid in session_members(sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def cluster_token() -> str:
    """The token the driver (this process) presents: ``RAY_AUTH_TOKEN``, else the file Ray reads
    (``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``), else a new one, put in ``RAY_AUTH_TOKEN``.
    Ray caches the token a process first read, so the nodes get this one rather than another."""
    given = os.environ.get("RAY_AUTH_TOKEN")
    if given:
        return given
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    token = secrets.token_hex(32)
    os.environ["RAY_AUTH_TOKEN"] = token
    return token


def can_hide() -> list[str] | None:
    """The ``unshare`` prefix that gives a process a mount namespace of its own here, or None."""
    probe = 'mount -t tmpfs onnxpipe-probe "$1"'
    for prefix in (["unshare", "--mount", "--propagation", "private"], ["unshare", "-rm"]):
        if shutil.which(prefix[0]) is None:
            continue
        with tempfile.TemporaryDirectory() as d:
            done = subprocess.run(
                [*prefix, "sh", "-c", probe, "sh", d], capture_output=True, timeout=30, check=False
            )
        if done.returncode == 0:
            return prefix
    return None


class LocalCluster:
    """A head node (no CPUs: no actor lands on it, as on a cluster whose head only coordinates) and the
    worker nodes added with :meth:`add`; see the module docstring."""

    def __init__(
        self,
        *,
        head_resources: Mapping[str, float] | None = None,
        hide: bool = True,
        system_config: Mapping[str, Any] | None = None,
        hosts: Hosts | None = None,
        head_host: str | None = None,
    ) -> None:
        self.system_config = dict(system_config or {})
        self.hosts = hosts
        if (hosts is None) != (head_host is None):
            raise ValueError("hosts and head_host go together")
        self.base = Path(tempfile.mkdtemp(prefix="onnxpipe-ray-"))
        self.hidden = self.base / "hidden"
        self.hidden.mkdir()
        self.token = cluster_token()
        self._unshare = can_hide() if hide else None
        self.hides = self._unshare is not None
        self._ports: set[int] = set()  # every port handed to a node of this cluster
        self.port = free_ports(1, taken=self._ports)[0]
        self.ip = "127.0.0.1" if hosts is None or head_host is None else hosts.hosts[head_host].address
        self.address = f"{self.ip}:{self.port}"
        self.nodes: list[Node] = []
        self.head = self._start(NodeSpec("head", 0, dict(head_resources or {}), head_host), head=True)

    # ------------------------------------------------------------------------------ nodes

    @property
    def env(self) -> dict[str, str]:
        """The environment every node gets: token authentication, and this checkout of onnxpipe."""
        path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
        return {
            **os.environ,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONPATH": path,
        }

    def host_of(self, spec: NodeSpec) -> Host | None:
        """The machine node ``spec`` runs on, None for this one's loopback."""
        if self.hosts is None:
            return None
        if spec.host is None or spec.host not in self.hosts.hosts:
            raise ValueError(f"node {spec.name!r} names no host made ({sorted(self.hosts.hosts)})")
        return self.hosts.hosts[spec.host]

    def _start(self, spec: NodeSpec, *, head: bool = False) -> Node:
        temp = self.base / spec.name
        log = self.base / f"{spec.name}.log"
        host = self.host_of(spec)
        ports = iter(free_ports(7, taken=self._ports))
        args = [
            *ray_command(),
            "start",
            "--block",
            "--disable-usage-stats",
            f"--node-ip-address={'127.0.0.1' if host is None else host.address}",
            f"--num-cpus={spec.num_cpus}",
            f"--resources={json.dumps(dict(spec.resources))}",
            f"--temp-dir={temp}",
            f"--node-manager-port={next(ports)}",
            f"--object-manager-port={next(ports)}",
            f"--metrics-export-port={next(ports)}",
            f"--runtime-env-agent-port={next(ports)}",
            f"--dashboard-agent-grpc-port={next(ports)}",
            f"--dashboard-agent-listen-port={next(ports)}",
            "--object-store-memory=200000000",
        ]
        if head:
            args += [
                "--head",
                f"--port={self.port}",
                "--include-dashboard=false",
                f"--dashboard-port={next(ports)}",
            ]
            if self.system_config:
                args.append(f"--system-config={json.dumps(self.system_config)}")
        else:
            args.append(f"--address={self.address}")
        if self._unshare is not None:
            mount = 'mount -t tmpfs -o size=1m onnxpipe-hidden "$1" && shift && exec "$@"'
            args = [*self._unshare, "sh", "-c", mount, "sh", str(self.hidden), *args]
        if host is not None:
            args = [*host.prefix(), *args]
        env = {**self.env, "ONNXPIPE_STAGE_CACHE": str(temp / "stage-cache")}  # a machine's own cache
        with log.open("wb") as out:
            process = subprocess.Popen(
                args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        node = Node(spec, process, temp, log)
        self.nodes.append(node)
        return node

    def add(
        self, name: str, num_cpus: int, resources: Mapping[str, float] | None = None, host: str | None = None
    ) -> Node:
        """Start a worker node (``ray start --address``), on machine ``host`` with ``hosts``; :meth:`wait`
        for it to join."""
        return self._start(NodeSpec(name, num_cpus, dict(resources or {}), host))

    def node(self, node_id: str) -> Node:
        """The node Ray knows as ``node_id`` (after :meth:`wait`)."""
        (node,) = [n for n in self.nodes if n.node_id == node_id]
        return node

    def kill(self, node: Node) -> None:
        """The node's machine is lost: SIGKILL to every process of its session, at once."""
        kill_session(node.process.pid, signal.SIGKILL)
        node.process.wait()

    def stop(self) -> None:
        """Stop every node, workers first: SIGTERM to each session, SIGKILL to what is left after a grace."""
        for node in reversed(self.nodes):
            if node.alive:
                kill_session(node.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for node in reversed(self.nodes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(max(0.1, deadline - time.monotonic()))
            kill_session(node.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(5)
        shutil.rmtree(self.base, ignore_errors=True)

    # ------------------------------------------------------------------------------ the driver

    def run_on(
        self, host: str, argv: list[str], *, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on machine ``host`` with the cluster's environment (the token, this checkout), as a
        user runs ``onnxpipe`` on a machine of the cluster; waits, output captured as text."""
        if self.hosts is None:
            raise RuntimeError("run_on needs hosts; without them this process is the driver (connect)")
        return self.hosts.run(host, argv, timeout=timeout, env=self.env)

    def connect(self) -> Any:
        """``ray.init`` this process to the cluster (token authentication on), once the head answers."""
        if self.hosts is not None:
            raise RuntimeError("the nodes run on hosts of their own: drive them with run_on from a host")
        os.environ["RAY_AUTH_MODE"] = "token"
        import ray
        from ray._raylet import Config

        # a Ray imported before (another module's) read the mode then: read it again, as
        # ray._private.authentication.authentication_token_setup does when it turns token auth on
        Config.initialize("")

        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._head_listens():
            if not self.head.alive:
                raise RuntimeError(f"the head node failed to start: {self.head.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the head node did not start in time: {self.head.log.read_text()[-2000:]}"
                )
            time.sleep(0.25)
        while True:
            try:
                ray.init(address=self.address, logging_level="WARNING", log_to_driver=False)
                return ray
            except ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _head_listens(self) -> bool:
        if self.hosts is not None:
            probe = f"import socket; socket.create_connection(({self.ip!r}, {self.port}), timeout=1).close()"
            return self.run_on(self.head.spec.host or "", [sys.executable, "-c", probe]).returncode == 0
        with socket.socket() as s:
            s.settimeout(1.0)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def wait(self, timeout: float = START_TIMEOUT_S) -> None:
        """Until every started node that is alive has joined (this process connected, or with hosts a
        driver on the head's host); records each node's id."""
        if self.hosts is not None:
            self._wait_on_hosts(timeout)
            return
        import ray

        deadline = time.monotonic() + timeout
        while True:
            joined = {str(n["NodeManagerPort"]): n["NodeID"] for n in ray.nodes() if n["Alive"]}
            waiting = [node for node in self.nodes if node.alive and node.node_id is None]
            for node in waiting:
                node.node_id = joined.get(_arg(node.process.args, "--node-manager-port=") or "")
            waiting = [node for node in waiting if node.node_id is None]
            if not waiting:
                return
            dead = [node for node in self.nodes if not node.alive and node.node_id is None]
            if dead or time.monotonic() > deadline:
                late = dead or waiting
                logs = "\n".join(n.log.read_text()[-1500:] for n in late)
                raise RuntimeError(f"{', '.join(n.spec.name for n in late)} did not join in time\n{logs}")
            time.sleep(0.25)

    def _wait_on_hosts(self, timeout: float) -> None:
        """:meth:`wait` with hosts: the head answering on its host, then a driver there polling
        ``ray.nodes()`` until every alive node joined, printing each one's node manager port and id."""
        deadline = time.monotonic() + timeout
        while not self._head_listens():
            if not self.head.alive or time.monotonic() > deadline:
                raise RuntimeError(f"the head node did not start: {self.head.log.read_text()[-2000:]}")
            time.sleep(0.5)
        waiting = [n for n in self.nodes if n.alive and n.node_id is None]
        ports = [_arg(n.process.args, "--node-manager-port=") for n in waiting]
        script = _JOIN_SCRIPT.format(address=self.address, ports=ports, timeout=deadline - time.monotonic())
        done = self.run_on(self.head.spec.host or "", [sys.executable, "-c", script], timeout=timeout + 30)
        if done.returncode != 0 or not done.stdout.strip():
            logs = "\n".join(n.log.read_text()[-1500:] for n in waiting)
            raise RuntimeError(f"nodes did not join in time: {done.stderr[-2000:]}\n{logs}")
        joined = json.loads(done.stdout.strip().splitlines()[-1])
        for node, port in zip(waiting, ports, strict=True):
            node.node_id = joined.get(port or "")
        late = [n for n in waiting if n.node_id is None]
        if late:
            logs = "\n".join(n.log.read_text()[-1500:] for n in late)
            raise RuntimeError(f"{', '.join(n.spec.name for n in late)} did not join in time\n{logs}")


_JOIN_SCRIPT = """
import json, time, ray
ray.init(address={address!r}, logging_level="WARNING", log_to_driver=False)
ports, deadline = {ports!r}, time.monotonic() + {timeout}
while True:
    joined = {{str(n["NodeManagerPort"]): n["NodeID"] for n in ray.nodes() if n["Alive"]}}
    if all(p in joined for p in ports) or time.monotonic() > deadline:
        break
    time.sleep(0.25)
print(json.dumps({{p: joined[p] for p in ports if p in joined}}))
"""


def _arg(args: Any, prefix: str) -> str | None:
    for a in args:
        if isinstance(a, str) and a.startswith(prefix):
            return a[len(prefix) :]
    return None
