"""Peer suite: a selection of PyTorch's own distributed tests
(torch/testing/_internal/distributed/distributed_test.py, shipped in the wheel) run with
BACKEND=hicoll, set up like test/distributed/test_distributed_spawn.py (which the wheel does
not ship). Each test forks WORLD_SIZE=2 processes (MultiProcessTestCase; HICOLL_PEER_SPAWN=1
spawns them, as torch's CI does)."""
import os

os.environ.setdefault("BACKEND", "hicoll")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("HICOLL_TIMEOUT_MS", "20000")

import torch  # noqa: E402
import hicoll.torch  # noqa: E402,F401  registers "hicoll" here and in every spawned rank
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# torch's suite runs its DDP and subgroup tests only on the backends its tables name; hicoll
# runs both on CPU tensors (before the suite's import: its decorators read the tables).
for _feature in ("ddp", "subgroup"):
    DistTestCases.backend_feature[_feature].add("hicoll")

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

# The collectives and point-to-point calls hicoll implements.
SELECTED = [
    "test_all_gather", "test_all_gather_complex", "test_all_gather_group",
    "test_all_gather_full_group",
    "test_broadcast", "test_broadcast_group", "test_broadcast_full_group",
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_sum_complex",
    "test_all_reduce_product", "test_all_reduce_min", "test_all_reduce_max",
    "test_all_reduce_group_sum", "test_all_reduce_group_max", "test_all_reduce_full_group_sum",
    "test_all_reduce_full_group_min", "test_all_reduce_complex_unsupported_ops",
    "test_barrier", "test_barrier_group", "test_barrier_full_group",
    "test_get_backend", "test_get_rank", "test_get_rank_size_group",
    "test_irecv", "test_isend", "test_send_recv", "test_send_recv_any_source", "test_send_recv_with_tag",
    "test_gather", "test_scatter", "test_reduce_sum",  # composed from hicoll calls
    "test_DistributedDataParallel_requires_grad",  # DDP on hicoll (the "ddp" table above)
]


class TestHicollPeer(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        # Forked, not spawned: each rank starts from this process, which imported torch, the
        # suite and hicoll already (DataLoader workers fork the same way), instead of importing
        # them again (~4 s a test on 2 cores). HICOLL_PEER_SPAWN=1: spawn, as torch's CI does.
        if os.environ.get("HICOLL_PEER_SPAWN") == "1":
            self._spawn_processes()
        else:
            self._start_processes(torch.multiprocessing.get_context("fork").Process)

    def test_send_recv_with_tag(self):
        super().test_send_recv_with_tag()
        # On hicoll's tagged point-to-point, not on gloo (checked in each spawned rank).
        counts = hicoll.torch.fallback_counts()
        assert not {"send", "recv"} & counts.keys(), (counts, hicoll.torch.fallback_reasons())
        assert hicoll.torch.hicoll_counts().get("send", 0) > 0, hicoll.torch.hicoll_counts()


# Only SELECTED is collected (conftest.py deselects the rest of _DistTestBase's tests).
