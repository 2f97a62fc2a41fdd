"""Rank side of the torch tests: python ranks.py SCENARIO JSON-ARGS (launched by harness.py).

Every check compares against a reference computed here from every rank's inputs, which each
rank can regenerate (inputs are a deterministic function of rank, case and dtype) -- never
against gloo. A rank prints "RESULT {json}" and exits 0 when all of its checks pass.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

import hicoll.torch as ht

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
TIMEOUT = datetime.timedelta(seconds=90)

FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
DTYPES = FLOATS + INTS
OPS = ["SUM", "AVG", "PREMUL_SUM", "MIN", "MAX", "PRODUCT"]
PREMUL = 0.375  # exact in every float dtype


def store(offset: int = 0) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]) + offset, WORLD,
                         is_master=RANK == 0, timeout=TIMEOUT)


def init(backend: str = "hicoll", offset: int = 0) -> None:
    dist.init_process_group(backend, store=store(offset), rank=RANK, world_size=WORLD,
                            timeout=TIMEOUT)


def make_input(rank: int, n: int, dtype: torch.dtype, case: int, op: str | None = None):
    """Small integers (exact in every dtype and for every op at world size <= 4)."""
    g = torch.Generator().manual_seed(1000 * case + rank)
    lo, hi = (-2, 3) if op == "PRODUCT" else (-3, 4)
    if dtype == torch.uint8:
        lo, hi = (1, 3) if op == "PRODUCT" else (0, 7)
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def redop(op: str):
    if op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(PREMUL)
    return getattr(dist.ReduceOp, op)


def reference(inputs: list[torch.Tensor], op: str, dtype: torch.dtype) -> torch.Tensor:
    """Reduction over ranks in float64 / int64, rounded once to dtype (as hicoll does)."""
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    x = torch.stack([t.to(wide) for t in inputs])
    if op == "SUM":
        r = x.sum(0)
    elif op == "AVG":
        r = x.sum(0) / len(inputs) if dtype.is_floating_point else torch.div(
            x.sum(0), len(inputs), rounding_mode="trunc")
    elif op == "PREMUL_SUM":
        r = (x * PREMUL).sum(0)
    elif op == "MIN":
        r = x.min(0).values
    elif op == "MAX":
        r = x.max(0).values
    else:
        r = x.prod(0)
    return r.to(dtype)


def check(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    tol = {torch.bfloat16: 1e-2, torch.float16: 1e-3, torch.float32: 1e-6}.get(got.dtype, 0.0)
    try:
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    except AssertionError as e:
        raise AssertionError(f"rank {RANK}: {what}: {e}") from None


def supports(op: str, dtype: torch.dtype) -> bool:
    return not (op == "PREMUL_SUM" and not dtype.is_floating_point)


# ------------------------------------------------------------------------------------------
def scenario_collectives(sizes=(1, 5, 4099), big: int = 1 << 20) -> dict:
    """Every implemented collective x op x dtype x size, in-place and out-of-place."""
    init()
    ngroup = dist.get_world_size()
    checks = 0
    case = 0
    for dtype in DTYPES:
        for n in sizes:
            case += 1
            # all_gather_into_tensor: out-of-place, in-place, non-contiguous output.
            inputs = [make_input(r, n, dtype, case) for r in range(ngroup)]
            want = torch.cat(inputs)
            out = torch.empty(ngroup * n, dtype=dtype)
            dist.all_gather_into_tensor(out, inputs[RANK])
            check(out, want, f"all_gather_into_tensor {dtype} n={n}")
            buf = torch.zeros(ngroup * n, dtype=dtype)
            buf[RANK * n:(RANK + 1) * n] = inputs[RANK]
            dist.all_gather_into_tensor(buf, buf[RANK * n:(RANK + 1) * n])
            check(buf, want, f"in-place all_gather_into_tensor {dtype} n={n}")
            nc = torch.zeros(2, ngroup * n, dtype=dtype)[1]
            nc_view = torch.zeros(ngroup * n, 2, dtype=dtype)[:, 0]  # stride 2
            dist.all_gather_into_tensor(nc_view, inputs[RANK])
            check(nc_view, want, f"non-contiguous all_gather_into_tensor {dtype} n={n}")
            del nc
            # all_gather (list) and broadcast from every root.
            outs = [torch.empty(n, dtype=dtype) for _ in range(ngroup)]
            dist.all_gather(outs, inputs[RANK])
            check(torch.cat(outs), want, f"all_gather {dtype} n={n}")
            for root in range(ngroup):
                t = inputs[RANK].clone()
                dist.broadcast(t, src=root)
                check(t, inputs[root], f"broadcast root={root} {dtype} n={n}")
            checks += 4 + ngroup
            for op in OPS:
                if not supports(op, dtype):
                    continue
                case += 1
                # reduce_scatter_tensor: out-of-place and in-place.
                ins = [make_input(r, ngroup * n, dtype, case, op) for r in range(ngroup)]
                want = reference(ins, op, dtype).view(ngroup, n)[RANK]
                out = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(out, ins[RANK].clone(), op=redop(op))
                check(out, want, f"reduce_scatter_tensor {op} {dtype} n={n}")
                buf = ins[RANK].clone()
                dist.reduce_scatter_tensor(buf[RANK * n:(RANK + 1) * n], buf, op=redop(op))
                check(buf[RANK * n:(RANK + 1) * n], want,
                      f"in-place reduce_scatter_tensor {op} {dtype} n={n}")
                # reduce_scatter (list of inputs).
                out = torch.empty(n, dtype=dtype)
                dist.reduce_scatter(out, list(ins[RANK].clone().view(ngroup, n).unbind(0)),
                                    op=redop(op))
                check(out, want, f"reduce_scatter {op} {dtype} n={n}")
                # all_reduce: contiguous and a strided view.
                t = make_input(RANK, n, dtype, case + 7, op)
                want_ar = reference([make_input(r, n, dtype, case + 7, op)
                                     for r in range(ngroup)], op, dtype)
                dist.all_reduce(t, op=redop(op))
                check(t, want_ar, f"all_reduce {op} {dtype} n={n}")
                base = torch.zeros(n, 3, dtype=dtype)
                base[:, 1] = make_input(RANK, n, dtype, case + 7, op)
                view = base[:, 1]
                dist.all_reduce(view, op=redop(op))
                check(base[:, 1], want_ar, f"strided all_reduce {op} {dtype} n={n}")
                check(base[:, 0], torch.zeros(n, dtype=dtype), "all_reduce wrote outside view")
                checks += 5
    # Coalesced forms (the fast path of _coalescing_manager) and async issue order.
    rs_in = [torch.arange(ngroup * k, dtype=torch.float32) + RANK for k in (2, 3, 5)]
    rs_out = [torch.empty(k) for k in (2, 3, 5)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(rs_out, rs_in):
            dist.reduce_scatter_tensor(o, i, op=dist.ReduceOp.SUM)
    cm.wait()
    for o, k in zip(rs_out, (2, 3, 5)):
        want = sum(torch.arange(ngroup * k, dtype=torch.float32) + r for r in range(ngroup))
        check(o, want.view(ngroup, k)[RANK], f"reduce_scatter_tensor_coalesced k={k}")
    ag_in = [torch.full((k,), float(RANK + k)) for k in (1, 4)]
    ag_out = [torch.empty(ngroup * k) for k in (1, 4)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(ag_out, ag_in):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    for o, k in zip(ag_out, (1, 4)):
        check(o, torch.cat([torch.full((k,), float(r + k)) for r in range(ngroup)]),
              f"allgather_into_tensor_coalesced k={k}")
    ar = [torch.full((k,), float(RANK + 1)) for k in (2, 7)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for t in ar:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
    cm.wait()
    for t in ar:
        check(t, torch.full_like(t, float(ngroup)), "allreduce_coalesced MAX")
    checks += 7
    # Large buffer: more than one pipeline chunk.
    big = big // ngroup * ngroup
    x = make_input(RANK, big, torch.float32, 4242)
    out = torch.empty(ngroup * big)
    dist.all_gather_into_tensor(out, x)
    check(out, torch.cat([make_input(r, big, torch.float32, 4242) for r in range(ngroup)]),
          "large all_gather_into_tensor")
    rs = torch.empty(big // ngroup)
    dist.reduce_scatter_tensor(rs, x)
    want = reference([make_input(r, big, torch.float32, 4242) for r in range(ngroup)], "SUM",
                     torch.float32).view(ngroup, -1)[RANK]
    check(rs, want, "large reduce_scatter_tensor")
    # Many async calls in flight, completed in issue order.
    works, ts = [], []
    for i in range(20):
        t = torch.full((16,), float(i + RANK))
        ts.append(t)
        works.append(dist.all_reduce(t, async_op=True))
    works[-1].wait()
    assert all(w.is_completed() for w in works), "an earlier call completed after a later one"
    for i, t in enumerate(ts):
        check(t, torch.full((16,), float(ngroup * i + sum(range(ngroup)))), f"async #{i}")
    dist.barrier()
    checks += 23
    counts = ht.hicoll_counts()
    assert not ht.fallback_counts(), f"unexpected fallbacks: {ht.fallback_reasons()}"
    st = ht.stats()
    dist.destroy_process_group()
    return {"checks": checks, "hicoll_counts": counts, "stats": st}


def scenario_work_api() -> dict:
    """Work objects: is_completed, wait(timeout), get_future, exceptions."""
    init()
    t = torch.ones(8) * (RANK + 1)
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future()
    res = fut.wait()
    assert isinstance(res, list) and res[0] is not None
    check(t, torch.full((8,), float(sum(range(1, WORLD + 1)))), "future result")
    assert w.is_completed() and w.is_success()
    # The Work completes before its future: whoever the future wakes sees is_completed().
    for i in range(50):
        w = dist.all_reduce(torch.ones(4), async_op=True)
        w.get_future().wait()
        assert w.is_completed() and w.is_success(), f"future done before its Work (call {i})"
    # A peer late by 3 s: a short wait times out, a later wait succeeds.
    if RANK == 1:
        time.sleep(3)
    w = dist.barrier(async_op=True)
    timed_out = False
    if RANK == 0:
        try:
            w.wait(timeout=datetime.timedelta(milliseconds=300))
        except Exception as e:  # DistBackendError
            timed_out = "timed out" in str(e)
    w.wait()
    assert RANK != 0 or timed_out, "wait(300 ms) did not time out while a peer was 3 s late"
    # Shape mismatch is refused on the caller's thread with a clear message.
    try:
        dist.all_gather_into_tensor(torch.empty(3), torch.empty(2))
        raise AssertionError("mismatched sizes accepted")
    except (RuntimeError, ValueError) as e:
        assert "all_gather" in str(e) or "elements" in str(e), str(e)
    dist.barrier()
    dist.destroy_process_group()
    return {"ok": True}


BITWISE = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}


def bitwise_input(rank: int, n: int, dtype: torch.dtype, case: int) -> torch.Tensor:
    """Random bits over the whole type (negatives too), 0 / all ones / min / max first."""
    g = torch.Generator().manual_seed(7000 * case + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    info = torch.iinfo(dtype)
    t = torch.randint(info.min, info.max, (n,), generator=g, dtype=dtype)
    edges = torch.tensor([0, info.min, info.max, -1 if info.min < 0 else info.max], dtype=dtype)
    t[:min(n, 4)] = edges[(torch.arange(min(n, 4)) + rank) % 4]
    return t


def bitwise_checks(gloo) -> int:
    """all_reduce / reduce_scatter_tensor / reduce with BAND / BOR / BXOR on int32, int64, uint8
    and bool: on hicoll, equal to the reduction computed here and to gloo's (the group gloo);
    on floating dtypes an error naming the op and the dtype on every rank, as gloo raises."""
    n_ranks, last, checks, case = WORLD, WORLD - 1, 0, 0
    for dtype in (torch.int32, torch.int64, torch.uint8, torch.bool):
        for op, fn in BITWISE.items():
            for n in (1, 7, 1029):
                case += 1
                ins = [bitwise_input(r, n * n_ranks, dtype, case) for r in range(n_ranks)]
                want = ins[0]
                for x in ins[1:]:
                    want = fn(want, x)
                what = f"{op} {dtype} n={n}"
                t, g = ins[RANK].clone(), ins[RANK].clone()
                dist.all_reduce(t, op=redop(op))
                dist.all_reduce(g, op=redop(op), group=gloo)
                check(t, want, f"all_reduce {what}")
                check(t, g, f"all_reduce {what} vs gloo")
                out, gout = torch.empty(n, dtype=dtype), torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(out, ins[RANK].clone(), op=redop(op))
                dist.reduce_scatter_tensor(gout, ins[RANK].clone(), op=redop(op), group=gloo)
                check(out, want[RANK * n:(RANK + 1) * n], f"reduce_scatter_tensor {what}")
                check(out, gout, f"reduce_scatter_tensor {what} vs gloo")
                for dst in (0, last):
                    t, g = ins[RANK].clone(), ins[RANK].clone()
                    dist.reduce(t, dst=dst, op=redop(op))
                    dist.reduce(g, dst=dst, op=redop(op), group=gloo)
                    if RANK == dst:  # gloo leaves partial results on the other ranks
                        check(t, want, f"reduce dst={dst} {what}")
                        check(t, g, f"reduce dst={dst} {what} vs gloo")
                    else:
                        check(t, ins[RANK], f"reduce dst={dst} {what} (not the root: unchanged)")
                checks += 7
    for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16"), (torch.float64, "float64")):
        for op in BITWISE:
            for call in ("all_reduce", "reduce_scatter_tensor"):
                try:
                    if call == "all_reduce":
                        dist.all_reduce(torch.ones(3, dtype=dtype), op=redop(op))
                    else:
                        dist.reduce_scatter_tensor(torch.empty(2, dtype=dtype),
                                                   torch.ones(2 * n_ranks, dtype=dtype), op=redop(op))
                except RuntimeError as e:
                    assert op.lower() in str(e) and name in str(e), str(e)
                else:
                    raise AssertionError(f"rank {RANK}: {call} {op} of {dtype} succeeded")
                try:
                    dist.all_reduce(torch.ones(3, dtype=dtype), op=redop(op), group=gloo)
                    raise AssertionError(f"rank {RANK}: gloo ran {op} of {dtype}")
                except RuntimeError as e:
                    assert "non-integral" in str(e), str(e)
                checks += 1
    t = torch.full((3,), float(RANK))  # the group goes on
    dist.all_reduce(t)
    check(t, torch.full((3,), float(sum(range(n_ranks)))), "all_reduce after the refused ones")
    return checks + 1


def scenario_fallback() -> dict:
    """Nothing here goes to gloo: gather / scatter / reduce / all_gather_coalesced are composed
    of hicoll's calls, BAND / BOR / BXOR run on hicoll (and equal gloo's results), results
    right; fallback_counts() stays empty."""
    init()
    n = WORLD
    # send/recv ring
    t = torch.full((4,), float(RANK))
    r = torch.empty(4)
    reqs = [dist.isend(t, (RANK + 1) % n), dist.irecv(r, (RANK - 1) % n)]
    for q in reqs:
        q.wait()
    check(r, torch.full((4,), float((RANK - 1) % n)), "isend/irecv")
    # gather / scatter / reduce / all_gather_coalesced: composed by hicoll from its calls.
    last = n - 1
    for dst in (0, last):
        g = [torch.empty(3) for _ in range(n)] if RANK == dst else None
        dist.gather(torch.full((3,), float(RANK)), g, dst=dst)
        if RANK == dst:
            check(torch.stack(g), torch.arange(n, dtype=torch.float32)[:, None].expand(n, 3),
                  f"gather dst={dst}")
        s = torch.empty(3)
        dist.scatter(s, [torch.full((3,), float(i * 10 + dst)) for i in range(n)]
                     if RANK == dst else None, src=dst)
        check(s, torch.full((3,), float(RANK * 10 + dst)), f"scatter src={dst}")
        for op, want in (("SUM", float(sum(range(1, n + 1)))),
                         ("AVG", sum(range(1, n + 1)) / n), ("MAX", float(n))):
            t = torch.full((5,), float(RANK + 1))
            dist.reduce(t, dst=dst, op=redop(op))
            check(t, torch.full((5,), want) if RANK == dst else torch.full((5,), float(RANK + 1)),
                  f"reduce {op} dst={dst}")
    ins = [torch.full((2,), float(RANK)), torch.arange(3.0).view(3, 1) + RANK,
           torch.full((1,), RANK + 0.5)]
    outs = [[torch.empty_like(t) for t in ins] for _ in range(n)]
    dist.all_gather_coalesced(outs, ins)
    for r in range(n):
        check(outs[r][0], torch.full((2,), float(r)), "all_gather_coalesced [0]")
        check(outs[r][1], torch.arange(3.0).view(3, 1) + r, "all_gather_coalesced [1]")
        check(outs[r][2], torch.full((1,), r + 0.5), "all_gather_coalesced [2]")
    # gather_object / scatter_object_list (DCP's metadata exchange) ride on gather/scatter.
    got = [None] * n if RANK == 0 else None
    dist.gather_object({"r": RANK}, got, dst=0)
    if RANK == 0:
        assert got == [{"r": r} for r in range(n)], got
    obj = [None]
    dist.scatter_object_list(obj, [f"to{r}" for r in range(n)] if RANK == 0 else None, src=0)
    assert obj == [f"to{RANK}"], obj
    # The bitwise reductions, against gloo on a gloo group of the same ranks.
    bitwise = bitwise_checks(dist.new_group(backend="gloo"))
    # all_gather_object uses allgather on byte tensors (hicoll) -- still no fallback.
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": RANK})
    assert objs == [{"rank": r} for r in range(n)], objs
    counts, reasons = ht.fallback_counts(), ht.fallback_reasons()
    for op in ("send", "recv"):  # point-to-point runs on hicoll (scenario_p2p)
        assert op not in counts and ht.hicoll_counts().get(op, 0) >= 1, (op, counts)
    for op in ("gather", "scatter", "reduce", "allgather_coalesced"):
        assert op not in counts and ht.hicoll_counts().get(op, 0) >= 1, (op, counts)
    assert not counts, (counts, reasons)
    dist.barrier()
    dist.destroy_process_group()
    return {"fallback_counts": counts, "reasons": reasons, "bitwise_checks": bitwise}


def scenario_p2p(big: int = 1 << 20) -> dict:
    """send / recv / isend / irecv / batch_isend_irecv / recv from any source on hicoll, values
    checked, nothing on the fallback: a pair that both send first (big tensors), several dtypes,
    a non-contiguous receive, a collective between them."""
    init()
    n = WORLD
    nxt, prv = (RANK + 1) % n, (RANK - 1) % n
    for peer in range(1, n):  # blocking ping-pong, rank 0 with each
        if RANK == 0:
            t = torch.arange(5, dtype=torch.float32) + peer
            dist.send(t, peer)
            r = torch.empty(5)
            dist.recv(r, peer)
            check(r, t * 2, f"ping-pong with {peer}")
        elif RANK == peer:
            r = torch.empty(5)
            dist.recv(r, 0)
            dist.send(r * 2, 0)
    for size in (0, 1, 4099, big):  # every rank sends first: the Works complete independently
        out, inp = torch.full((size,), float(RANK)), torch.empty(size)
        reqs = [dist.isend(out, nxt), dist.irecv(inp, prv)]
        for q in reqs:
            q.wait()
        check(inp, torch.full((size,), float(prv)), f"isend/irecv of {size}")
    a, b = torch.arange(6, dtype=torch.int64) + 10 * RANK, torch.empty(6, dtype=torch.int64)
    c, d = torch.full((3,), RANK, dtype=torch.bfloat16), torch.empty(3, dtype=torch.bfloat16)
    src_nc, nc = (torch.arange(12.0) + RANK).view(4, 3), torch.zeros(4, 6)[:, ::2]
    ops = [dist.P2POp(dist.isend, a, nxt), dist.P2POp(dist.irecv, b, prv),
           dist.P2POp(dist.isend, c, prv), dist.P2POp(dist.irecv, d, nxt),
           dist.P2POp(dist.isend, src_nc, nxt), dist.P2POp(dist.irecv, nc, prv)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    check(b, torch.arange(6, dtype=torch.int64) + 10 * prv, "batch int64")
    check(d, torch.full((3,), nxt, dtype=torch.bfloat16), "batch bfloat16")
    check(nc, (torch.arange(12.0) + prv).view(4, 3), "batch non-contiguous receive")
    if RANK == 0:  # from any source: each other rank once
        seen = []
        for _ in range(n - 1):
            r = torch.empty(2)
            src = dist.recv(r)
            check(r, torch.full((2,), float(src)), f"recv from any source ({src})")
            seen.append(src)
        assert sorted(seen) == list(range(1, n)), seen
    else:
        dist.send(torch.full((2,), float(RANK)), 0)
    t = torch.ones(3)
    dist.all_reduce(t)
    check(t, torch.full((3,), float(n)), "all_reduce after point-to-point")
    counts, calls = ht.fallback_counts(), ht.hicoll_counts()
    for op in ("send", "recv", "recvAnysource"):
        assert op not in counts, (op, counts, ht.fallback_reasons())
    dist.barrier()
    dist.destroy_process_group()
    return {"hicoll_counts": calls, "fallback_counts": counts}


def scenario_monitored_barrier(late: tuple = (2, 3)) -> dict:
    """monitored_barrier on hicoll: passes when every rank comes; when ranks come late, rank 0
    names them (wait_all_ranks) within the timeout and every rank's call fails."""
    init()
    for wait_all in (False, True):
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=20), wait_all_ranks=wait_all)
    counts = ht.fallback_counts()
    assert "monitoredBarrier" not in counts, counts
    if RANK in late:
        time.sleep(4)
    t0, err = time.time(), ""
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=1.5), wait_all_ranks=True)
    except Exception as e:  # noqa: BLE001 -- checked below
        err = str(e)
    elapsed = time.time() - t0
    assert err, "a monitored barrier with late ranks passed"
    if RANK == 0:
        names = ", ".join(str(r) for r in late)
        assert f"rank{'s' if len(late) > 1 else ''} {names} failed to pass monitoredBarrier in 1500 ms" in err, err
        assert elapsed < 1.5 + 2.0, elapsed
    dist.destroy_process_group()
    return {"error": err, "elapsed": elapsed}


