"""Launches one scenario of ranks.py as WORLD_SIZE processes on loopback, with simulated nodes.

Each rank is the program python ranks.py SCENARIO JSON-ARGS with the torchrun environment,
started as a fork of a fork server that imported torch once per session (zygote.py; a rank
whose environment differs in what torch reads at import, or HICOLL_TEST_FORK=0, is a plain
subprocess instead). The run is bounded by a deadline after which every rank is killed.
"""
from __future__ import annotations

import atexit
import json
import os
import random
import select
import shutil
import socket
import subprocess
import sys
import tempfile
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


# Variables read when torch is imported (or by the allocator and the loader before it): a rank
# whose environment sets them otherwise than the fork server's cannot be one of its forks.
IMPORT_TIME = ("TORCH_", "OMP_", "MKL_", "KMP_", "CUDA", "NCCL_", "LD_", "PYTHON", "MALLOC", "GLIBC")


class Zygote:
    """The fork server (zygote.py) and what it reported: each rank's pid, then its exit code."""

    def __init__(self) -> None:
        self.env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "zygote.py")], env=self.env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.exits: dict[int, int] = {}
        self.pending = b""
        atexit.register(self.close)

    def suits(self, env: dict) -> bool:
        keys = {k for k in (*env, *self.env) if k.startswith(IMPORT_TIME)}
        return all(env.get(k) == self.env.get(k) for k in keys)

    def send(self, msg: dict) -> None:
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def read(self, timeout: float | None) -> dict | None:
        """The next answer (exits are recorded); None after timeout seconds without one."""
        while b"\n" not in self.pending:
            if not select.select([self.proc.stdout], [], [], timeout)[0]:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                raise RuntimeError(f"the fork server exited (rc {self.proc.wait()})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        msg = json.loads(line)
        if "exit" in msg:
            self.exits[msg["exit"]] = msg["rc"]
        return msg

    def start(self, argv: list[str], env: dict, out: str) -> int:
        self.send({"argv": argv, "env": env, "out": out})
        while True:
            msg = self.read(60.0)
            if msg is None:
                raise RuntimeError("the fork server did not answer within 60 s")
            if "pid" in msg:
                return msg["pid"]

    def wait(self, pids: list[int], deadline: float) -> bool:
        while not all(p in self.exits for p in pids):
            left = deadline - time.monotonic()
            if left <= 0 or (self.read(left) is None and time.monotonic() >= deadline):
                return False
        return True

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


_zygote: Zygote | None = None


def zygote() -> Zygote | None:
    global _zygote
    if os.environ.get("HICOLL_TEST_FORK", "1") == "0":
        return None
    if _zygote is None or _zygote.proc.poll() is not None:
        _zygote = Zygote()
    return _zygote


def run_forked(z: Zygote, cmds: list[list[str]], envs: list[dict], timeout: float):
    """Each rank as a fork of the server: (exit codes, outputs, timed out)."""
    tmp = tempfile.mkdtemp(prefix="hicoll-ranks-")
    try:
        outs = [os.path.join(tmp, f"rank{r}.out") for r in range(len(cmds))]
        deadline = time.monotonic() + timeout
        pids = [z.start(cmd[1:], env, out) for cmd, env, out in zip(cmds, envs, outs)]
        timed_out = not z.wait(pids, deadline)
        if timed_out:
            z.send({"kill": pids})
            z.wait(pids, time.monotonic() + 30)
        rcs = [z.exits.pop(p, None) for p in pids]
        outputs = []
        for out in outs:
            with open(out, errors="replace") as f:
                outputs.append(f.read())
        return rcs, outputs, timed_out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_subprocesses(cmds: list[list[str]], envs: list[dict], timeout: float):
    """Each rank as a plain subprocess: (exit codes, outputs, timed out)."""
    procs = [subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for cmd, e in zip(cmds, envs)]
    deadline = time.monotonic() + timeout
    outputs = [""] * len(procs)
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
    return [p.returncode for p in procs], outputs, timed_out


def launch(scenario: str, world: int, nodes: int = 1, layout: str = "block",
           env: dict | None = None, timeout: float = 300.0, script: str | None = None,
           unset: tuple = (), env_per_rank=None, **args) -> list[dict]:
    """Runs the scenario on every rank; returns each rank's RESULT dict or raises with logs.
    `script` replaces ranks.py (it gets the scenario and the JSON arguments too); `unset`
    names variables of the torchrun environment to leave out."""
    port = free_port()
    labels = node_labels(world, nodes, layout)
    cmds, envs = [], []
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
        cmds.append([sys.executable, os.path.join(HERE, script or "ranks.py"), scenario, json.dumps(args)])
        envs.append(e)
    z = zygote()
    if z and all(z.suits(e) for e in envs):
        rcs, outputs, timed_out = run_forked(z, cmds, envs, timeout)
    else:
        rcs, outputs, timed_out = run_subprocesses(cmds, envs, timeout)
    results, failed = [], []
    for rank, (rc, out) in enumerate(zip(rcs, outputs)):
        res = [l for l in out.splitlines() if l.startswith("RESULT ")]
        if rc != 0 or not res:
            failed.append(rank)
        results.append(json.loads(res[-1][7:]) if res else None)
    if timed_out or failed:
        logs = "\n".join(f"----- rank {r} (rc {rcs[r]}) -----\n{outputs[r][-6000:]}"
                         for r in range(world))
        raise AssertionError(f"scenario {scenario} world={world} nodes={nodes} {layout}: "
                             f"{'timed out' if timed_out else f'ranks {failed} failed'}\n{logs}")
    return results
