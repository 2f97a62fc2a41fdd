"""The torch.distributed environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) from what SageMaker's SMDDP launcher provides, where torchrun did
not set it: Open MPI's OMPI_COMM_WORLD_* (smddprun is mpirun) and SageMaker's SM_HOSTS (the
first host is the rendezvous). Nothing is overwritten."""
import json
import os

_FROM_OMPI = {
    "RANK": "OMPI_COMM_WORLD_RANK",
    "WORLD_SIZE": "OMPI_COMM_WORLD_SIZE",
    "LOCAL_RANK": "OMPI_COMM_WORLD_LOCAL_RANK",
    "LOCAL_WORLD_SIZE": "OMPI_COMM_WORLD_LOCAL_SIZE",
}
DEFAULT_PORT = "29500"


def fill(env=os.environ) -> dict:
    """Sets the missing variables it can derive; returns those it set."""
    set_now = {}
    for key, src in _FROM_OMPI.items():
        if key not in env and src in env:
            set_now[key] = env[src]
    if "MASTER_ADDR" not in env and "SM_HOSTS" in env:
        hosts = json.loads(env["SM_HOSTS"])
        if hosts:
            set_now["MASTER_ADDR"] = sorted(hosts)[0]
    if "MASTER_PORT" not in env and ("MASTER_ADDR" in env or "MASTER_ADDR" in set_now):
        set_now["MASTER_PORT"] = DEFAULT_PORT
    env.update(set_now)
    return set_now