def alltoall_block(src: int, dst: int, rows: int, dtype: torch.dtype, cols: int = 3) -> torch.Tensor:
    """The rows rank src sends rank dst: a function of both (exact in every dtype)."""
    v = (torch.arange(rows * cols).view(rows, cols) + 7 * src + 3 * dst) % 100
    if dtype == torch.bool:
        return (v % 2).to(torch.bool)
    if dtype.is_complex:
        return torch.complex(v.float(), -v.float()).to(dtype)
    return v.to(dtype)


def scenario_alltoall() -> dict:
    """all_to_all_single (equal and uneven splits, zeros, 2-D rows, any dtype, a non-contiguous
    output, input and output the same tensor) and all_to_all (tensors of different sizes) run
    on hicoll (hcAllToAllv), against blocks each rank recomputes; none falls back."""
    init()
    n, checks = WORLD, 0
    rows = lambda s, d, case: (s + 2 * d + case) % 4  # uneven, zeros included
    for case, dtype in enumerate([torch.float32, torch.bfloat16, torch.int64, torch.uint8,
                                  torch.bool, torch.complex64, torch.float64]):
        # Uneven splits along dim 0 of 2-D tensors.
        send = torch.cat([alltoall_block(RANK, d, rows(RANK, d, case), dtype) for d in range(n)])
        want = torch.cat([alltoall_block(s, RANK, rows(s, RANK, case), dtype) for s in range(n)])
        out = torch.empty_like(want)
        dist.all_to_all_single(out, send, output_split_sizes=[rows(s, RANK, case) for s in range(n)],
                               input_split_sizes=[rows(RANK, d, case) for d in range(n)])
        check(out, want, f"all_to_all_single uneven {dtype}")
        # Equal splits (none given).
        send = torch.cat([alltoall_block(RANK, d, 2, dtype) for d in range(n)])
        want = torch.cat([alltoall_block(s, RANK, 2, dtype) for s in range(n)])
        out = torch.empty_like(want)
        dist.all_to_all_single(out, send)
        check(out, want, f"all_to_all_single equal {dtype}")
        checks += 2
    # A non-contiguous output (a transposed view) and the same tensor as input and output.
    send = torch.cat([alltoall_block(RANK, d, 2, torch.float32, cols=4) for d in range(n)])
    want = torch.cat([alltoall_block(s, RANK, 2, torch.float32, cols=4) for s in range(n)])
    out = torch.empty(4, 2 * n).t()
    dist.all_to_all_single(out, send)
    check(out, want, "all_to_all_single into a transposed view")
    same = send.clone()
    dist.all_to_all_single(same, same)
    check(same, want, "all_to_all_single with input and output one tensor")
    # all_to_all of tensors whose sizes differ per pair; async, then wait.
    ins = [alltoall_block(RANK, d, 1 + rows(RANK, d, 9), torch.float32) for d in range(n)]
    outs = [torch.empty(1 + rows(s, RANK, 9), 3) for s in range(n)]
    dist.all_to_all(outs, ins, async_op=True).wait()
    for s in range(n):
        check(outs[s], alltoall_block(s, RANK, 1 + rows(s, RANK, 9), torch.float32), f"all_to_all from {s}")
    checks += 2 + n
    counts, hc = ht.fallback_counts(), ht.hicoll_counts()
    assert "alltoall_base" not in counts and "alltoall" not in counts, counts
    assert hc.get("alltoall_base", 0) == 16 and hc.get("alltoall", 0) == 1, hc
    st = ht.stats()
    dist.destroy_process_group()
    return {"checks": checks, "stats": st}


