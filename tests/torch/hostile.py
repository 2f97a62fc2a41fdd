"""The hostile-environment tier's torch part (issue 27): FSDP2 with --pg-alloc (communication
buffers in node memory, allocate_tensor) and hicoll.torch.QuantizedAllGather (forced to quantize
on one node), as jobs of 2 ranks on one host inside "containers" -- mount (and PID) namespaces with a small, absent or read-only
/dev/shm, tight rlimits, or ranks sharing a host name but not /dev/shm or a PID namespace.
The C++ side of the tier, with the same environments, is tests/hostile/hostile_test.cc.

Three roles in one file:
  python hostile.py container ENV        builds the container for ENV (as root), launches the
                                         ranks in it, prints "HOSTILE_SUMMARY {json}"
  python hostile.py rank-ns KIND -- CMD  one rank in its own mount namespace with its own
                                         /dev/shm (KIND shm) or its own PID namespace (pid)
  run()                                  the rank side (python ranks.py hostile:run '{}')
test_hostile.py runs the containers and asserts the outcomes.
"""
from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
PR_SET_PDEATHSIG = 1
GIB = 1 << 30

SHM_CAUSE = r"/dev/shm|shared memory|--shm-size"
# name -> (/dev/shm: "fresh" | size option | "absent" | "readonly", RLIMIT_NOFILE, RLIMIT_AS,
#          per-rank namespace: None | "shm" | "pid", what an error must name (regex))
ENVS = {
    "FreshDevShm": ("fresh", 0, 0, None, r"$^"),  # the control: must simply work
    "DevShm64MB": ("64m", 0, 0, None, SHM_CAUSE),
    "DevShm8MB": ("8m", 0, 0, None, SHM_CAUSE),
    "DevShmAbsent": ("absent", 0, 0, None, SHM_CAUSE),
    "DevShmReadOnly": ("readonly", 0, 0, None, SHM_CAUSE),
    "Nofile256": ("fresh", 256, 0, None, r"open files|file descriptors|RLIMIT_NOFILE|ulimit -n|EMFILE"),
    # A torch rank of these jobs peaks near 4 GiB of address space (VmPeak); 16 GiB is generous.
    "AddressSpace16GiB": ("fresh", 0, 16 * GIB, None,
                          r"address space|RLIMIT_AS|ulimit -v|Cannot allocate memory|out of memory"),
    "OneHostOwnDevShmPerRank": ("fresh", 0, 0, "shm", r"namespace|cannot (map|share)|/dev/shm|same node|node-local"),
    "OneHostOwnPidNamespacePerRank": ("fresh", 0, 0, "pid",
                                      r"namespace|cannot (map|share)|/dev/shm|same node|node-local|/proc"),
}

# Two ranks of one node (a torch rank costs ~5 s of CPU to start; the tier runs on 2 cores): the
# node's ranks read each other's node memory, and HICOLL_QUANT_MIN_NODES=1 makes the quantized
# all-gather quantize (and stage its images) there too. 2 nodes x 2 ranks: tests/hostile.
WORLD, NODES = 2, 1
TIMEOUT_MS = "10000"
JOB_TIMEOUT_S = 150.0

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


class NotPermitted(Exception):
    pass


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        msg = f"{what}: {os.strerror(e)}"
        raise NotPermitted(msg) if e in (1, 13) else OSError(e, msg)


def _unshare(flags: int) -> None:
    _check(_libc.unshare(flags), f"unshare({flags:#x})")


def _mount(src, target, fstype, flags, data=None) -> None:
    enc = lambda s: s.encode() if isinstance(s, str) else s  # noqa: E731
    _check(_libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {src} on {target}")


def _private_root() -> None:
    _unshare(CLONE_NEWNS)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)


def _tmpfs(target: str, opts: str = "mode=1777") -> None:
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, opts)


