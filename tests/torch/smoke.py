"""A short smoke of an installed hicoll under torchrun (scripts/torch_compat.sh): a few
collectives (all_to_all_single too) checked against values computed here, then 5 FSDP2 steps on a tiny MLP, all on
backend "hicoll". On torch >= 2.14 it does not import hicoll: the entry point registers it."""
import os
import sys

import torch
import torch.distributed as dist

TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
if TORCH < (2, 14):
    import hicoll.torch  # noqa: F401  (no torch.distributed.backends entry points before 2.14)

dist.init_process_group("hicoll")
rank, world = dist.get_rank(), dist.get_world_size()
imported = "hicoll.torch" in sys.modules  # loaded by torch's entry point on >= 2.14
import hicoll.torch as ht  # noqa: E402

t = torch.full((7,), float(rank + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((7,), float(sum(range(1, world + 1))))), t
out = torch.empty(3 * world)
dist.all_gather_into_tensor(out, torch.full((3,), float(rank)))
assert torch.equal(out, torch.arange(world, dtype=torch.float32).repeat_interleave(3)), out
rs = torch.empty(2)
dist.reduce_scatter_tensor(rs, torch.arange(2.0 * world) + rank, op=dist.ReduceOp.AVG)
want = (torch.arange(2.0 * world) + sum(range(world)) / world).view(world, 2)[rank]
assert torch.allclose(rs, want), (rs, want)
b = torch.full((4,), float(rank))
dist.broadcast(b, src=world - 1)
assert torch.equal(b, torch.full((4,), float(world - 1))), b
g = [torch.empty(2) for _ in range(world)] if rank == 0 else None
dist.gather(torch.full((2,), float(rank)), g, dst=0)
assert rank != 0 or torch.equal(torch.stack(g)[:, 0], torch.arange(world, dtype=torch.float32))
a2a = torch.empty(2 * world)
dist.all_to_all_single(a2a, torch.arange(2.0 * world) + 100 * rank)
want = torch.cat([torch.arange(2.0 * rank, 2.0 * rank + 2) + 100 * r for r in range(world)])
assert torch.equal(a2a, want), (a2a, want)

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch < 2.6
    from torch.distributed._composable.fsdp import fully_shard
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
gen = torch.Generator().manual_seed(1)
x, y = torch.randn(64, 16, generator=gen), torch.randn(64, 1, generator=gen)
losses = []
for step in range(5):
    xs, ys = x[rank::world], y[rank::world]
    loss = torch.nn.functional.mse_loss(model(xs), ys)
    opt.zero_grad()
    loss.backward()
    opt.step()
    dist.all_reduce(loss.detach(), op=dist.ReduceOp.AVG)
    losses.append(round(loss.item(), 5))
assert losses[-1] < losses[0], losses
counts = ht.hicoll_counts()
assert counts.get("_allgather_base", 0) + counts.get("allgather_into_tensor_coalesced", 0) > 0, counts
assert not ht.fallback_counts(), ht.fallback_reasons()
if rank == 0:
    info = __import__("hicoll._build_info", fromlist=["x"])
    print(f"SMOKE ok torch {torch.__version__} world {world} registered_by="
          f"{'entry point' if imported and TORCH >= (2, 14) else 'import'} "
          f"cuda_build={ht.cuda_build()} ({info.cuda_why}) fsdp2 losses {losses}", flush=True)
dist.destroy_process_group()