def scenario_forced_fallback() -> dict:
    """HICOLL_FORCE_FALLBACK=allgather,reducescatter: those go to gloo (AVG emulated)."""
    init()
    x = torch.full((4,), float(RANK))
    out = torch.empty(4 * WORLD)
    dist.all_gather_into_tensor(out, x)
    check(out, torch.arange(WORLD, dtype=torch.float32).repeat_interleave(4), "forced allgather")
    for op, want in (("AVG", sum(range(WORLD)) / WORLD), ("PREMUL_SUM", PREMUL * sum(range(WORLD))),
                     ("SUM", sum(range(WORLD)))):
        o = torch.empty(2)
        dist.reduce_scatter_tensor(o, torch.full((2 * WORLD,), float(RANK)), op=redop(op))
        check(o, torch.full((2,), float(want)), f"forced reduce_scatter {op}")
    t = torch.full((3,), float(RANK))
    dist.all_reduce(t, op=dist.ReduceOp.AVG)  # not forced: hicoll
    check(t, torch.full((3,), sum(range(WORLD)) / WORLD), "allreduce AVG")
    counts, hc = ht.fallback_counts(), ht.hicoll_counts()
    assert counts == {"_allgather_base": 1, "_reduce_scatter_base": 3}, counts
    assert hc.get("allreduce") == 1 and "_allgather_base" not in hc, hc
    assert "HICOLL_FORCE_FALLBACK" in ht.fallback_reasons()["_allgather_base"]
    dist.destroy_process_group()
    return {"fallback_counts": counts}


