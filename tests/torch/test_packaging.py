"""What a user gets from one pip install: backend "hicoll" / "smddp" without importing hicoll
(torch >= 2.14 entry points), SMDDP v2 scripts unchanged (the optional hicoll-smddp package),
and that package refusing to go over a real SMDDP."""
import importlib.util
import json
import os
import sys

import pytest
import torch

from harness import REPO, launch

TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")


@pytest.mark.skipif(TORCH < (2, 14), reason="entry-point discovery of backends is torch >= 2.14")
@pytest.mark.parametrize("backend", ["hicoll", "smddp"])
def test_init_process_group_without_import(backend):
    for r in launch(backend, 2, script="without_import.py"):
        assert r["entry_point"], "hicoll.torch was not loaded through the entry point"
        assert r["heavy"] == [], f"loading the backend imported {r['heavy']}"


@pytest.mark.skipif(importlib.util.find_spec("smdistributed") is None,
                    reason="hicoll-smddp not installed (pip install plugins/torch/smddp)")
def test_smddp_script_unchanged():
    # The ranks see only what SageMaker's SMDDP launcher (mpirun) gives them.
    def env(rank):
        return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": "2",
                "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                "SM_HOSTS": json.dumps(["127.0.0.1"])}
    res = launch("-", 2, script="smddp_script.py", unset=RANK_VARS, env_per_rank=env)
    assert [r["local_rank"] for r in res] == [0, 1]


def test_smddp_shim_refuses_over_real_smddp(tmp_path, monkeypatch):
    sys.path.insert(0, os.path.join(REPO, "plugins", "torch", "smddp", "build_backend"))
    try:
        import smddp_build
    finally:
        sys.path.pop(0)
    info = tmp_path / "smdistributed_dataparallel-1.8.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: smdistributed-dataparallel\n"
                                   "Version: 1.8.0\n")
    monkeypatch.setattr(smddp_build.sysconfig, "get_paths",
                        lambda: {"purelib": str(tmp_path), "platlib": str(tmp_path)})
    with pytest.raises(SystemExit, match="refusing to install: a real SMDDP"):
        smddp_build.build_wheel(str(tmp_path / "out"))
    monkeypatch.setattr(smddp_build.sysconfig, "get_paths",
                        lambda: {"purelib": str(tmp_path / "none"), "platlib": str(tmp_path / "none")})
    smddp_build._refuse_over_real_smddp()  # nothing there: no refusal