def _dev_without_shm() -> None:
    """A private /dev (tmpfs) with binds of the device nodes a process needs and no shm: shm_open
    fails with ENOENT, as on a system without /dev/shm."""
    d = tempfile.mkdtemp(prefix="hctest-dev-")
    try:
        _tmpfs(d, "mode=755")
        for n in ("null", "zero", "random", "urandom", "full"):
            open(os.path.join(d, n), "w").close()
            _mount(f"/dev/{n}", os.path.join(d, n), None, MS_BIND)
        os.symlink("/proc/self/fd", os.path.join(d, "fd"))
        for i, n in enumerate(("stdin", "stdout", "stderr")):
            os.symlink(f"/proc/self/fd/{i}", os.path.join(d, n))
        _mount(d, "/dev", None, MS_MOVE)
    finally:
        os.rmdir(d)
    assert not os.path.exists("/dev/shm")


def shm_left(path: str = "/dev/shm") -> list[str]:
    try:
        return sorted(n for n in os.listdir(path) if n.startswith("hicoll"))
    except FileNotFoundError:
        return []


def _die_with_parent() -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _status(rc: int) -> int:
    return 128 - rc if rc < 0 else rc  # Popen's -signal as a shell's 128 + signal


# ------------------------------------------------------------------------------------------
# The container: python hostile.py container ENV

