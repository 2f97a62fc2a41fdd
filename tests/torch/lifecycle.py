"""Lifecycle scenarios (rank side, started by ranks.py "lifecycle:NAME"): exiting with or without
destroy_process_group, and destroying and making the group again on one store."""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ranks import RANK, TIMEOUT, WORLD, check, init, store

import hicoll.torch as ht


class _SlowTeardown:
    """Freed while the interpreter finalizes (module globals are cleared after the point from
    which a non-main thread that takes the GIL is ended): holds the process there, as a large
    model being freed does, so a worker still running then is seen."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __del__(self):
        time.sleep(self.seconds)


_teardown = None


def exit_without_destroy(steps: int = 5) -> dict:
    """Trains a few steps, then leaves with an async call still in flight on rank 0 (its
    tensor and Work already dropped by Python) and no destroy_process_group()."""
    global _teardown
    init()
    model = torch.nn.Linear(8, 8)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for s in range(steps):
        opt.zero_grad()
        ddp(torch.randn(4, 8, generator=torch.Generator().manual_seed(s * 10 + RANK))).sum().backward()
        opt.step()
    dist.barrier()
    if RANK == 0:
        # Both complete when rank 1 joins, 1 s from now, with Python holding neither the Works
        # nor the tensors: the worker holds the last references, and the second call's future
        # has a Python callback to run.
        x = torch.ones(1 << 16)
        dist.all_reduce(x, async_op=True)
        y = torch.ones(1 << 16)
        dist.all_reduce(y, async_op=True).get_future().then(lambda f: f.value())
        del x, y
        _teardown = _SlowTeardown(3.0)
    else:
        time.sleep(1.0)
        for _ in range(2):
            x = torch.ones(1 << 16)
            dist.all_reduce(x)
            check(x, torch.full_like(x, float(WORLD)), "late all_reduce")
    return {"exit": "without destroy_process_group"}


def reinit(times: int = 20) -> dict:
    """destroy_process_group + init_process_group("hicoll") `times` times on one store, each
    incarnation checked with hicoll collectives, a fallback op (gloo) and a subgroup."""
    st = store()
    seen = []
    for i in range(times):
        dist.init_process_group("hicoll", store=st, rank=RANK, world_size=WORLD, timeout=TIMEOUT)
        t = torch.full((5,), float(RANK + i))
        dist.all_reduce(t)
        check(t, torch.full((5,), float(sum(r + i for r in range(WORLD)))), f"incarnation {i}")
        out = torch.empty(2 * WORLD)
        dist.all_gather_into_tensor(out, torch.full((2,), float(RANK * 100 + i)))
        want = torch.tensor([float(r * 100 + i) for r in range(WORLD)]).repeat_interleave(2)
        check(out, want, f"incarnation {i} all_gather")
        o = torch.empty(WORLD)
        dist.all_to_all_single(o, torch.arange(WORLD, dtype=torch.float32) + 10 * RANK)
        check(o, torch.tensor([float(RANK + 10 * r) for r in range(WORLD)]), f"incarnation {i} a2a")
        sub = dist.new_group(list(range(WORLD)))
        t = torch.ones(3)
        dist.all_reduce(t, group=sub)
        check(t, torch.full((3,), float(WORLD)), f"incarnation {i} subgroup")
        seen.append(getattr(ht.backend_of(), "incarnation", None))
        dist.destroy_process_group()
    assert seen == list(range(times)), seen
    return {"incarnations": seen}
