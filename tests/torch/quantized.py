"""hicoll.torch.QuantizedAllGather (rank side): called directly it is within the int8 format's
bound of what every rank sent and every rank holds the same bits; inputs it cannot quantize
take the exact all-gather; FSDP2 trains through it (set_custom_all_gather) close to exact."""
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
HALF_ULP = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def shard_of(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(77 + rank)
    return (torch.randn(n, generator=g) * (1 + rank)).to(dtype)


def check_direct(qag, n: int, block: int, dtype: torch.dtype) -> None:
    out = torch.empty(n * WORLD, dtype=dtype)
    mine = out[RANK * n:(RANK + 1) * n]
    mine.copy_(shard_of(RANK, n, dtype))  # in place, as FSDP2 calls it
    qag(out, mine, dist.group.WORLD)
    for r in range(WORLD):
        x = shard_of(r, n, dtype).double()
        got = out[r * n:(r + 1) * n].double()
        pad = (-n) % block
        absmax = torch.nn.functional.pad(x.abs(), (0, pad)).view(-1, block).amax(1)
        bound = absmax.repeat_interleave(block)[:n] / 254 * (1 + 1e-6) + got.abs() * HALF_ULP[dtype]
        bad = ((got - x).abs() > bound).sum().item()
        assert bad == 0, f"rank {RANK}: {dtype} block {block}: {bad} elements of rank {r} outside the bound"
    ref = out.clone()
    dist.broadcast(ref, 0)
    assert torch.equal(out.view(torch.uint8), ref.view(torch.uint8)), f"rank {RANK}: other bits than rank 0"


def check_reduce_scatter(qrs, n: int, dtype: torch.dtype, op) -> None:
    inp = torch.cat([shard_of(RANK * WORLD + j, n, dtype) for j in range(WORLD)])
    out = torch.empty(n, dtype=dtype)
    qrs(out, inp, dist.group.WORLD, op)
    parts = [torch.cat([shard_of(r * WORLD + j, n, dtype) for j in range(WORLD)]).double()[RANK * n:(RANK + 1) * n]
             for r in range(WORLD)]
    want = sum(parts) / (WORLD if op == dist.ReduceOp.AVG else 1)
    # Every partial that crossed a node is off by <= its absmax / 254 (a node sums <= WORLD inputs).
    tol = WORLD * max(p.abs().max().item() for p in parts) / 254 + want.abs() * 4 * HALF_ULP[dtype]
    bad = ((out.double() - want).abs() > tol).sum().item()
    assert bad == 0, f"rank {RANK}: quantized reduce-scatter {dtype} {op}: {bad} elements outside the bound"


def fsdp_losses(mesh, data, steps: int, comm=None, rs=None) -> list[float]:
    model = ex.shard(ex.build_model(data.vocab, **CFG), mesh)
    if comm is not None:
        ex.use_custom_all_gather(model, comm)
    if rs is not None:
        for m in model.modules():
            if hasattr(m, "set_custom_reduce_scatter"):
                m.set_custom_reduce_scatter(rs)
    return ex.train_losses(model, ex.make_optimizer(model), data, steps, RANK, WORLD)


def run(steps: int = 12) -> dict:
    torch.set_num_threads(1)
    init()
    qag = ht.QuantizedAllGather()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for n, block in ((1000, 256), (70001, 256), (5000, 2048)):
            check_direct(qag, n, block, dtype)
    assert qag.quantized_calls == 9 and qag.exact_calls == 0, (qag.quantized_calls, qag.exact_calls)
    assert ht.stats()["allgather"]["quantized"] == 9, ht.stats()["allgather"]

    # FSDP2's uint8 buffers (mixed dtypes) cannot be quantized: exact, and exactly right.
    out = torch.empty(100 * WORLD, dtype=torch.uint8)
    qag(out, torch.full((100,), RANK, dtype=torch.uint8), dist.group.WORLD)
    assert torch.equal(out, torch.arange(WORLD, dtype=torch.uint8).repeat_interleave(100)), out
    assert qag.exact_calls == 1

    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (WORLD,))
    data = ex.Batches(ex.load_text(), CFG["seq_len"], 8)
    exact = fsdp_losses(mesh, data, steps)
    fsdp_qag = ht.QuantizedAllGather()
    quant = fsdp_losses(mesh, data, steps, fsdp_qag)
    assert fsdp_qag.quantized_calls > 0, "FSDP2 called the custom all-gather"
    rel = max(abs(a - b) / abs(b) for a, b in zip(quant, exact))
    assert quant != exact, "the quantized run is not bitwise the exact one"
    assert rel < 2e-2, (rel, quant, exact)
    assert quant[-1] < quant[0], quant

    qrs = ht.QuantizedReduceScatter()
    for dtype in (torch.float32, torch.bfloat16):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            check_reduce_scatter(qrs, 70001, dtype, op)
    assert qrs.quantized_calls == 4 and qrs.exact_calls == 0, (qrs.quantized_calls, qrs.exact_calls)
    out = torch.empty(10)
    qrs(out, torch.full((10 * WORLD,), float(RANK)), dist.group.WORLD, dist.ReduceOp.MAX)  # exact, warned
    assert qrs.exact_calls == 1 and torch.equal(out, torch.full((10,), float(WORLD - 1))), out
    both_qrs = ht.QuantizedReduceScatter()
    both = fsdp_losses(mesh, data, steps, ht.QuantizedAllGather(), both_qrs)
    assert both_qrs.quantized_calls > 0, "FSDP2 called the custom reduce-scatter"
    rel_both = max(abs(a - b) / abs(b) for a, b in zip(both, exact))
    assert rel_both < 2e-2, (rel_both, both, exact)
    dist.destroy_process_group()
    return {"max_rel": rel, "max_rel_both": rel_both, "fsdp_quantized_calls": fsdp_qag.quantized_calls,
            "exact": exact, "quantized": quant, "both": both}
