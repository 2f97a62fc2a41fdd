"""Point-to-point with c10d tags on hicoll (rank side): send / recv / isend / irecv with tags
received in another order than sent, the same tag twice in order, recv from any source with a
tag (a decoy of another tag sent first), values checked, nothing on the fallback."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ranks import RANK, WORLD, check, init

import hicoll.torch as ht


def run() -> dict:
    init()
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    # Each rank sends the next one tags 1, 2, 3, 1; the receiver takes 3 first (1 and 2 are
    # copied aside), then 2, then tag 1 twice: the first tag 1 message before the second.
    sent = [(1, 1000), (2, 70000), (3, 8), (1, 300)]
    outs = [torch.full((n,), float(RANK * 10 + k)) for k, (_, n) in enumerate(sent)]
    sends = [dist.isend(o, nxt, tag=t) for o, (t, _) in zip(outs, sent)]
    for k in (2, 1, 0, 3):
        t, n = sent[k]
        r = torch.empty(n)
        dist.recv(r, prv, tag=t)
        check(r, torch.full((n,), float(prv * 10 + k)), f"recv tag {t} (message {k})")
    for q in sends:
        q.wait()
    # Blocking sends of two tags to the previous rank, whose receives were posted in the other
    # order.
    a, b = torch.empty(5, dtype=torch.int64), torch.empty(7, dtype=torch.int64)
    reqs = [dist.irecv(b, nxt, tag=22), dist.irecv(a, nxt, tag=21)]
    dist.send(torch.arange(5, dtype=torch.int64) + RANK, prv, tag=21)
    dist.send(torch.arange(7, dtype=torch.int64) * RANK, prv, tag=22)
    for q in reqs:
        q.wait()
    check(a, torch.arange(5, dtype=torch.int64) + nxt, "irecv tag 21")
    check(b, torch.arange(7, dtype=torch.int64) * nxt, "irecv tag 22")
    # From any source with a tag: every other rank sends rank 0 a decoy (tag 9), then tag 4.
    if RANK == 0:
        seen = []
        for _ in range(WORLD - 1):
            r = torch.empty(3)
            src = dist.recv(r, tag=4)
            check(r, torch.full((3,), float(src)), f"recv from any source with tag 4 ({src})")
            seen.append(src)
        assert sorted(seen) == list(range(1, WORLD)), seen
        for src in range(1, WORLD):
            d = torch.empty(2)
            dist.recv(d, src, tag=9)
            check(d, torch.full((2,), -float(src)), f"decoy from {src}")
    else:
        dist.send(torch.full((2,), -float(RANK)), 0, tag=9)
        dist.send(torch.full((3,), float(RANK)), 0, tag=4)
    t = torch.ones(3)
    dist.all_reduce(t)
    check(t, torch.full((3,), float(WORLD)), "all_reduce after tagged point-to-point")
    counts, calls = ht.fallback_counts(), ht.hicoll_counts()
    dist.barrier()
    dist.destroy_process_group()
    return {"hicoll_counts": calls, "fallback_counts": counts}
