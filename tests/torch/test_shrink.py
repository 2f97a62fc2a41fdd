"""examples/shrink_train.py: 4 ranks on FSDP2/HSDP, the last one SIGKILLed at step 5, the
survivors shrink the group (Backend::shrink -> hcCommShrink), reload the last DCP checkpoint
and finish (skipped on a torch without dist.shrink_group or a plugin built without shrink)."""
import os
import signal
import subprocess
import sys

import pytest
import torch.distributed as dist

from harness import REPO

try:
    from hicoll import _build_info
    HAVE_SHRINK = bool(_build_info.shrink)
except ImportError:
    HAVE_SHRINK = False


@pytest.mark.skipif(not hasattr(dist, "shrink_group"), reason="torch < 2.10: no dist.shrink_group")
@pytest.mark.skipif(not HAVE_SHRINK, reason="libhicoll has no hcCommShrink yet")
def test_shrink_after_sigkill():
    """The example as its docstring runs it (--spawn 4: its own launcher, not torchrun's
    agent, which kills the survivors when one rank dies)."""
    env = dict(os.environ, HICOLL_TIMEOUT_MS="20000")
    env.pop("HICOLL_TOPO_NODE", None)
    p = subprocess.run([sys.executable, os.path.join(REPO, "examples", "shrink_train.py"), "--spawn", "4"],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    out = p.stdout
    assert p.returncode == 0, out[-4000:]
    assert "exit codes [0, 0, 0, -9] (as expected)" in out, out[-4000:]
    import json
    res = json.loads([l for l in out.splitlines() if l.startswith("RESULT ")][-1][7:])
    assert res["world"] == 3 and res["resumed_from"] is not None, res
    assert res["losses"][-1] < res["losses"][0], res
    assert res["kill_to_first_shrunk_step_s"] < 20, res