def scenario_options() -> dict:
    """pg_options=hicoll.torch.Options(...): per-group configuration, the environment untouched."""
    dist.init_process_group("hicoll", store=store(), rank=RANK, world_size=WORLD, timeout=TIMEOUT,
                            pg_options=ht.Options(algo="ring", force_fallback="broadcast", name="world"))
    world = ht.config()
    assert world["algo"] == "ring" and world["force_fallback"] == "broadcast", world
    assert world["name"] == "world", world
    assert os.environ.get("HICOLL_ALGO") is None, "the environment is not how a group is configured"
    t = torch.full((1 << 12,), float(RANK))
    dist.all_reduce(t)
    check(t, torch.full((1 << 12,), float(sum(range(WORLD)))), "allreduce on the ring")
    st = ht.stats()
    assert st["allreduce"]["ring"] == 1 and st["allreduce"]["hierarchical"] == 0, st["allreduce"]
    b = torch.full((3,), float(RANK))
    dist.broadcast(b, 0)
    assert ht.fallback_counts().get("broadcast") == 1, ht.fallback_counts()
    # A new group with its own options; the default group keeps its own.
    g = dist.new_group(list(range(WORLD)), pg_options=ht.Options(net_window=2, chunk_size=65536, quant_min_nodes=0))
    sub = ht.config(g)
    assert sub["algo"] == "auto" and sub["net_window"] == 2 and sub["chunk_size"] == 65536, sub
    assert sub["quant_min_nodes"] == 0 and world["quant_min_nodes"] == 2, (sub, world)
    t = torch.full((1 << 12,), 1.0)
    dist.all_reduce(t, group=g)
    check(t, torch.full((1 << 12,), float(WORLD)), "allreduce on the new group")
    assert ht.stats(g)["allreduce"]["hierarchical"] == 1, ht.stats(g)["allreduce"]
    # topo_node: one label on every rank makes the group one node (the world's ranks are two).
    one = dist.new_group(list(range(WORLD)), pg_options=ht.Options(topo_node="one"))
    one_cfg, one_st = ht.config(one), ht.stats(one)
    assert one_cfg["topo_node"] == "one" and world["topo_node"] != "one", (one_cfg, world)
    assert one_st["nnodes"] == 1 and ht.stats()["nnodes"] == WORLD, (one_st, ht.stats())
    # A bad value is the same error the variable gives, naming the field.
    try:
        dist.new_group(list(range(WORLD)), pg_options=ht.Options(net_window=0))
        raise AssertionError("net_window=0 was accepted")
    except Exception as e:  # noqa: BLE001 - torch wraps it
        assert "netWindow" in str(e) and "HICOLL_NET_WINDOW" in str(e), str(e)
    dist.destroy_process_group()
    return {"world": world, "sub": sub}