def container(name: str) -> dict:
    shm, nofile, as_bytes, per_rank, _ = ENVS[name]
    out = {"env": name}
    try:
        _private_root()
        if shm == "absent":
            _dev_without_shm()
        else:
            _tmpfs("/dev/shm", "mode=1777" if shm in ("fresh", "readonly") else f"mode=1777,size={shm}")
            if shm == "readonly":
                _mount(None, "/dev/shm", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        if nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        if as_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (as_bytes, as_bytes))
    except NotPermitted as e:
        return {**out, "not_permitted": str(e)}
    except Exception as e:  # noqa: BLE001
        return {**out, "setup_error": repr(e)}

    sys.path.insert(0, HERE)
    from harness import free_port, node_labels
    port, labels = free_port(), node_labels(WORLD, NODES)
    logs, procs = [], []
    t0 = time.monotonic()
    for rank in range(WORLD):
        e = dict(os.environ)
        e.update({"RANK": str(rank), "LOCAL_RANK": str(rank % (WORLD // NODES)), "WORLD_SIZE": str(WORLD),
                  "LOCAL_WORLD_SIZE": str(WORLD // NODES), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                  "HICOLL_TOPO_NODE": labels[rank], "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
                  "HICOLL_TIMEOUT_MS": TIMEOUT_MS, "HICOLL_QUANT_MIN_NODES": "1", "PYTHONUNBUFFERED": "1"})
        cmd = [sys.executable, os.path.join(HERE, "ranks.py"), "hostile:run", "{}"]
        if per_rank:
            cmd = [sys.executable, os.path.abspath(__file__), "rank-ns", per_rank, "--"] + cmd
        log = tempfile.TemporaryFile(mode="w+")
        logs.append(log)
        procs.append(subprocess.Popen(cmd, env=e, stdout=log, stderr=subprocess.STDOUT, text=True,
                                      preexec_fn=_die_with_parent))
    deadline = t0 + JOB_TIMEOUT_S
    timed_out = False
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    if timed_out:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
    ranks = []
    for rank, (p, log) in enumerate(zip(procs, logs)):
        log.seek(0)
        text = log.read()
        res = [l for l in text.splitlines() if l.startswith("RESULT ")]
        left = [l for l in text.splitlines() if l.startswith("HOSTILE_SHM_LEFT ")]
        status = _status(p.returncode)
        ranks.append({"status": 124 if timed_out and p.returncode in (-9,) else status,
                      "result": json.loads(res[-1][7:]) if res else None,
                      "own_shm_left": json.loads(left[-1][17:]) if left else [],
                      "tail": text[-3000:]})
    return {**out, "seconds": round(time.monotonic() - t0, 1), "timed_out": timed_out, "ranks": ranks,
            "shm_left": shm_left()}


# ------------------------------------------------------------------------------------------
# One rank in its own namespace: python hostile.py rank-ns shm|pid -- CMD...

def rank_ns(kind: str, cmd: list[str]) -> int:
    _unshare(CLONE_NEWNS | (CLONE_NEWPID if kind == "pid" else 0))
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    if kind == "shm":
        _tmpfs("/dev/shm")

    def child_setup():
        _die_with_parent()
        if kind == "pid":  # pid 1 of the new namespace, with its own /proc
            _unshare(CLONE_NEWNS)
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)

    p = subprocess.Popen(cmd, preexec_fn=child_setup)
    rc = p.wait()
    if kind == "shm":
        print("HOSTILE_SHM_LEFT " + json.dumps(shm_left()), flush=True)
    return _status(rc)


# ------------------------------------------------------------------------------------------
# The rank side: FSDP2 --pg-alloc and QuantizedAllGather, checked against independent references

def run(steps: int = 3) -> dict:
    import torch
    import torch.distributed as dist

    import fsdp_parity
    import node_memory
    import quantized
    from ranks import RANK, init

    import hicoll.torch as ht

    torch.set_num_threads(1)
    stage = "init_process_group"

    def vm_peak_kb() -> int:
        with open("/proc/self/status") as f:
            return next((int(l.split()[1]) for l in f if l.startswith("VmPeak:")), 0)

    try:
        init()
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (WORLD,))
        data = fsdp_parity.ex.Batches(fsdp_parity.ex.load_text(), fsdp_parity.CFG["seq_len"], 8)
        ref = fsdp_parity.reference_losses(data, steps)  # one process, no communication

        # What FSDP2 --pg-alloc does underneath, at the size of a large layer's parameters: 2 x 48
        # MB per rank, more than Docker's default /dev/shm holds for the job.
        stage = "allocate_tensor + all_gather_into_tensor"
        cpu = torch.device("cpu")
        backend = dist.group.WORLD._get_backend(cpu)
        n = 12_000_003
        out = backend.allocate_tensor(n * WORLD, dtype=torch.float32, device=cpu)
        out[RANK * n:(RANK + 1) * n].copy_(torch.arange(n, dtype=torch.float32) + 1000 * RANK)
        dist.all_gather_into_tensor(out, out[RANK * n:(RANK + 1) * n])
        want = torch.cat([torch.arange(n, dtype=torch.float32) + 1000 * r for r in range(WORLD)])
        assert torch.equal(out, want), f"rank {RANK}: {stage}: {(out != want).sum().item()} wrong elements"
        del out

        stage = "FSDP2 --pg-alloc"
        with_pg = node_memory.fsdp_losses(mesh, data, True, steps)
        rel_pg = max(abs(a - b) / abs(b) for a, b in zip(with_pg, ref))
        assert rel_pg <= 1e-5, f"rank {RANK}: {stage}: losses {with_pg}, single process {ref}"

        stage = "QuantizedAllGather (direct)"
        quantized.check_direct(ht.QuantizedAllGather(), 70001, 256, torch.float32)

        stage = "FSDP2 + QuantizedAllGather"
        qag = ht.QuantizedAllGather()
        quant = quantized.fsdp_losses(mesh, data, steps, qag)
        rel_q = max(abs(a - b) / abs(b) for a, b in zip(quant, ref))
        assert rel_q < 2e-2, f"rank {RANK}: {stage}: losses {quant}, single process {ref}"

        stage = "destroy_process_group"
        dist.destroy_process_group()
    except AssertionError as e:
        print("RESULT " + json.dumps({"outcome": "wrong", "stage": stage, "error": str(e)[:1500],
                                      "vm_peak_kb": vm_peak_kb()}), flush=True)
        os._exit(1)
    except Exception as e:  # noqa: BLE001  a clean error: the message must name the cause
        print("RESULT " + json.dumps({"outcome": "error", "stage": stage, "error": str(e)[:1500],
                                      "vm_peak_kb": vm_peak_kb()}), flush=True)
        os._exit(3)
    return {"outcome": "correct", "rel_pg_alloc": rel_pg, "rel_quantized": rel_q,
            "quantized_calls": qag.quantized_calls, "exact_calls": qag.exact_calls, "vm_peak_kb": vm_peak_kb()}


if __name__ == "__main__":
    if sys.argv[1] == "container":
        print("HOSTILE_SUMMARY " + json.dumps(container(sys.argv[2])), flush=True)
    elif sys.argv[1] == "rank-ns":
        assert sys.argv[3] == "--"
        sys.exit(rank_ns(sys.argv[2], sys.argv[4:]))
    else:
        raise SystemExit(__doc__)
