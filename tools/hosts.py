"""Machines of their own on this one: each a network namespace with its own address on a bridge, a link
of a given rate, its own cores, and optionally a CPU quota and a memory limit; what the cluster tests
and ``python -m benchmarks cluster`` run Ray nodes on (``tools/ray_cluster.py``), so that a hop crosses a
link of a known rate and a stage shares its cores with nothing it would not share on a machine.

Made as ../shared/design/HOSTS.md found it holds here (root, cgroup v1, no netem):

* a namespace ``<tag>-hub`` holding the bridge; each host a namespace ``<tag>-<name>`` joined to it by a
  veth pair, an address ``10.<a>.<b>.<i>/24`` each, no default route: every address lives inside
  namespaces made here, and the root namespace's network is never touched;
* a link's rate is ``tbf`` on both ends of the host's veth (the egress each way), with a bucket of about
  a millisecond at the rate (a larger one lets short transfers read above the line rate);
* cores by ``taskset``; a quota (``cpu.cfs_quota_us``) and a memory limit through a cgroup v1 group per
  host, joined **before** ``ip netns exec`` (which remounts /sys, so the group's path is gone inside).

:meth:`Hosts.close` removes everything made (namespaces, bridge, groups), also after a failure half-way.
:func:`cannot_make_hosts` says why this machine cannot make them (not root, no ``ip``/``tc``, no
namespaces), so that a test skips with the reason and falls back to loopback nodes.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CFS_PERIOD_US = 100_000
MIN_BURST_BYTES = 16 * 1024
"""A bucket never smaller than a few full frames (tbf refuses one under the MTU)."""


@dataclass(frozen=True)
class HostSpec:
    """One machine: its cores (None: any), its link's rate in Mbit/s (None: the veth's own speed, several
    Gbit/s), a CPU quota in cores (0.33: a third of one core, as a burstable instance or a container
    limit gives), a memory limit in bytes."""

    name: str
    cpus: tuple[int, ...] | None = None
    rate_mbit: float | None = None
    quota: float | None = None
    memory_bytes: int | None = None


@dataclass(frozen=True)
class Host:
    """A machine made: its spec, namespace, address on the bridge and cgroup paths (if any)."""

    spec: HostSpec
    netns: str
    address: str
    groups: tuple[Path, ...]
    hub_veth: str
    """Its veth's end on the bridge, where the link's rate toward the host is set."""

    @property
    def name(self) -> str:
        return self.spec.name

    def prefix(self) -> list[str]:
        """The command prefix that runs a program on this machine: in its cgroups, its namespace, on its
        cores.  The process and its children stay there (Ray's raylet and workers inherit all three)."""
        inner = ["ip", "netns", "exec", self.netns]
        if self.spec.cpus is not None:
            inner += ["taskset", "-c", ",".join(str(c) for c in self.spec.cpus)]
        if not self.groups:
            return inner
        joins = "; ".join(f"echo $$ > {group / 'tasks'}" for group in self.groups)
        return ["sh", "-c", f'{joins} && exec "$@"', "sh", *inner]


def cannot_make_hosts() -> str | None:
    """Why machines of their own cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "namespaced hosts need root (ip netns, tc, cgroups); CI runs as root"
    for tool in ("ip", "tc", "taskset"):
        if shutil.which(tool) is None:
            return f"namespaced hosts need the '{tool}' command"
    probe = f"onnxpipe-probe-{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        return f"this machine cannot make a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _run(*argv: str) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")


def _in(netns: str, *argv: str) -> None:
    _run("ip", "netns", "exec", netns, *argv)


def tbf_args(rate_mbit: float) -> list[str]:
    """``tc`` arguments for a link of ``rate_mbit``: a bucket of about a millisecond at the rate."""
    burst = max(MIN_BURST_BYTES, int(rate_mbit * 1e6 / 8 / 1000))
    return ["tbf", "rate", f"{rate_mbit:g}mbit", "burst", str(burst), "latency", "50ms"]


class Hosts:
    """Machines on a bridge of their own; a context manager that removes them all on exit."""

    def __init__(self) -> None:
        self.tag = f"opx{secrets.token_hex(2)}"
        subnet = int(self.tag[3:], 16)
        self.subnet = f"10.{200 + subnet % 50}.{subnet % 250}"
        self.hub = f"{self.tag}-hub"
        self.hosts: dict[str, Host] = {}
        self._made_groups: list[Path] = []
        self._namespaces: list[str] = []
        self._netns(self.hub)
        _in(self.hub, "ip", "link", "add", "br0", "type", "bridge")
        _in(self.hub, "ip", "link", "set", "br0", "up")

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _netns(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self._namespaces.append(name)
        _in(name, "ip", "link", "set", "lo", "up")

    def add(self, spec: HostSpec) -> Host:
        """Make machine ``spec``: its namespace, its veth onto the bridge (rate-limited both ways), its
        address and its cgroups."""
        if spec.name in self.hosts:
            raise ValueError(f"host {spec.name!r} is made already")
        index = len(self.hosts) + 1
        netns = f"{self.tag}-{spec.name}"
        here, there = f"{self.tag}h{index}", f"{self.tag}n{index}"
        self._netns(netns)
        _run("ip", "link", "add", here, "type", "veth", "peer", "name", there)
        _run("ip", "link", "set", here, "netns", self.hub)
        _run("ip", "link", "set", there, "netns", netns)
        _in(self.hub, "ip", "link", "set", here, "master", "br0")
        _in(self.hub, "ip", "link", "set", here, "up")
        _in(netns, "ip", "link", "set", there, "name", "eth0")
        address = f"{self.subnet}.{index}"
        _in(netns, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
        _in(netns, "ip", "link", "set", "eth0", "up")
        host = Host(spec, netns, address, self._groups(spec), here)
        self.hosts[spec.name] = host
        if spec.rate_mbit is not None:
            self.set_rate(spec.name, spec.rate_mbit)
        return host

    def set_rate(self, name: str, rate_mbit: float) -> None:
        """Set the rate of host ``name``'s link, both ways (``tbf`` on each end of its veth)."""
        host = self.hosts[name]
        _in(host.netns, "tc", "qdisc", "replace", "dev", "eth0", "root", *tbf_args(rate_mbit))
        _in(self.hub, "tc", "qdisc", "replace", "dev", host.hub_veth, "root", *tbf_args(rate_mbit))

    def _groups(self, spec: HostSpec) -> tuple[Path, ...]:
        groups = []
        if spec.quota is not None:
            cpu = self._group("cpu", spec.name)
            (cpu / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            (cpu / "cpu.cfs_quota_us").write_text(str(max(1000, int(spec.quota * CFS_PERIOD_US))))
            groups.append(cpu)
        if spec.memory_bytes is not None:
            memory = self._group("memory", spec.name)
            (memory / "memory.limit_in_bytes").write_text(str(spec.memory_bytes))
            groups.append(memory)
        return tuple(groups)

    def _group(self, controller: str, name: str) -> Path:
        group = CGROUP_ROOT / controller / f"{self.tag}-{name}"
        group.mkdir()
        self._made_groups.append(group)
        return group

    def run(
        self, name: str, argv: list[str], *, timeout: float | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on machine ``name`` and wait for it; its output captured as text."""
        return subprocess.run(
            [*self.hosts[name].prefix(), *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )

    def close(self) -> None:
        """Remove every namespace (their veths and qdiscs go with them) and every cgroup made.  A group
        still holding processes is emptied into its parent first; a process left there is the caller's
        to stop (the cluster stops its nodes before this)."""
        for netns in reversed(self._namespaces):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
        self._namespaces.clear()
        for group in reversed(self._made_groups):
            with contextlib.suppress(OSError):
                for pid in (group / "tasks").read_text().split():
                    with contextlib.suppress(OSError):
                        (group.parent / "tasks").write_text(pid)
                group.rmdir()
        self._made_groups.clear()