def scenario_subgroups() -> dict:
    """new_group([0, 2]) and a 2x2 DeviceMesh: each group has its own communicator."""
    from torch.distributed.device_mesh import init_device_mesh
    init()
    checks = 0
    sub = dist.new_group([0, 2])
    if RANK in (0, 2):
        assert isinstance(sub._get_backend(torch.device("cpu")), ht.ProcessGroupHicoll)
        t = torch.full((6,), float(RANK + 1))
        dist.all_reduce(t, group=sub)
        check(t, torch.full((6,), 4.0), "new_group([0,2]) all_reduce")
        out = torch.empty(4)
        dist.all_gather_into_tensor(out, torch.full((2,), float(RANK)), group=sub)
        check(out, torch.tensor([0.0, 0, 2, 2]), "new_group all_gather")
        t = torch.full((3,), float(RANK))
        dist.broadcast(t, src=2, group=sub)  # global rank 2 = group rank 1
        check(t, torch.full((3,), 2.0), "new_group broadcast")
        checks += 3
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("rep", "shard"))
    for dim in ("rep", "shard"):
        g = mesh.get_group(dim)
        ranks = dist.get_process_group_ranks(g)
        t = torch.full((5,), float(RANK))
        dist.all_reduce(t, group=g, op=dist.ReduceOp.MAX)
        check(t, torch.full((5,), float(max(ranks))), f"mesh {dim} all_reduce MAX")
        o = torch.empty(3)
        dist.reduce_scatter_tensor(o, torch.arange(6, dtype=torch.float32) + RANK, group=g,
                                   op=dist.ReduceOp.AVG)
        me = g.rank()
        want = torch.stack([torch.arange(6, dtype=torch.float32) + r for r in ranks]).mean(0)
        check(o, want.view(2, 3)[me], f"mesh {dim} reduce_scatter AVG")
        checks += 2
    # DTensor redistribution uses the functional collectives on these groups.
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    full = torch.arange(16, dtype=torch.float32).view(4, 4)
    dt = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    back = dt.redistribute(mesh, [Replicate(), Replicate()]).to_local()
    check(back, full, "DTensor Shard->Replicate")
    checks += 1
    split = None
    if hasattr(dist.ProcessGroup, "split_group"):
        # ProcessGroup.split_group -> Backend::split (torch >= 2.8).
        wpg = dist.group.WORLD
        mine = [0, 1] if RANK < 2 else [2, 3]
        try:
            spg = wpg.split_group(mine, timeout=TIMEOUT, group_name=f"split{mine[0]}")
        except Exception as e:  # noqa: BLE001 -- report which torch refused it
            split = f"refused: {e}"
        else:
            # torch calls split once per device type: both must share one communicator.
            cpu_b, cuda_b = (spg._get_backend(torch.device(d)) for d in ("cpu", "cuda"))
            assert cpu_b is cuda_b, (cpu_b, cuda_b)
            t = torch.full((2,), float(RANK))
            spg.allreduce([t]).wait()
            check(t, torch.full((2,), float(sum(mine))), "split_group allreduce")
            split = "ok"
            checks += 1
    dist.barrier()
    dist.destroy_process_group()
    return {"checks": checks, "split": split}


