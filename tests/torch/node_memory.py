"""Node memory from the process group (rank side): Backend.allocate_tensor gives CPU tensors in
hcMemAlloc memory that the node's ranks read where they lie, and FSDP2 trains the same with its
communication buffers taken from there (set_allocate_memory_from_process_group_for_comm)."""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import fsdp2_train as ex  # noqa: E402

from ranks import RANK, WORLD, check, init  # noqa: E402

import hicoll.torch as ht  # noqa: E402

CFG = dict(dim=64, layers=2, heads=4, seq_len=32)


def fsdp_losses(mesh, data, pg_alloc: bool, steps: int) -> list[float]:
    model = ex.shard(ex.build_model(data.vocab, **CFG), mesh)
    ex.use_pg_alloc(model, pg_alloc)
    return ex.train_losses(model, ex.make_optimizer(model), data, steps, RANK, WORLD)


def run(steps: int = 4) -> dict:
    torch.set_num_threads(1)
    init()
    cpu = torch.device("cpu")
    backend = dist.group.WORLD._get_backend(cpu)
    assert backend.supports_tensor_alloc(cpu), "hicoll offers CPU communication buffers"
    n = 100003  # > one chunk, not a multiple of anything
    out = backend.allocate_tensor(n * WORLD, dtype=torch.float32, device=cpu)
    assert out.shape == (n * WORLD,) and out.dtype == torch.float32 and out.device == cpu, out
    mine = out[RANK * n:(RANK + 1) * n]
    mine.copy_(torch.arange(n, dtype=torch.float32) + 1000 * RANK)
    dist.all_gather_into_tensor(out, mine)  # in place, as FSDP2 does
    want = torch.cat([torch.arange(n, dtype=torch.float32) + 1000 * r for r in range(WORLD)])
    check(out, want, "all_gather_into_tensor on node memory")
    x = backend.allocate_tensor(n * WORLD, dtype=torch.bfloat16, device=cpu)
    x.copy_((torch.arange(n * WORLD) % 7 + RANK).to(torch.bfloat16))
    y = torch.empty(n, dtype=torch.bfloat16)
    dist.reduce_scatter_tensor(y, x)
    ref = sum((torch.arange(n * WORLD) % 7 + r) for r in range(WORLD))[RANK * n:(RANK + 1) * n]
    check(y, ref.to(torch.bfloat16), "reduce_scatter_tensor from node memory")
    st = ht.stats()
    read = {c: st[c]["bytes_node_memory"] for c in ("allgather", "reducescatter")}
    assert read["allgather"] > 0, st["allgather"]
    del out, mine, x  # back to hicoll (hcMemFree), no leak, no crash
    try:
        backend.allocate_tensor(4, dtype=torch.float32, device=torch.device("meta"))
        raise AssertionError("a non-CPU device was accepted")
    except RuntimeError as e:
        assert "host memory" in str(e), str(e)

    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (WORLD,))
    data = ex.Batches(ex.load_text(), CFG["seq_len"], 8)
    before = ht.stats()["allgather"]["bytes_node_memory"]
    with_pg = fsdp_losses(mesh, data, True, steps)
    fsdp_read = ht.stats()["allgather"]["bytes_node_memory"] - before
    plain = fsdp_losses(mesh, data, False, steps)
    assert with_pg == plain, (with_pg, plain)  # bitwise: the same sums in the same order
    assert with_pg[-1] < with_pg[0], with_pg
    dist.destroy_process_group()
    return {"read": read, "fsdp_node_memory_bytes": fsdp_read, "losses": with_pg}
