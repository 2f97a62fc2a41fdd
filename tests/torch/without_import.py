"""Rank side of test_packaging.py, as a user's script: no import of hicoll (or of ranks.py,
which imports it) before init_process_group. python without_import.py BACKEND '{}'."""
import json
import sys

import torch
import torch.distributed as dist

backend = sys.argv[1]
assert "hicoll" not in sys.modules, "hicoll imported before init_process_group"
dist.init_process_group(backend)  # env:// (the torchrun environment)
registered_by_entry_point = "hicoll.torch" in sys.modules
# What loading the backend pulled in: FSDP's modules (and sympy with them) are ~45 MB a rank,
# for FSDP2's int8 collectives only (hicoll.fsdp2, loaded on first use).
heavy = sorted(m for m in ("torch.distributed.fsdp", "sympy", "hicoll.fsdp2") if m in sys.modules)
import hicoll.torch as ht  # noqa: E402

b = dist.group.WORLD._get_backend(torch.device("cpu"))
assert isinstance(b, ht.ProcessGroupHicoll), type(b)
t = torch.full((3,), float(dist.get_rank() + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((3,), float(sum(range(1, dist.get_world_size() + 1))))), t
dist.destroy_process_group()
# A group without a hicoll backend: the counters answer {} instead of raising.
dist.init_process_group("gloo")
assert ht.fallback_counts() == {} and ht.hicoll_counts() == {} and ht.fallback_reasons() == {}
dist.destroy_process_group()
print("RESULT " + json.dumps({"entry_point": registered_by_entry_point, "backend": backend, "heavy": heavy}))