def scenario_backend_strings() -> dict:
    """The smddp alias and mixed backend strings, each on its own store."""
    seen = {}
    specs = ["smddp", "cpu:gloo,cuda:hicoll"]
    if torch.cuda.is_available():  # ProcessGroupNCCL refuses to exist without a GPU
        specs.append("cpu:hicoll,cuda:nccl")
    for i, spec in enumerate(specs):
        init(spec, offset=i + 1)
        pg = dist.group.WORLD
        cpu = pg._get_backend(torch.device("cpu"))
        cuda = pg._get_backend(torch.device("cuda"))
        seen[spec] = [cpu.name(), cuda.name()]
        t = torch.full((4,), float(RANK + 1))
        dist.all_reduce(t)
        check(t, torch.full((4,), float(sum(range(1, WORLD + 1)))), f"{spec} all_reduce")
        out = torch.empty(2 * WORLD)
        dist.all_gather_into_tensor(out, torch.full((2,), float(RANK)))
        check(out, torch.arange(WORLD, dtype=torch.float32).repeat_interleave(2), f"{spec} ag")
        if spec == "cpu:gloo,cuda:hicoll":
            assert cpu.name() == "gloo" and isinstance(cuda, ht.ProcessGroupHicoll)
        else:
            assert isinstance(cpu, ht.ProcessGroupHicoll)
            assert ht.hicoll_counts()["allreduce"] == 1
        if torch.cuda.is_available() and spec == "cpu:gloo,cuda:hicoll":
            # CUDA tensors on the hicoll backend: hicoll with a CUDA build of the plugin, else
            # NCCL (announced, counted).
            torch.cuda.set_device(RANK % torch.cuda.device_count())
            g = torch.full((4,), float(RANK + 1), device="cuda")
            dist.all_reduce(g)
            check(g.cpu(), torch.full((4,), float(sum(range(1, WORLD + 1)))), "cuda all_reduce")
            if ht.cuda_build():
                assert not ht.fallback_counts(device="cuda"), ht.fallback_reasons(device="cuda")
                assert ht.hicoll_counts(device="cuda")["allreduce"] == 1
            else:
                assert ht.fallback_counts(device="cuda")["allreduce"] == 1
        dist.barrier()
        dist.destroy_process_group()
    return {"backends": seen}


