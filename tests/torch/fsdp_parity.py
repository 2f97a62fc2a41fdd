"""FSDP2 parity (rank side): fully_shard training vs a single-process run on the same global
batch, started by ranks.py's "fsdp" scenario. The model and data come from
examples/fsdp2_train.py."""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import fsdp2_train as ex  # noqa: E402

from ranks import RANK, WORLD, init  # noqa: E402

import hicoll.torch as ht  # noqa: E402

CFG = dict(dim=64, layers=2, heads=4, seq_len=32)


def reference_losses(data, steps: int) -> list[float]:
    """One process, whole global batch, fp32."""
    model = ex.build_model(data.vocab, **CFG)
    opt = ex.make_optimizer(model)
    out = []
    for s in range(steps):
        x, y = data.global_step(s)
        out.append(ex.train_step(model, opt, x, y).item())
    return out


def run(mode: str = "fsdp", steps: int = 20) -> dict:
    torch.set_num_threads(1)
    init()
    from torch.distributed.device_mesh import init_device_mesh
    if mode == "hsdp":
        mesh = init_device_mesh("cpu", (2, WORLD // 2), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (WORLD,))
    data = ex.Batches(ex.load_text(), CFG["seq_len"], global_batch=8)
    model = ex.shard(ex.build_model(data.vocab, **CFG), mesh, bf16=(mode == "bf16"))
    opt = ex.make_optimizer(model)
    losses = ex.train_losses(model, opt, data, steps, RANK, WORLD)
    counts = {}
    for g in {mesh.get_group(d) for d in range(mesh.ndim)}:
        for k, v in ht.hicoll_counts(g).items():
            counts[k] = counts.get(k, 0) + v
        assert not ht.fallback_counts(g), ht.fallback_reasons(g)
    assert counts.get("_allgather_base", 0) > 0 and counts.get("_reduce_scatter_base", 0) > 0, counts
    dist.barrier()
    dist.destroy_process_group()
    result = {"losses": losses, "counts": counts}
    if RANK == 0:
        ref = reference_losses(data, steps)
        rel = [abs(a - b) / abs(b) for a, b in zip(losses, ref)]
        tol = 2e-2 if mode == "bf16" else 1e-5
        assert max(rel) <= tol, f"{mode}: max relative loss difference {max(rel):.3g} > {tol}"
        assert losses[-1] < losses[0], "loss did not fall"
        result.update(ref=ref, max_rel=max(rel))
    return result
