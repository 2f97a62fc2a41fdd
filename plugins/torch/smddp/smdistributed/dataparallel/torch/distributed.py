"""SMDDP v1's ``smdistributed.dataparallel.torch.distributed`` on torch.distributed with
backend "smddp" (hicoll): the calls v1 scripts make."""
import os

import torch.distributed as _dist
from torch.distributed import *  # noqa: F401,F403  all_reduce, barrier, ReduceOp, ...

from smdistributed.dataparallel.torch import torch_smddp  # noqa: F401  registers "smddp"


def init_process_group(backend: str = "smddp", **kwargs):
    if not _dist.is_initialized():
        _dist.init_process_group(backend=backend, **kwargs)


def is_available() -> bool:
    return True


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def get_local_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def get_local_world_size() -> int:
    return get_local_size()