def scenario_cuda(sizes=(1, 5, 4099), big: int = 1 << 20) -> dict:
    """CUDA tensors on backend "hicoll" (every rank on cuda:0): hicoll runs them on the
    caller's current stream -- the plugin's NCCL fallback must not be used."""
    assert ht.cuda_build(), "the hicoll plugin was built without CUDA"
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    init()
    ngroup = dist.get_world_size()
    checks = 0
    case = 0

    def gpu(t):
        return t.to(dev)

    def cpu_check(got, want, what):
        check(got.cpu(), want, what)

    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.uint8):
        for n in sizes:
            case += 1
            inputs = [make_input(r, n, dtype, case) for r in range(ngroup)]
            want = torch.cat(inputs)
            out = torch.empty(ngroup * n, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, gpu(inputs[RANK]))
            cpu_check(out, want, f"cuda all_gather_into_tensor {dtype} n={n}")
            buf = torch.zeros(ngroup * n, dtype=dtype, device=dev)
            buf[RANK * n:(RANK + 1) * n] = gpu(inputs[RANK])
            dist.all_gather_into_tensor(buf, buf[RANK * n:(RANK + 1) * n])
            cpu_check(buf, want, f"cuda in-place all_gather_into_tensor {dtype} n={n}")
            nc_view = torch.zeros(ngroup * n, 2, dtype=dtype, device=dev)[:, 0]
            dist.all_gather_into_tensor(nc_view, gpu(inputs[RANK]))
            cpu_check(nc_view, want, f"cuda non-contiguous all_gather_into_tensor {dtype} n={n}")
            outs = [torch.empty(n, dtype=dtype, device=dev) for _ in range(ngroup)]
            dist.all_gather(outs, gpu(inputs[RANK]))
            cpu_check(torch.cat(outs), want, f"cuda all_gather {dtype} n={n}")
            for root in range(ngroup):
                t = gpu(inputs[RANK])
                dist.broadcast(t, src=root)
                cpu_check(t, inputs[root], f"cuda broadcast root={root} {dtype} n={n}")
            checks += 4 + ngroup
            for op in OPS:
                if not supports(op, dtype):
                    continue
                case += 1
                ins = [make_input(r, ngroup * n, dtype, case, op) for r in range(ngroup)]
                want = reference(ins, op, dtype).view(ngroup, n)[RANK]
                out = torch.empty(n, dtype=dtype, device=dev)
                dist.reduce_scatter_tensor(out, gpu(ins[RANK]), op=redop(op))
                cpu_check(out, want, f"cuda reduce_scatter_tensor {op} {dtype} n={n}")
                buf = gpu(ins[RANK])
                dist.reduce_scatter_tensor(buf[RANK * n:(RANK + 1) * n], buf, op=redop(op))
                cpu_check(buf[RANK * n:(RANK + 1) * n], want,
                          f"cuda in-place reduce_scatter_tensor {op} {dtype} n={n}")
                out = torch.empty(n, dtype=dtype, device=dev)
                dist.reduce_scatter(out, list(gpu(ins[RANK]).view(ngroup, n).unbind(0)),
                                    op=redop(op))
                cpu_check(out, want, f"cuda reduce_scatter {op} {dtype} n={n}")
                ar_ins = [make_input(r, n, dtype, case + 7, op) for r in range(ngroup)]
                want_ar = reference(ar_ins, op, dtype)
                t = gpu(ar_ins[RANK])
                dist.all_reduce(t, op=redop(op))
                cpu_check(t, want_ar, f"cuda all_reduce {op} {dtype} n={n}")
                base = torch.zeros(n, 3, dtype=dtype, device=dev)
                base[:, 1] = gpu(ar_ins[RANK])
                dist.all_reduce(base[:, 1], op=redop(op))
                cpu_check(base[:, 1], want_ar, f"cuda strided all_reduce {op} {dtype} n={n}")
                cpu_check(base[:, 0], torch.zeros(n, dtype=dtype), "cuda all_reduce wrote outside")
                checks += 5
    # Coalesced forms.
    ag_in = [torch.full((k,), float(RANK + k), device=dev) for k in (1, 4)]
    ag_out = [torch.empty(ngroup * k, device=dev) for k in (1, 4)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(ag_out, ag_in):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    for o, k in zip(ag_out, (1, 4)):
        cpu_check(o, torch.cat([torch.full((k,), float(r + k)) for r in range(ngroup)]),
                  f"cuda allgather_into_tensor_coalesced k={k}")
    rs_in = [torch.arange(ngroup * k, dtype=torch.float32, device=dev) + RANK for k in (2, 3)]
    rs_out = [torch.empty(k, device=dev) for k in (2, 3)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(rs_out, rs_in):
            dist.reduce_scatter_tensor(o, i)
    cm.wait()
    for o, k in zip(rs_out, (2, 3)):
        want = sum(torch.arange(ngroup * k, dtype=torch.float32) + r for r in range(ngroup))
        cpu_check(o, want.view(ngroup, k)[RANK], f"cuda reduce_scatter_tensor_coalesced k={k}")
    checks += 4
    # Stream order: the collective starts after slow work already on the stream, and work
    # issued after it (same stream, no synchronization) sees its result.
    big = big // ngroup * ngroup
    x = make_input(RANK, big, torch.float32, 4242)
    xg = torch.zeros(big, device=dev)
    torch.cuda._sleep(50_000_000)
    xg.copy_(x)
    out = torch.empty(ngroup * big, device=dev)
    dist.all_gather_into_tensor(out, xg)
    got = out * 1
    cpu_check(got, torch.cat([make_input(r, big, torch.float32, 4242) for r in range(ngroup)]),
              "cuda large all_gather_into_tensor (stream order)")
    rs = torch.empty(big // ngroup, device=dev)
    torch.cuda._sleep(50_000_000)
    dist.reduce_scatter_tensor(rs, xg * 1)
    want = reference([make_input(r, big, torch.float32, 4242) for r in range(ngroup)], "SUM",
                     torch.float32).view(ngroup, -1)[RANK]
    cpu_check(rs + 0, want, "cuda large reduce_scatter_tensor (stream order)")
    checks += 2
    # Async work on a side stream: wait() makes the current stream wait; the future too.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        t = torch.full((1 << 16,), float(RANK + 1), device=dev)
        torch.cuda._sleep(50_000_000)
        w = dist.all_reduce(t, async_op=True)
    w.wait()
    cpu_check(t * 1, torch.full((1 << 16,), float(sum(range(1, ngroup + 1)))), "cuda async wait")
    torch.cuda.synchronize()
    assert w.is_completed(), "is_completed() is false after synchronize"
    t = torch.full((8,), float(RANK + 1), device=dev)
    fut = dist.all_reduce(t, async_op=True).get_future()
    res = fut.wait()
    assert isinstance(res, list) and res[0].is_cuda, res
    cpu_check(res[0], torch.full((8,), float(sum(range(1, ngroup + 1)))), "cuda future")
    works, ts = [], []
    for i in range(10):
        ts.append(torch.full((16,), float(i + RANK), device=dev))
        works.append(dist.all_reduce(ts[-1], async_op=True))
    for w in works:
        w.wait()
    for i, t in enumerate(ts):
        cpu_check(t, torch.full((16,), float(ngroup * i + sum(range(ngroup)))), f"cuda async #{i}")
    checks += 13
    # Host and device calls on one group, interleaved: issue order is kept.
    h = torch.full((4,), float(RANK))
    wh = dist.all_reduce(h, async_op=True)
    g = torch.full((4,), float(RANK), device=dev)
    dist.all_reduce(g)
    wh.wait()
    check(h, torch.full((4,), float(sum(range(ngroup)))), "host all_reduce between device calls")
    cpu_check(g, torch.full((4,), float(sum(range(ngroup)))), "device all_reduce after host")
    checks += 2
    torch.cuda.synchronize()
    dist.barrier()
    fb = ht.fallback_counts(device="cuda")
    counts = ht.hicoll_counts(device="cuda")
    assert not fb, f"CUDA calls went to the NCCL fallback: {ht.fallback_reasons(device='cuda')}"
    for op in ("_allgather_base", "_reduce_scatter_base", "allreduce", "broadcast", "allgather",
               "reduce_scatter", "allgather_into_tensor_coalesced",
               "reduce_scatter_tensor_coalesced"):
        assert counts.get(op, 0) > 0, (op, counts)
    st = ht.stats(device="cuda")
    dist.destroy_process_group()
    return {"checks": checks, "hicoll_counts": counts, "fallback_counts": fb, "stats": st}


def scenario_timeout_names_missing() -> dict:
    """A collective one rank never calls, with the group's timeout short and HICOLL_TIMEOUT_MS
    unset: the call fails on the ranks that wait within the timeout (plus a grace), naming the
    missing rank, not only "timed out"."""
    dist.init_process_group("hicoll", store=store(), rank=RANK, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=3))
    dist.barrier()
    missing = WORLD - 1
    t0, err = time.time(), ""
    if RANK == missing:
        time.sleep(8)
    else:
        try:
            dist.all_reduce(torch.ones(4))
        except Exception as e:  # noqa: BLE001 -- checked by the test
            err = str(e)
    return {"error": err, "elapsed": time.time() - t0, "missing": missing}


SCENARIOS = {k[len("scenario_"):]: v for k, v in globals().items() if k.startswith("scenario_")}


def main() -> None:
    name, args = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if name == "fsdp":
        from fsdp_parity import run as fn
    elif ":" in name:  # MODULE:FUNCTION of a scenario file beside this one
        import importlib
        mod, func = name.split(":", 1)
        fn = getattr(importlib.import_module(mod), func)
    else:
        fn = SCENARIOS[name]
    try:
        result = fn(**args)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)  # do not hang in atexit handlers of a broken group
    print("RESULT " + json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main()

