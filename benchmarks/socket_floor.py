"""The machine's floor under a generation step's hop: a bare TCP socket between two hosts carrying the
hop's bytes, each side computing for a stage's time before it sends, one message in flight, as a step
at one sequence in flight does.  What a hop costs here beyond its bytes' time at the link's rate with no
data plane at all (no framing, no pickling, no arrays): the namespaced link's kernel path and waking a
core that sat idle while the other computed.  ``bench_cluster`` measures it in the same run as the
plane's hops, so the plane's own cost is the difference.

The peers run as ``python -m benchmarks.socket_floor PEER HOST PORT BYTES GAP_S`` in the hosts'
namespaces; times are wall clocks (one kernel's clock: the hosts are namespaces of one machine).
"""

from __future__ import annotations

import json
import socket
import statistics
import struct
import subprocess
import sys
import time
from typing import Any

from tools.hosts import Hosts

MESSAGES = 300
SKIPPED = 20
"""The first messages, left out of the median (connections and caches settling)."""
PORT = 47_001


def compute(seconds: float, state: Any) -> Any:
    """Matrix-vector products for ``seconds``: 16 MB of weights through the caches, as a stage's run
    streams its weights (what makes the sender's and the receiver's code cold again)."""
    weights, x = state
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        x = weights @ x
        x /= abs(x).max() + 1
    return weights, x


def peer(role: str, host: str, nbytes: int, gap_s: float) -> list[float]:
    """One side: ``b`` listens on ``host``, ``a`` connects to it; in turn each computes ``gap_s``, sends
    ``nbytes`` stamped with the wall clock, and waits for the other's; the one-way milliseconds received."""
    import numpy as np

    rng = np.random.default_rng(0)
    state = (rng.random((2048, 2048), dtype=np.float32), rng.random(2048, dtype=np.float32))
    if role == "b":
        listener = socket.create_server((host, PORT))
        sock, _ = listener.accept()
        listener.close()
    else:
        sock = _connect(host)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out, into, seen = bytearray(nbytes), bytearray(nbytes), []
    with sock:
        for i in range(MESSAGES):
            if role == "a" or i > 0:
                state = compute(gap_s, state)
                struct.pack_into("d", out, 0, time.time())
                sock.sendall(out)
            got = 0
            while got < nbytes:
                n = sock.recv_into(memoryview(into)[got:])
                if n == 0:
                    return seen
                got += n
            seen.append((time.time() - struct.unpack_from("d", into)[0]) * 1e3)
    return seen


def _connect(host: str) -> socket.socket:
    for _ in range(100):
        try:
            return socket.create_connection((host, PORT), timeout=5)
        except ConnectionRefusedError:
            time.sleep(0.05)
    raise RuntimeError(f"the floor's peer on {host}:{PORT} never listened")


def floor(hosts: Hosts, nbytes: int, gap_s: float) -> dict[str, float]:
    """The median one-way milliseconds of ``nbytes`` from host ``a`` to host ``b`` (and back), each
    side computing ``gap_s`` before it sends."""
    to = hosts.hosts["b"].address
    argv = [sys.executable, "-m", "benchmarks.socket_floor"]
    b = subprocess.Popen(
        [*hosts.hosts["b"].prefix(), *argv, "b", to, str(nbytes), str(gap_s)], stdout=subprocess.PIPE
    )
    a = subprocess.Popen(
        [*hosts.hosts["a"].prefix(), *argv, "a", to, str(nbytes), str(gap_s)], stdout=subprocess.PIPE
    )
    back, there = json.loads(a.communicate()[0]), json.loads(b.communicate()[0])
    return {
        "bytes": nbytes,
        "gap_ms": gap_s * 1e3,
        "a_to_b_ms": statistics.median(there[SKIPPED:]),
        "b_to_a_ms": statistics.median(back[SKIPPED:]),
    }


if __name__ == "__main__":
    role, host, size, gap = sys.argv[1:5]
    print(json.dumps(peer(role, host, int(size), float(gap))))
