"""What process groups cost a torch job (not a test): WORLD ranks on NODES simulated nodes
(HICOLL_TOPO_NODE, loopback), each making GROUPS process groups over every rank with
dist.new_group and running one small all_reduce on each (a group that spans nodes opens its
network at its first call). Prints rank 0's VmRSS after init and after every group, per
variant; the variants run one after another in fresh processes, the order alternating per round.
Variants: gloo, hicoll, hicoll with HICOLL_OFI_SHARED_ENDPOINT=0 (an endpoint per group) and
hicoll with HICOLL_OFI_RXM_LEAN=0 (rxm's own receive buffers).

    .venv/bin/python perf/torch/groups_rss.py [--world 4] [--nodes 2] [--groups 8] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "torch"))
from harness import free_port, node_labels  # noqa: E402

VARIANTS = {"gloo": ("gloo", {}), "hicoll": ("hicoll", {}),
            "hicoll SHARED=0": ("hicoll", {"HICOLL_OFI_SHARED_ENDPOINT": "0"}),
            "hicoll LEAN=0": ("hicoll", {"HICOLL_OFI_RXM_LEAN": "0"})}


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def rank_main(args) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    t = torch.ones(16)
    dist.all_reduce(t)  # the world group's network, for every variant alike
    rss = [rss_kib()]
    groups = []
    for _ in range(args.groups):
        g = dist.new_group(list(range(dist.get_world_size())), backend=args.backend)
        dist.all_reduce(t, group=g)
        groups.append(g)
        rss.append(rss_kib())
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(rss), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def launch(variant: str, args) -> list[int]:
    backend, extra_env = VARIANTS[variant]
    port, labels = free_port(), node_labels(args.world, args.nodes)
    procs = []
    for r in range(args.world):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r % (args.world // args.nodes)),
                   WORLD_SIZE=str(args.world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   HICOLL_TOPO_NODE=labels[r], GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", **extra_env)
        procs.append(subprocess.Popen([sys.executable, __file__, "--mode", "rank", "--backend", backend,
                                       "--groups", str(args.groups)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    failed = [r for r, p in enumerate(procs) if p.returncode]
    if failed or "RESULT " not in outs[0]:
        raise SystemExit(f"{variant}: ranks {failed} failed:\n" + outs[failed[0] if failed else 0][-3000:])
    return json.loads(outs[0].split("RESULT ")[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="driver", choices=["driver", "rank"])
    ap.add_argument("--backend", default="hicoll")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if args.mode == "rank":
        return rank_main(args)
    if args.world % args.nodes:
        raise SystemExit("--world must be a multiple of --nodes")
    names = list(VARIANTS)
    print(f"# {args.world} ranks on {args.nodes} simulated nodes, {args.groups} groups over every rank; "
          f"rank 0's VmRSS in MiB after init (and the world group's first call), then after each group's first call")
    for rnd in range(args.rounds):
        for v in names if rnd % 2 == 0 else names[::-1]:
            rss = launch(v, args)
            per = (rss[-1] - rss[0]) / max(1, args.groups) / 1024
            print(f"round {rnd + 1} {v:>14}: init {rss[0] / 1024:7.1f}  after {args.groups} groups "
                  f"{rss[-1] / 1024:7.1f}  per group {per:6.1f}  [{' '.join(f'{x / 1024:.0f}' for x in rss)}]",
                  flush=True)


if __name__ == "__main__":
    main()
