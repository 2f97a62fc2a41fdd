"""examples/shrink_train.py: 4 ranks on FSDP2/HSDP, the last one SIGKILLed at step 5, the
survivors shrink the group (Backend::shrink -> hcCommShrink), reload the last DCP checkpoint
and finish. Skipped until libhicoll has hcCommShrink (the plugin is then built with shrink)."""
import os
import signal
import subprocess
import sys

import pytest
import torch.distributed as dist

from harness import REPO, free_port

try:
    from hicoll import _build_info
    HAVE_SHRINK = bool(_build_info.shrink)
except ImportError:
    HAVE_SHRINK = False


@pytest.mark.skipif(not hasattr(dist, "shrink_group"), reason="torch < 2.10: no dist.shrink_group")
@pytest.mark.skipif(not HAVE_SHRINK, reason="libhicoll has no hcCommShrink yet")
def test_shrink_after_sigkill():
    port, world = free_port(), 4
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   HICOLL_TOPO_NODE=f"node{rank // 2}", OMP_NUM_THREADS="1",
                   HICOLL_TIMEOUT_MS="20000", PYTHONPATH=os.path.join(REPO, "examples"))
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(REPO, "examples", "shrink_train.py")], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert procs[-1].returncode == -signal.SIGKILL, outs[-1][-3000:]
    for rank in range(world - 1):
        assert procs[rank].returncode == 0, outs[rank][-3000:]
    line = [l for l in outs[0].splitlines() if l.startswith("RESULT ")][-1]
    import json
    res = json.loads(line[7:])
    assert res["world"] == 3 and res["resumed_from"] is not None, res
    assert res["losses"][-1] < res["losses"][0], res
    assert res["kill_to_first_shrunk_step_s"] < 20, res
