"""Surviving a killed rank: 4 ranks train TinyLM with FSDP2/HSDP (2 x 2 mesh) on hicoll and save
a DCP checkpoint every --every steps; at step --kill-step the last rank SIGKILLs itself. The
survivors see the failure as an error of their next collective (hcRemoteError, well inside
HICOLL_TIMEOUT_MS), call dist.shrink_group([dead]) (hicoll's Backend::shrink -> hcCommShrink),
rebuild the model with FSDP2 on the 3 survivors, reload the last checkpoint and finish the run.
Rank 0 prints the losses (they keep falling) and the time from the kill to the first step on
the shrunk group.

    HICOLL_TIMEOUT_MS=20000 python examples/shrink_train.py --spawn 4

--spawn N starts the N ranks itself (RANK, WORLD_SIZE, MASTER_ADDR/PORT as torchrun sets them;
HICOLL_TOPO_NODE puts them on N/2 simulated nodes) and waits for them: it exits 0 when the
victim died of its SIGKILL and every survivor finished. Not torchrun: its agent tears down
every worker within its monitor interval once one dies (torchelastic's fault tolerance is
"restart everyone"), so the survivors would be killed before they shrink.

Needs torch >= 2.10 (dist.shrink_group) and a libhicoll with hcCommShrink (hicoll._build_info
.shrink); without them it says so and exits 2.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh

import fsdp2_train as ex

CFG = dict(dim=64, layers=2, heads=4, seq_len=32)


def build(data, mesh):
    model = ex.shard(ex.build_model(data.vocab, **CFG), mesh)
    return model, ex.make_optimizer(model)


def save(model, opt, path):
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)


def load(model, opt, path):
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


def spawn(n: int, argv: list[str]) -> int:
    """Runs n ranks of this script (without --spawn) and waits for them."""
    import socket
    import subprocess
    import sys
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    here = os.path.dirname(os.path.abspath(__file__))
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   HICOLL_TOPO_NODE=os.environ.get("HICOLL_TOPO_NODE", f"node{r * 2 // n}"),
                   PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv], env=env))
    codes = [p.wait() for p in procs]
    ok = codes[-1] == -signal.SIGKILL and all(c == 0 for c in codes[:-1])
    print(f"shrink_train --spawn: exit codes {codes} ({'as expected' if ok else 'UNEXPECTED'})", flush=True)
    return 0 if ok else 1


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--spawn", type=int, default=0, metavar="N",
                   help="start N ranks of this script and wait for them (instead of torchrun)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--kill-step", type=int, default=5)
    p.add_argument("--every", type=int, default=2, help="checkpoint every N steps")
    p.add_argument("--ckpt", default=None)
    args = p.parse_args()
    if args.spawn:
        import sys
        argv, skip = [], False
        for a in sys.argv[1:]:  # the ranks' arguments: these without --spawn N
            if skip or a.startswith("--spawn"):
                skip = a == "--spawn" and not skip
                continue
            argv.append(a)
        raise SystemExit(spawn(args.spawn, argv))
    import hicoll.torch  # noqa: F401  (registers hicoll on torch < 2.14)
    from hicoll import _build_info
    if not hasattr(dist, "shrink_group") or not _build_info.shrink:
        print("shrink_train: needs torch >= 2.10 and a libhicoll with hcCommShrink")
        raise SystemExit(2)
    torch.set_num_threads(1)
    dist.init_process_group("hicoll")
    rank, world = dist.get_rank(), dist.get_world_size()
    victim = world - 1
    store = dist.distributed_c10d._get_default_store()
    ckpt_root = args.ckpt or os.path.join(tempfile.gettempdir(), f"hicoll-shrink-{os.environ.get('MASTER_PORT', '0')}")
    data = ex.Batches(ex.load_text(), CFG["seq_len"], global_batch=12)
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    model, opt = build(data, mesh)
    losses, last_ckpt, shrunk_at, recovery_s = [], None, None, None
    step = 0
    while step < args.steps:
        if rank == victim and step == args.kill_step:
            store.set("killed_at", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            x, y = data.local_step(step, rank, world)
            loss = ex.train_step(model, opt, x, y)
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        except RuntimeError as e:  # DistBackendError: a peer died
            if shrunk_at is not None:
                raise
            print(f"rank {rank}: step {step} failed ({str(e).splitlines()[0][:160]}); shrinking")
            dist.shrink_group([victim])
            rank, world = dist.get_rank(), dist.get_world_size()
            mesh = init_device_mesh("cpu", (world,))
            model, opt = build(data, mesh)
            load(model, opt, last_ckpt)
            step = int(last_ckpt.rsplit("-", 1)[1])
            shrunk_at = step
            killed_at = float(store.get("killed_at").decode())
            continue
        losses.append(round(loss.item(), 4))
        if recovery_s is None and shrunk_at is not None:
            recovery_s = time.time() - killed_at
        step += 1
        if step % args.every == 0 and shrunk_at is None:
            last_ckpt = f"{ckpt_root}/step-{step}"
            save(model, opt, last_ckpt)
    result = {"losses": losses, "world": world, "resumed_from": shrunk_at,
              "kill_to_first_shrunk_step_s": recovery_s}
    if rank == 0:
        print(f"shrink_train: losses {losses}; killed rank {victim} at step {args.kill_step}; "
              f"{world} survivors resumed from step {shrunk_at}; kill -> first step on the "
              f"shrunk group {recovery_s:.2f} s")
    print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
