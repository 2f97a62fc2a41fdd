"""CUDA tensors with backend="hicoll": 2 ranks sharing cuda:0 (processes, CUDA IPC), on one
simulated node and on two (HICOLL_TOPO_NODE), every implemented collective against references
computed on the host; the plugin's NCCL fallback must not run any of them. Skipped without a
GPU. tests/torch/gpu_check.sh runs it on a GPU machine (with pytest, or as a script:
python tests/torch/test_gpu.py, where pytest is not installed)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import launch  # noqa: E402

try:
    import pytest
except ImportError:  # run as a script
    pytest = None

NODES = [1, 2]
TIMEOUT_S = float(os.environ.get("HICOLL_GPU_TEST_TIMEOUT_S", "180"))


def run_case(nodes: int) -> dict:
    res = launch("cuda", 2, nodes, timeout=TIMEOUT_S)
    for r in res:
        assert r["checks"] > 300, r["checks"]
        assert r["fallback_counts"] == {}, f"NCCL fallback used: {r['fallback_counts']}"
        assert r["hicoll_counts"]["_allgather_base"] > 0, r["hicoll_counts"]
    st = res[0]["stats"]
    assert st["nranks"] == 2 and st["nnodes"] == nodes, st
    # And libhicoll ran them on its device path (not its own NCCL fallback), at least mostly.
    for c in ("allgather", "reducescatter"):
        assert st[c]["hierarchical"] > 0, f"libhicoll's device path ran no {c}: {st[c]}"
    return st


if pytest is not None:
    @pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
    @pytest.mark.parametrize("nodes", NODES, ids=lambda n: f"{n}node")
    def test_cuda_collectives(nodes):
        st = run_case(nodes)
        print(f"\nnodes={nodes}: library paths: "
              + ", ".join(f"{c}={st[c]}" for c in ("allgather", "reducescatter", "allreduce",
                                                   "broadcast")))


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device")
        sys.exit(0)
    failed = 0
    for n in NODES:
        try:
            st = run_case(n)
        except Exception as e:  # noqa: BLE001 -- report every case
            failed += 1
            print(f"test_cuda_collectives[{n}node] FAILED: {e}", flush=True)
        else:
            print(f"test_cuda_collectives[{n}node] PASSED: library paths: "
                  + ", ".join(f"{c}={st[c]}" for c in ("allgather", "reducescatter",
                                                       "allreduce", "broadcast")), flush=True)
    sys.exit(1 if failed else 0)
