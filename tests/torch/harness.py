"""Launches one scenario of ranks.py as WORLD_SIZE processes on loopback, with simulated nodes.

Each rank is a plain subprocess (python ranks.py SCENARIO JSON-ARGS) with the torchrun
environment; the run is bounded by a deadline after which every rank is killed.
"""
from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range: a port bind(0) hands out is
    ephemeral, and any outgoing connection on the machine may take it before rank 0 listens
    (EADDRINUSE in torch's TCPStore)."""
    try:
        low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_labels(world: int, nodes: int, layout: str = "block") -> list[str]:
    if layout == "block":
        per = world // nodes
        return [f"node{r // per}" for r in range(world)]
    return [f"node{r % nodes}" for r in range(world)]  # interleaved


def launch(scenario: str, world: int, nodes: int = 1, layout: str = "block",
           env: dict | None = None, timeout: float = 300.0, script: str | None = None,
           unset: tuple = (), env_per_rank=None, **args) -> list[dict]:
    """Runs the scenario on every rank; returns each rank's RESULT dict or raises with logs.
    `script` replaces ranks.py (it gets the scenario and the JSON arguments too); `unset`
    names variables of the torchrun environment to leave out."""
    port = free_port()
    labels = node_labels(world, nodes, layout)
    procs = []
    for rank in range(world):
        e = dict(os.environ)
        e.update({
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "HICOLL_TOPO_NODE": labels[rank],
            "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
            "HICOLL_TIMEOUT_MS": e.get("HICOLL_TIMEOUT_MS", "20000"),
            "PYTHONUNBUFFERED": "1",
        })
        e.update(env or {})
        e.update(env_per_rank(rank) if env_per_rank else {})
        for k in unset:
            e.pop(k, None)
        cmd = [sys.executable, os.path.join(HERE, script or "ranks.py"), scenario, json.dumps(args)]
        procs.append(subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout
    outputs = [""] * world
    timed_out = False
    for rank, p in enumerate(procs):
        try:
            outputs[rank], _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            for q in procs:
                q.kill()
            outputs[rank], _ = p.communicate()
    for rank, p in enumerate(procs):
        if p.returncode is None:
            p.kill()
            outputs[rank] += p.communicate()[0] or ""
    results, failed = [], []
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        res = [l for l in out.splitlines() if l.startswith("RESULT ")]
        if p.returncode != 0 or not res:
            failed.append(rank)
        results.append(json.loads(res[-1][7:]) if res else None)
    if timed_out or failed:
        logs = "\n".join(f"----- rank {r} (rc {procs[r].returncode}) -----\n{outputs[r][-6000:]}"
                         for r in range(world))
        raise AssertionError(f"scenario {scenario} world={world} nodes={nodes} {layout}: "
                             f"{'timed out' if timed_out else f'ranks {failed} failed'}\n{logs}")
    return results
