"""SMDDP v1's DistributedDataParallel: torch's, on the "smddp" (hicoll) process group."""
from torch.nn.parallel import DistributedDataParallel  # noqa: F401

from smdistributed.dataparallel.torch import torch_smddp  # noqa: F401
