"""Rank side of test_packaging.py: an SMDDP v2 script as SageMaker users run it, unchanged --
the torch_smddp import, backend "smddp", ranks from the launcher's Open MPI environment --
then DDP steps, SMDDP v1's API, and deepspeed.init_distributed(dist_backend="smddp")."""
import json
import os

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group(backend="smddp")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["OMPI_COMM_WORLD_RANK"]) and world == int(os.environ["OMPI_COMM_WORLD_SIZE"])
local_rank = int(os.environ["LOCAL_RANK"])
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    g = torch.Generator().manual_seed(step * 10 + rank)
    loss = model(torch.randn(4, 8, generator=g)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
import hicoll.torch as ht  # noqa: E402  (only to read the counters)

ran = ht.hicoll_counts()
assert ran.get("allreduce", 0) > 0 and not ht.fallback_counts(), (ran, ht.fallback_reasons())
dist.destroy_process_group()

import smdistributed.dataparallel.torch.distributed as sdist  # noqa: E402  (v1 API)

sdist.init_process_group()
assert sdist.get_local_rank() == local_rank and sdist.get_world_size() == world
t = torch.ones(2)
sdist.all_reduce(t)
assert torch.equal(t, torch.full((2,), float(world)))
sdist.destroy_process_group()

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402

os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)  # a fresh env:// store
deepspeed.init_distributed(dist_backend="smddp", verbose=False)
assert dist.get_backend() == "smddp", dist.get_backend()
t = torch.ones(2)
deepspeed.comm.all_reduce(t)
assert torch.equal(t, torch.full((2,), float(world)))
dist.destroy_process_group()
print("RESULT " + json.dumps({"rank": rank, "local_rank": local_rank, "hicoll": ran}))
